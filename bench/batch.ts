/**
 * Batched generation on a real-width slice with the released router width (896 experts,
 * top-16): how throughput and bytes read per token change with the number of sequences
 * sharing each pass, at the floor budget and at a middle one, and the floor prefill of a
 * 48-token prompt with 1-token passes (what the engine did before batching: the chunk was
 * shrunk to the 17 expert slots) beside 16-token passes with experts in waves.
 *
 * The slice (3 layers: dense+KDA, MoE+KDA, MoE+MLA, vocab 32768, ~36 GB) is written by
 * bench/slice.ts into a cache folder outside the repo and reused; `--clean` deletes it
 * afterwards. A table on stdout; with `--json`, one JSON object as the last line.
 *
 *   deno run -A bench/batch.ts [--model DIR] [--batches 1,2,4,8,16] [--gen 6] [--json] [--clean]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { BENCH_CACHE, ensureSlice, ROUTER_SLICE } from "./slice.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const { values } = benchArgs(
  "usage: deno run -A bench/batch.ts [--model DIR] [--batches 1,2,4,8,16] [--gen 6] [--prompt-len 4] [--skip-prefill] [--floor-only] [--json] [--clean]",
  {
    model: { type: "string" },
    batches: { type: "string" },
    gen: { type: "string" },
    "prompt-len": { type: "string" },
    json: { type: "boolean" },
    clean: { type: "boolean" },
    "skip-prefill": { type: "boolean" },
    "floor-only": { type: "boolean" },
  },
);
const BATCHES = (values.batches ?? "1,2,4,8,16").split(",").map(Number);
const GEN = Number(values.gen ?? 6);
const PROMPT_LEN = Number(values["prompt-len"] ?? 4);
const log = (s: string) => console.error(`batch-bench: ${s}`);

async function sh(args: string[], env: Record<string, string>) {
  const o = await new Deno.Command(Deno.execPath(), { args, cwd: ROOT, env, stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  return { code: o.code, out: dec.decode(o.stdout), err: dec.decode(o.stderr) };
}

const tmp = await Deno.makeTempDir({ prefix: "k3-batch-bench-" });
const make = await new Deno.Command("make", { args: ["-s", "-C", `${ROOT}/kernels`] }).output();
if (make.code !== 0) throw new Error("make -C kernels failed");
// A private copy of the library: other work may rebuild kernels/build meanwhile.
Deno.copyFileSync(`${ROOT}/kernels/build/libk3.so`, `${tmp}/libk3.so`);
const env = { K3_LIB: `${tmp}/libk3.so` };
const k3 = (args: string[]) => sh(["run", "-A", `${ROOT}/main.ts`, ...args], env);

const model = values.model ?? await ensureSlice(ROUTER_SLICE, undefined, log);
const trunk = `${model}-trunk`;
log(`packing the trunk into ${trunk}`);
const packed = await k3(["pack", model, trunk, "--force"]);
if (packed.code !== 0) throw new Error(`pack failed: ${packed.err}`);
const cfg = JSON.parse(await Deno.readTextFile(`${model}/config.json`)).text_config;
const vocab: number = cfg.vocab_size;

/** B prompts of PROMPT_LEN distinct pseudo-random ids. */
function promptsFile(B: number, seed: number): string {
  let s = seed;
  const next = () => (s = (s * 1103515245 + 12345) % 2147483648) % (vocab - 256);
  return Array.from(
    { length: B },
    (_, i) => JSON.stringify({ id: i, ids: Array.from({ length: PROMPT_LEN }, next), gen: GEN }),
  ).join("\n") + "\n";
}

interface Row {
  budget: string;
  B: number;
  tokensPerS: number;
  trunkPerToken: number;
  expertPerToken: number;
  wall: number;
  peakRss: number;
}

const BUDGETS: [string, string[]][] = [
  ["floor (trunk 2.5 GB, cache 0.31 GB)", ["--trunk", trunk, "--trunk-gb", "2.5", "--cache-gb", "0.31"]],
  ["middle (trunk pinned 5 GB, cache 2 GB)", ["--trunk", trunk, "--trunk-gb", "5", "--cache-gb", "2"]],
];
const rows: Row[] = [];
for (const [budget, flags] of values["floor-only"] ? BUDGETS.slice(0, 1) : BUDGETS) {
  for (const B of BATCHES) {
    const input = `${tmp}/in-${B}.jsonl`, output = `${tmp}/out-${B}.jsonl`, report = `${tmp}/report-${B}.json`;
    await Deno.writeTextFile(input, promptsFile(B, 17 + B));
    await Deno.remove(output).catch(() => {});
    log(`${budget}: B = ${B}`);
    const r = await k3([
      "batch",
      model,
      "--input",
      input,
      "--output",
      output,
      "--parallel",
      String(B),
      "--report",
      report,
      ...flags,
    ]);
    if (r.code !== 0) throw new Error(`batch B=${B} failed (${r.code}): ${r.err.slice(-2000)}`);
    const rep = JSON.parse(await Deno.readTextFile(report));
    rows.push({
      budget,
      B,
      tokensPerS: rep.tokens_per_second,
      trunkPerToken: rep.trunk_bytes_read / rep.generated_tokens,
      expertPerToken: rep.expert_bytes_read / rep.generated_tokens,
      wall: rep.wall_seconds,
      peakRss: rep.peak_rss_bytes,
    });
  }
}

interface Prefill {
  chunk: number;
  seconds: number;
  trunkBytes: number;
}
const prefills: Prefill[] = [];
if (!values["skip-prefill"]) {
  const ids = Array.from({ length: 48 }, (_, i) => (i * 7919) % (vocab - 256)).join(",");
  for (const chunk of [1, 16]) {
    log(`floor prefill, 48 tokens, ${chunk}-token passes`);
    const out = `${tmp}/prefill-${chunk}.json`;
    const r = await k3([
      "run",
      model,
      "--ids",
      ids,
      "--gen",
      "1",
      "--chunk",
      String(chunk),
      "--out",
      out,
      ...BUDGETS[0][1],
    ]);
    if (r.code !== 0) throw new Error(`prefill chunk ${chunk} failed: ${r.err.slice(-2000)}`);
    const rep = JSON.parse(await Deno.readTextFile(out));
    prefills.push({ chunk, seconds: rep.wall_seconds, trunkBytes: rep.trunk_bytes_read });
  }
}

const GB = 1e9;
const distinct = (B: number) => ROUTER_SLICE.experts * (1 - (1 - ROUTER_SLICE.topK / ROUTER_SLICE.experts) ** B);
console.log(
  `\nBatched generation: ${model} (${cfg.num_hidden_layers} layers, ${cfg.num_experts} experts top-${cfg.num_experts_per_token}), prompts of ${PROMPT_LEN} ids, ${GEN} tokens each\n`,
);
console.log(
  "| budget | B | tok/s | ratio to B=1 | trunk GB/token | expert GB/token | distinct experts/layer (expected) | wall s | peak RSS GB |",
);
console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
const ratio = (budget: string, B: number) => {
  const one = rows.find((r) => r.budget === budget && r.B === 1);
  const r = rows.find((r) => r.budget === budget && r.B === B);
  return one && r ? r.tokensPerS / one.tokensPerS : NaN;
};
for (const r of rows) {
  console.log(
    `| ${r.budget} | ${r.B} | ${r.tokensPerS.toFixed(3)} | ${ratio(r.budget, r.B).toFixed(2)} | ${
      (r.trunkPerToken / GB).toFixed(2)
    } | ${(r.expertPerToken / GB).toFixed(2)} | ${distinct(r.B).toFixed(0)} | ${r.wall.toFixed(1)} | ${
      (r.peakRss / GB).toFixed(2)
    } |`,
  );
}
if (prefills.length === 2) {
  const [before, after] = prefills;
  console.log(`\nFloor prefill of a 48-token prompt (+1 token):`);
  console.log("| passes of | seconds | trunk GB read |");
  console.log("|---:|---:|---:|");
  for (const p of prefills) {
    console.log(`| ${p.chunk} token(s) | ${p.seconds.toFixed(1)} | ${(p.trunkBytes / GB).toFixed(2)} |`);
  }
  console.log(
    `speed-up ${(before.seconds / after.seconds).toFixed(2)}x, trunk bytes ${
      (before.trunkBytes / after.trunkBytes).toFixed(1)
    }x fewer`,
  );
}
await Deno.remove(tmp, { recursive: true });
if (values.clean) {
  await Deno.remove(model, { recursive: true }).catch(() => {});
  await Deno.remove(trunk, { recursive: true }).catch(() => {});
  log(`removed ${model} and ${trunk}`);
}
if (values.json) {
  const floor = BUDGETS[0][0];
  console.log(JSON.stringify({
    model,
    cache: BENCH_CACHE,
    experts_per_layer: cfg.num_experts,
    top_k: cfg.num_experts_per_token,
    gen: GEN,
    prompt_len: PROMPT_LEN,
    rows: rows.map((r) => ({
      budget: r.budget,
      batch: r.B,
      tokens_per_s: r.tokensPerS,
      ratio_to_1: ratio(r.budget, r.B),
      trunk_bytes_per_token: r.trunkPerToken,
      expert_bytes_per_token: r.expertPerToken,
      wall_seconds: r.wall,
      peak_rss_bytes: r.peakRss,
    })),
    floor_tokens_per_s_ratio_8_to_1: ratio(floor, 8),
    floor_prefill_48: prefills.length === 2
      ? {
        chunk1_seconds: prefills[0].seconds,
        chunk16_seconds: prefills[1].seconds,
        speedup: prefills[0].seconds / prefills[1].seconds,
        chunk1_trunk_bytes: prefills[0].trunkBytes,
        chunk16_trunk_bytes: prefills[1].trunkBytes,
      }
      : null,
  }));
}
