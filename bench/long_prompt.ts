/**
 * How long prompts take on a model: `k3 run --ids <N ids> --gen 1 --ledger` for each
 * length, one after another, printing the wall clock, prefill tokens/s, the share of the
 * prompt's time in MLA attention (attention over the cache: the only work that grows with
 * the square of the length), KDA's, and the rest per 1,000 tokens (linear work: flat down
 * the table when nothing else is quadratic). The prompt limit is the model's window and
 * what the memory plan holds (docs/prefill.md); this shows what a long prompt costs within
 * it.
 *
 *   deno run -A bench/long_prompt.ts [--model DIR] [--lengths 1024,4096,16384] [--json] [-- k3 flags...]
 *
 * @module
 */

import { benchArgs } from "./args.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const DEFAULT_LENGTHS = "1024,4096,16384";
const USAGE = `usage: deno run -A bench/long_prompt.ts [--model DIR] [--lengths ${DEFAULT_LENGTHS}] [--json] ` +
  "[-- k3 flags...]";
const { values, positionals } = benchArgs(USAGE, {
  model: { type: "string", default: `${ROOT}tests/fixtures/tiny` },
  lengths: { type: "string", default: DEFAULT_LENGTHS },
  json: { type: "boolean" },
}, true);
const lengths = values.lengths!.split(",").map(Number);
if (lengths.some((n) => !Number.isInteger(n) || n < 1)) {
  console.error(`--lengths: expected positive integers, got ${JSON.stringify(values.lengths)}\n${USAGE}`);
  Deno.exit(2);
}

/** One prompt length's run. */
interface Row {
  ids: number;
  wallSeconds: number;
  promptSeconds: number;
  tokensPerSecond: number;
  attentionSeconds: number;
  mlaSeconds: number;
  restSecondsPer1k: number;
}

const rows: Row[] = [];
for (const n of lengths) {
  // Ids spread over the vocabulary below 700 (any model has them), not one repeated id.
  const ids = Array.from({ length: n }, (_, i) => ((i * 7) % 700) + 1).join(",");
  const t0 = performance.now();
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${ROOT}main.ts`, "run", values.model!, "--ids", ids, "--gen", "1", "--ledger", ...positionals],
    stdout: "null",
    stderr: "piped",
  }).output();
  const wall = (performance.now() - t0) / 1000;
  const err = new TextDecoder().decode(out.stderr);
  if (out.code !== 0) {
    console.error(`k3 run with ${n} ids failed (exit ${out.code}):\n${err}`);
    Deno.exit(1);
  }
  const prompt = Number(/prompt eval \d+ tokens in ([\d.]+) s/.exec(err)?.[1]);
  const attention = Number(/attention \(KDA, MLA\)\s+([\d.]+) s/.exec(err)?.[1]);
  const mla = Number(/attention by kind: KDA [\d.]+ s, MLA ([\d.]+) s/.exec(err)?.[1]);
  const ledgerWall = Number(/ledger \(wall ([\d.]+) s\)/.exec(err)?.[1]);
  rows.push({
    ids: n,
    wallSeconds: wall,
    promptSeconds: prompt,
    tokensPerSecond: n / prompt,
    attentionSeconds: attention,
    mlaSeconds: mla,
    restSecondsPer1k: ((ledgerWall - attention) / n) * 1000,
  });
  console.error(`${n} ids: ${wall.toFixed(1)} s`);
}

console.log(`\nk3 run --ids <N> --gen 1 on ${values.model} (wall = the whole command, load included)`);
console.log(
  "| prompt ids | wall s | prompt eval s | tokens/s | MLA attention s (share) | KDA s (share) | rest s per 1k tokens |",
);
console.log(
  "| ---------: | -----: | ------------: | -------: | ----------------------: | ------------: | -------------------: |",
);
const share = (s: number, of: number) => `${s.toFixed(1)} (${((s / of) * 100).toFixed(0)}%)`;
for (const r of rows) {
  console.log(
    `| ${r.ids} | ${r.wallSeconds.toFixed(1)} | ${r.promptSeconds.toFixed(1)} | ${r.tokensPerSecond.toFixed(0)} | ${
      share(r.mlaSeconds, r.promptSeconds)
    } | ${share(r.attentionSeconds - r.mlaSeconds, r.promptSeconds)} | ${r.restSecondsPer1k.toFixed(3)} |`,
  );
}
if (values.json) console.log(JSON.stringify({ model: values.model, rows }));
