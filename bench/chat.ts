/**
 * What keeping the state between chat turns saves: the same scripted conversation through
 * `k3 chat` twice, side by side, once keeping the state (each turn prefills only itself)
 * and once with `--reprefill` (each turn prefills the whole conversation again), greedy,
 * so both see the same tokens. Prints per-turn prefill seconds and the ratio.
 *
 *   deno run -A bench/chat.ts [--model DIR] [--turns 4] [--gen 8] [--json] [-- k3 flags...]
 *
 * e.g. a real-width slice (bench/slice.ts) with the tiny tokenizer:
 *   deno run -A bench/chat.ts --model /var/tmp/k3-bench/slice-3l-896e -- --tok tests/fixtures/tiny \
 *     --trunk /var/tmp/k3-bench/slice-3l-896e-trunk --trunk-gb 3 --cache-gb 1
 *
 * @module
 */

import { benchArgs, median } from "./args.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const { values, positionals } = benchArgs(
  "usage: deno run -A bench/chat.ts [--model DIR] [--turns 4] [--gen 8] [--json] [-- k3 flags...]",
  {
    model: { type: "string", default: `${ROOT}tests/fixtures/tiny` },
    turns: { type: "string", default: "4" },
    gen: { type: "string", default: "8" },
    json: { type: "boolean" },
  },
  true,
);
const turns = Number(values.turns);
const lines = Array.from({ length: turns }, (_, i) => `Question ${i + 1}: what comes after ${i + 1}?`);

interface Turn {
  prefilled_tokens: number;
  prompt_ids: number[];
  prefill_seconds: number;
  decode_seconds: number;
}

async function session(extra: string[]): Promise<Turn[]> {
  const out = await Deno.makeTempFile({ suffix: ".json" });
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      `${ROOT}main.ts`,
      "chat",
      values.model!,
      "--temperature",
      "0",
      "--gen",
      values.gen!,
      "--out",
      out,
      ...positionals,
      ...extra,
    ],
    stdin: "piped",
    stdout: "null",
    stderr: "inherit",
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(lines.join("\n") + "\n"));
  await w.close();
  const { code } = await child.status;
  if (code !== 0) throw new Error(`k3 chat exited ${code}`);
  const turns = JSON.parse(await Deno.readTextFile(out)).turns as Turn[];
  await Deno.remove(out);
  return turns;
}

const kept = await session([]);
const again = await session(["--reprefill"]);
console.log("turn  kept: tokens  prefill s   reprefill: tokens  prefill s   ratio");
const ratios: number[] = [];
for (let i = 0; i < turns; i++) {
  const r = again[i].prefill_seconds / kept[i].prefill_seconds;
  if (i > 0) ratios.push(r);
  console.log(
    `${String(i + 1).padStart(4)}  ${String(kept[i].prefilled_tokens).padStart(12)}  ${
      kept[i].prefill_seconds.toFixed(3).padStart(9)
    }   ${String(again[i].prefilled_tokens).padStart(17)}  ${again[i].prefill_seconds.toFixed(3).padStart(9)}   ${
      r.toFixed(2).padStart(5)
    }`,
  );
}
const summary = {
  model: values.model,
  turns,
  second_turn_speedup: again[1].prefill_seconds / kept[1].prefill_seconds,
  median_later_turn_speedup: median(ratios),
  kept_prefill_seconds: kept.map((t) => t.prefill_seconds),
  reprefill_prefill_seconds: again.map((t) => t.prefill_seconds),
  kept_prefilled_tokens: kept.map((t) => t.prefilled_tokens),
  reprefill_prefilled_tokens: again.map((t) => t.prefilled_tokens),
};
console.log(
  `second turn: ${
    summary.second_turn_speedup.toFixed(2)
  }x faster prefill with the state kept; median over turns 2..${turns}: ${
    summary.median_later_turn_speedup.toFixed(2)
  }x`,
);
if (values.json) console.log(JSON.stringify(summary));
