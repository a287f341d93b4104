/**
 * `k3 presets` (and `k3 --list-presets`): the memory presets, and what the plan gives the
 * full 93-layer Kimi K3 at each (packed trunk, BF16 trunk, MXFP4 experts).
 *
 * @module
 */

import { usageError } from "../engine/errors.ts";
import { estimatedInput, makePlan, type MemoryPlan } from "../engine/weights/plan.ts";
import { PRESETS } from "../engine/model/presets.ts";
import { releasedK3 } from "../engine/model/shapes.ts";
import { bytesText } from "../engine/native/available.ts";
import { availableMemory } from "./environment.ts";
import { type CommandFlags, commandFlags } from "./flags.ts";
import { reportHead, snakeKeys } from "./report.ts";

/** `k3 presets`' flags and help. */
export const PRESETS_FLAGS: CommandFlags = commandFlags({
  name: "presets",
  head: `usage: k3 presets [--positions N] [--json]

Lists the memory presets (--preset NAME of k3 run) and what the memory plan gives the
full 93-layer Kimi K3 at each with a packed trunk (--trunk): trunk layers pinned, the
read-ahead ring, expert-cache slots and the KV cache per position.`,
  groups: [{
    name: "presets",
    title: "",
    column: 18,
    flags: {
      positions: { type: "string", value: "N", help: "positions the plan holds (default 4096)" },
      json: { type: "boolean", help: "the plans as JSON" },
    },
  }],
  tail: `examples:
  k3 presets
  k3 presets --positions 32768 --json`,
});

/** The plan of the released model at a preset (auto: from this machine's MemAvailable). */
export function releasedPlan(preset: string, positions: number): MemoryPlan | string {
  const p = PRESETS.find((x) => x.name === preset)!;
  const mem = p.name === "auto" ? { preset: "auto", streamEmbed: false, trunkDir: "(packed)" } : {
    preset: p.name,
    trunkGB: p.trunkGB,
    cacheGB: p.cacheGB,
    streamEmbed: p.streamEmbed,
    trunkDir: "(packed)",
  };
  try {
    return makePlan({
      ...estimatedInput(releasedK3(), mem, positions),
      drafts: true, // `k3 run` drafts by default: the plan holds a speculation record
      available: p.name === "auto" ? availableMemory()?.bytes : undefined,
    });
  } catch (e) {
    return (e as Error).message;
  }
}

/** Runs `k3 presets`; returns the exit code. */
// deno-lint-ignore require-await -- every subcommand returns a Promise for the dispatcher
export async function main(args: string[]): Promise<number> {
  const { values, positionals } = PRESETS_FLAGS.parse(args);
  if (values.help) {
    console.log(PRESETS_FLAGS.usage());
    return 0;
  }
  if (positionals.length) {
    throw usageError(`presets: unexpected argument ${JSON.stringify(positionals[0])}`);
  }
  const positions = values.positions === undefined ? 4096 : Number(values.positions);
  if (!Number.isInteger(positions) || positions < 1 || positions > 1 << 20) {
    throw usageError(
      `--positions: expected an integer in 1..1048576, got ${JSON.stringify(values.positions)}`,
    );
  }
  const plans = PRESETS.map((p) => ({ preset: p, plan: releasedPlan(p.name, positions) }));
  if (values.json) {
    const presets = plans.map(({ preset, plan }) => ({
      ...preset,
      needs_bytes: typeof plan === "string" ? null : plan.totalBytes + plan.overheadBytes,
      plan: typeof plan === "string" ? null : plan,
      refused: typeof plan === "string" ? plan : null,
    }));
    console.log(JSON.stringify({ ...reportHead("presets"), positions, presets: snakeKeys(presets) }, null, 2));
    return 0;
  }
  const lines = [
    "memory presets (GB = 1e9 bytes; --preset NAME, later flags override earlier ones):",
    "",
  ];
  lines.push(
    `  ${"name".padEnd(12)}${"trunk GB".padStart(9)}${"cache GB".padStart(9)}  ` +
      `memory it needs (full K3, ${positions} positions, runtime included): what it does`,
  );
  for (const { preset: p, plan } of plans) {
    const t = Number.isNaN(p.trunkGB) ? "auto" : String(p.trunkGB);
    const c = Number.isNaN(p.cacheGB) ? "auto" : String(p.cacheGB);
    // What a machine must have free, the runtime included: the label promises no more.
    const needs = p.name === "auto"
      ? "what is available"
      : typeof plan === "string"
      ? "refused"
      : `${bytesText(plan.totalBytes + plan.overheadBytes)} free`;
    lines.push(`  ${p.name.padEnd(12)}${t.padStart(9)}${c.padStart(9)}  ${needs}: ${p.about}`);
  }
  lines.push(
    "",
    `the full 93-layer Kimi K3 with a packed trunk, ${positions} positions, per the plan:`,
    "",
  );
  const head = [
    "name".padEnd(12),
    "pinned".padStart(7),
    "ring".padStart(10),
    "slots".padStart(7),
    "embed+head".padStart(12),
  ];
  head.push("KV/pos".padStart(9), "w/o KV".padStart(10), `total@${positions}`.padStart(12), "  trunk read/token");
  lines.push("  " + head.join(""));
  for (const { preset, plan } of plans) {
    if (typeof plan === "string") {
      lines.push(`  ${preset.name.padEnd(12)}refused: ${plan}`);
      continue;
    }
    const kv = plan.state.kvPerPosition * positions;
    const cells = [
      preset.name.padEnd(12),
      `${plan.trunk.pinned.length}/93`.padStart(7),
      bytesText(plan.trunk.ringBytes).padStart(10),
      String(plan.experts.slots).padStart(7),
      bytesText(plan.embedHead.bytes).padStart(12),
      bytesText(plan.state.kvPerPosition).padStart(9),
      bytesText(plan.totalBytes - kv).padStart(10),
      bytesText(plan.totalBytes).padStart(12),
      "  " + bytesText(plan.trunk.totalBytes - plan.trunk.pinnedBytes),
    ];
    lines.push("  " + cells.join(""));
  }
  lines.push(
    "",
    "  (slots: 17.55 MB routed experts, top-k 16 needs at least 17; KV: the MLA latent cache, fp32;",
    "   totals exclude the ~0.16 GB runtime overhead; auto is sized from this machine's MemAvailable)",
  );
  console.log(lines.join("\n"));
  return 0;
}
