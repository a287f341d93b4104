/**
 * `k3 doctor`'s flags (declared once: the parser and `--help` both come from them) and the
 * options they give.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import { type CommandFlags, commandFlags } from "../flags.ts";
import { intFlag } from "../common.ts";
import { MAX_CONTEXT } from "../../engine/model/config.ts";

/** `k3 doctor`'s flags and help. */
export const DOCTOR_FLAGS: CommandFlags = commandFlags({
  name: "doctor",
  head: `usage: k3 doctor [--dir PATH] [--size-mb N] [--checkpoint MODEL_DIR]

Checks this machine for Kimi K3: CPU features and the kernels' SIMD path, available memory
and the preset that fits, free disk at PATH, and PATH's read speed measured the way the
engine reads (17.5 MB aligned random reads with O_DIRECT at depth 1 and 16, and large
sequential reads) on a temporary file it writes under PATH and removes. Then the command
to run next.

exit codes: 0 the model can run here; 1 it cannot (not enough memory for even the
smallest plan, too little disk, or no loadable kernel library); 2 usage error.`,
  groups: [{
    name: "doctor",
    title: "",
    column: 17,
    flags: {
      dir: {
        type: "string",
        value: "PATH",
        help: "the disk that holds (or will hold) the checkpoint and packed trunk\n(default: the current directory)",
      },
      "size-mb": {
        type: "string",
        value: "N",
        help: "size of the temporary test file in MiB (default 1024, 64..65536);\nlarger is slower and more accurate",
      },
      positions: {
        type: "string",
        value: "N",
        help: "context (prompt + generated) to size the memory plan for (default 4096)",
      },
      "no-read": { type: "boolean", help: "skip the read-speed test (writes nothing)" },
      checkpoint: {
        type: "string",
        value: "D",
        help: "verify a downloaded checkpoint: every shard header valid and each shard's\n" +
          "size exactly what its header describes, every tensor the engine binds\n" +
          "present with its shape and dtype, and, for the released Kimi K3, 96\n" +
          "shards, 497,220 tensors and 1,560,936,091,448 bytes in all",
      },
    },
  }],
  tail: `examples:
  k3 doctor --dir /data
  k3 doctor --no-read --checkpoint /data/kimi-k3`,
});

/** What `k3 doctor`'s flags asked for. */
export interface DoctorOptions {
  /** The disk to check: --dir, else the checkpoint's own directory, else here. */
  dir: string;
  /** The test file's size in MiB. */
  sizeMb: number;
  /** Context to size the memory plan for. */
  positions: number;
  /** --no-read. */
  noRead: boolean;
  /** --checkpoint. */
  checkpoint?: string;
}

/** Parses `k3 doctor`'s arguments (the directory must exist); undefined after `--help`. */
export function doctorOptions(args: string[]): DoctorOptions | undefined {
  const flags = DOCTOR_FLAGS.parseUnlessHelp(args, false);
  if (flags === undefined) return undefined;
  const checkpoint = flags.str("checkpoint"), dirGiven = flags.str("dir");
  // The disk that matters: --dir, else the checkpoint's own directory, else here.
  const dir = dirGiven ?? checkpoint ?? ".";
  const sizeMb = intFlag("size-mb", flags.str("size-mb"), 1024, 64, 65536);
  // Positions up to the longest context any model may have.
  const positions = intFlag("positions", flags.str("positions"), 4096, 1, MAX_CONTEXT);
  if (flags.bool("no-read") && flags.str("size-mb") !== undefined) {
    throw usageError("doctor: --size-mb and --no-read conflict: choose one");
  }
  // Named by the flag it came from (--checkpoint alone measures the checkpoint's disk).
  const dirFlag = dirGiven !== undefined ? "--dir" : checkpoint !== undefined ? "--checkpoint" : "--dir";
  try {
    if (!Deno.statSync(dir).isDirectory) throw usageError(`${dirFlag}: ${dir} is not a directory`);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      throw usageError(
        `${dirFlag}: ${dir} does not exist (${
          dirFlag === "--checkpoint" ? "the directory of the downloaded shards and config.json" : "the disk to check"
        })`,
      );
    }
    throw e;
  }
  return { dir, sizeMb, positions, noRead: flags.bool("no-read"), checkpoint };
}
