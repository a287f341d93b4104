/**
 * `k3 pack <model_dir> <trunk_dir> [--force] [--hash-experts]` and `k3 pack --verify <trunk_dir> [model_dir]`.
 *
 * @module
 */

import { kindWords, statKind } from "../engine/native/files.ts";
import { usageError } from "../engine/errors.ts";
import { packTrunk } from "../pack/pack.ts";
import { verifyTrunk } from "../pack/verify.ts";
import { hashExperts, verifyExperts } from "../pack/experts.ts";
import { type CommandFlags, commandFlags } from "./flags.ts";

/** `k3 pack`'s flags and help. */
export const PACK_FLAGS: CommandFlags = commandFlags({
  name: "pack",
  head: `usage: k3 pack <model_dir> <trunk_dir> [--force] [--hash-experts] [--codec auto|raw|split]
       k3 pack --verify <trunk_dir> [model_dir]

Packs the trunk (every layer's dense tensors, the shared experts, embedding, lm_head and
final vectors) into <trunk_dir>/trunk.bin with one 4096-aligned region per layer and a
checksummed manifest.json, for \`k3 run --trunk <trunk_dir>\`. Memory stays bounded (a
few staging buffers) whatever the layer size. An interrupted pack leaves no usable trunk.`,
  groups: [{
    name: "pack",
    title: "",
    column: 18,
    flags: {
      force: { type: "boolean", help: "replace an existing trunk packed from a different model or source" },
      "hash-experts": {
        type: "boolean",
        help: "also hash every routed expert once into <trunk_dir>/experts.json, so\n" +
          "every expert read is verified; adds the table to an existing trunk\n" +
          "without repacking it",
      },
      codec: {
        type: "string",
        value: "C",
        help: "how the layers' 16 MB pieces are stored: raw; split (each piece whose\n" +
          "bf16 high bytes code smaller is stored as fixed-width dictionary codes\n" +
          "with escapes and its low bytes raw, decoded as it is read); auto (the\n" +
          "default: split only when this machine's measured decode and disk\n" +
          "rates predict a faster disk-bound token, decode time included)",
      },
      verify: {
        type: "boolean",
        help: "re-check every checksum of <trunk_dir> (and, given model_dir, that the\n" +
          "trunk belongs to that model, and every expert against experts.json)",
      },
    },
  }],
  tail: `examples:
  k3 pack /data/kimi-k3 /data/k3-trunk
  k3 pack --verify /data/k3-trunk /data/kimi-k3`,
});

/** Runs `k3 pack` (or `--verify`); returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const { values, positionals } = PACK_FLAGS.parse(args);
  if (values.help) {
    console.log(PACK_FLAGS.usage());
    return 0;
  }
  if (values.verify) {
    if (positionals.length < 1 || positionals.length > 2) {
      throw usageError("pack --verify: expected <trunk_dir> [model_dir] (see k3 pack --help)");
    }
    if (values.force) throw usageError("pack: --force does not apply to --verify");
    if (values["hash-experts"]) throw usageError("pack: --hash-experts does not apply to --verify");
    if (values.codec !== undefined) throw usageError("pack: --codec does not apply to --verify");
    const r = await verifyTrunk(positionals[0], { modelDir: positionals[1] });
    console.error(
      `pack: ${positionals[0]}: all ${r.regions} regions verified (${(r.bytes / 1e9).toFixed(3)} GB in ${
        r.seconds.toFixed(1)
      } s)`,
    );
    const e = await verifyExperts(positionals[0], positionals[1], (s) => console.error(s));
    console.error(
      e === undefined
        ? `pack: ${
          positionals[0]
        }: no expert table (routed experts are not verified per read; add one with k3 pack --hash-experts)`
        : e.checked
        ? `pack: ${positionals[0]}: all ${e.experts} routed experts match the expert table`
        : `pack: ${
          positionals[0]
        }: the expert table is well-formed (${e.experts} experts); give model_dir to check the experts against it`,
    );
    console.log("ok");
    return 0;
  }
  if (positionals.length !== 2) {
    throw usageError("pack: expected <model_dir> <trunk_dir> (see k3 pack --help)");
  }
  // The trunk goes into a directory (new or existing): a file there is a mistake, not
  // something to replace.
  const kind = statKind(positionals[1]); // devices too (the runtime may not stat them)
  if (kind !== "missing" && kind !== "directory") {
    throw usageError(
      `pack: ${positionals[1]} is ${kindWords(kind)}; the trunk needs a directory (a new path, or a trunk directory)`,
    );
  }
  const codec = values.codec ?? "auto";
  if (codec !== "auto" && codec !== "raw" && codec !== "split") {
    throw usageError(`pack: --codec ${JSON.stringify(codec)}: expected auto, raw or split`);
  }
  await packTrunk(positionals[0], positionals[1], { force: values.force === true, codec });
  if (values["hash-experts"]) await hashExperts(positionals[0], positionals[1]);
  return 0;
}
