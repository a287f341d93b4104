/**
 * `k3 serve` under load: aggregate tokens/s and time to first token at 1, 4 and 8
 * concurrent streaming clients, against one server process (a script printing a table,
 * not a test).
 *
 * Every client streams a completion of its own prompt (distinct token ids, greedy,
 * `ignore_eos` so every answer is exactly --tokens long). Time to first token is measured
 * at the client: from sending the request to the first chunk carrying text. Aggregate
 * tokens/s is all clients' completion tokens (from `usage`) over the wall time from the
 * first request to the last `[DONE]`; the ratio column divides it by the one-client rate
 * (what continuous batching buys: the passes read each weight once for all sequences).
 *
 *   deno run -A bench/serve.ts                                 # the tiny model
 *   deno run -A bench/serve.ts --model DIR --tok DIR -- --trunk T --trunk-gb 2.4 --cache-gb 0.3
 *   options: --clients 1,4,8  --tokens N (default 64)  --prompt N (ids per prompt, default 16)
 *            --rounds N (default 3; medians)  --json (one JSON object as the last line)
 *            --unstreamed (whole answers: time to first token is then the whole answer's)
 *   arguments after -- go to k3 serve (memory budget, threads, ...)
 *
 * @module
 */

import { benchArgs, median } from "./args.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const { values, positionals } = benchArgs(
  "usage: deno run -A bench/serve.ts [--model DIR --tok DIR] [--clients 1,4,8] [--tokens N] [--prompt N] [--rounds N] [--unstreamed] [--json] [-- k3 serve flags]",
  {
    model: { type: "string" },
    tok: { type: "string" },
    clients: { type: "string" },
    tokens: { type: "string" },
    prompt: { type: "string" },
    rounds: { type: "string" },
    unstreamed: { type: "boolean" },
    json: { type: "boolean" },
  },
  true,
);
const MODEL = values.model ?? `${ROOT}/tests/fixtures/tiny`;
const CLIENTS = (values.clients ?? "1,4,8").split(",").map(Number);
const TOKENS = Number(values.tokens ?? 64);
const PROMPT = Number(values.prompt ?? 16);
const ROUNDS = Number(values.rounds ?? 3);
const log = (s: string) => console.error(`bench/serve: ${s}`);

const parallel = Math.max(...CLIENTS);
const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    `${ROOT}/main.ts`,
    "serve",
    MODEL,
    "--port",
    "0",
    "--parallel",
    String(parallel),
    "--max-queue",
    "0",
    "--context",
    String(PROMPT + TOKENS + 8),
    ...(values.tok ? ["--tok", values.tok] : []),
    ...positionals,
  ],
  stdout: "null",
  stderr: "piped",
}).spawn();
let stderr = "";
const url = await new Promise<string>((resolve, reject) => {
  (async () => {
    const dec = new TextDecoder();
    for await (const c of child.stderr) {
      stderr += dec.decode(c, { stream: true });
      const m = /k3: ready: (http:\/\/[^/\s]+)\/v1/.exec(stderr);
      if (m) resolve(m[1]);
    }
    reject(new Error(`k3 serve ended before it was ready:\n${stderr}`));
  })();
});
log(`server ready at ${url}`);

/** One streaming completion: seconds to the first text chunk, completion tokens. */
async function one(i: number, round: number): Promise<{ ttft: number; tokens: number }> {
  const prompt = Array.from({ length: PROMPT }, (_, j) => 1 + ((i * 131 + (round + 1) * 17 + j * 7) % 700));
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      prompt,
      max_tokens: TOKENS,
      temperature: 0,
      ignore_eos: true,
      stream: !values.unstreamed,
      ...(values.unstreamed ? {} : { stream_options: { include_usage: true } }),
    }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  if (values.unstreamed) {
    return { ttft: (performance.now() - t0) / 1000, tokens: (await res.json()).usage.completion_tokens };
  }
  let ttft = 0, tokens = 0, buf = "";
  for await (const piece of res.body!.pipeThrough(new TextDecoderStream())) {
    buf += piece;
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, k).replace(/^data: /, "");
      buf = buf.slice(k + 2);
      if (line === "[DONE]") continue;
      const chunk = JSON.parse(line);
      if (!ttft && chunk.choices?.[0]?.text) ttft = (performance.now() - t0) / 1000;
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
  }
  return { ttft, tokens };
}

interface Row {
  clients: number;
  tokens_per_second: number;
  ttft_seconds: number;
  ratio: number;
}
const rows: Row[] = [];
await one(0, -1); // warm-up: first-touch of scratch and caches
for (const c of CLIENTS) {
  const rates: number[] = [], ttfts: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = performance.now();
    const out = await Promise.all(Array.from({ length: c }, (_, i) => one(i, r)));
    const wall = (performance.now() - t0) / 1000;
    rates.push(out.reduce((n, o) => n + o.tokens, 0) / wall);
    ttfts.push(median(out.map((o) => o.ttft)));
  }
  const rate = median(rates);
  rows.push({
    clients: c,
    tokens_per_second: rate,
    ttft_seconds: median(ttfts),
    ratio: rate / (rows[0]?.tokens_per_second ?? rate),
  });
  log(`${c} clients: ${rate.toFixed(2)} tok/s`);
}

child.kill("SIGTERM");
const status = await child.status;
if (status.code !== 0) log(`server exited ${status.code}:\n${stderr}`);

console.log(
  `k3 serve on ${MODEL}: ${TOKENS} tokens per client, prompts of ${PROMPT} ids, ${
    values.unstreamed ? "unstreamed" : "streamed"
  }, median of ${ROUNDS} rounds`,
);
console.log("| clients | aggregate tok/s | time to first token s | vs 1 client |");
console.log("| ------: | --------------: | --------------------: | ----------: |");
for (const r of rows) {
  console.log(
    `| ${r.clients} | ${r.tokens_per_second.toFixed(2)} | ${r.ttft_seconds.toFixed(3)} | ${r.ratio.toFixed(2)} |`,
  );
}
if (values.json) console.log(JSON.stringify({ model: MODEL, tokens: TOKENS, prompt: PROMPT, rounds: ROUNDS, rows }));
