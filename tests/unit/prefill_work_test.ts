/**
 * Prefill work is linear in the prompt except MLA attention over the cache: every kernel
 * call made by the forward pass is counted (calls, and the sum of their integer
 * arguments, which carry every size a kernel works on) for prompts of N, 2N and 3N ids.
 * Linear work has a zero second difference; only k3_mla_attend's positions grow with the
 * square (exactly 1 + 2 + ... + N per MLA layer), and nothing is allocated per chunk.
 * The prompt limit (MAX_PROMPT_IDS, one constant) is enforced at exactly that length.
 */

import assert from "node:assert/strict";
import { openModel } from "../../engine/open.ts";
import { K3Model } from "../../engine/model/model.ts";
import type { Kernels } from "../../engine/native/ffi.ts";
import { MAX_PROMPT_IDS, promptIds } from "../../cli/run_options.ts";
import { parseJob } from "../../cli/batch/jobs.ts";
import { TINY } from "../helpers.ts";

/** Per kernel: calls and the sum of integer arguments. */
type Work = Map<string, { calls: number; ints: number }>;

/** The kernels with every call counted into `work` (when it is set). */
function counting(k: Kernels): { k: Kernels; start(): Work } {
  let work: Work | undefined;
  const proxy = new Proxy(k, {
    get(target, name: string) {
      const f = (target as unknown as Record<string, unknown>)[name];
      if (typeof f !== "function") return f;
      return (...args: unknown[]) => {
        if (work) {
          const w = work.get(name) ?? { calls: 0, ints: 0 };
          w.calls++;
          for (const a of args) if (typeof a === "number" && Number.isInteger(a)) w.ints += a;
          work.set(name, w);
        }
        return (f as (...a: unknown[]) => unknown)(...args);
      };
    },
  });
  return { k: proxy, start: () => (work = new Map()) };
}

Deno.test("prefill: every kernel's work is linear in the prompt but MLA attention's (exactly 1 + ... + N positions a layer); no allocation per chunk", async () => {
  const N = 48, chunk = 16;
  const opened = await openModel(TINY, { capacity: 3 * N, chunk, threads: 1 });
  try {
    const c = counting(opened.k);
    const model = new K3Model(c.k, opened.cfg, opened.model.weights, chunk, 3 * N);
    const runs: Work[] = [];
    for (const n of [N, 2 * N, 3 * N]) {
      const state = model.newState();
      const ids = Array.from({ length: n }, (_, i) => ((i * 7) % 700) + 1);
      const work = c.start();
      for (let i = 0; i < n; i += chunk) await model.forward(state, ids.slice(i, i + chunk));
      runs.push(work);
      c.start();
      state.free();
    }
    const [a, b, d] = runs;
    const names = new Set([...a.keys(), ...b.keys(), ...d.keys()]);
    assert.ok(names.has("k3_mla_attend") && names.has("k3_kda_step"), [...names].join(" "));
    for (const name of names) {
      const get = (w: Work) => w.get(name) ?? { calls: 0, ints: 0 };
      assert.notEqual(name, "k3_alloc", "nothing is allocated during prefill");
      assert.equal(get(d).calls - 2 * get(b).calls + get(a).calls, 0, `${name}: calls linear in the prompt`);
      if (name === "k3_mla_attend") continue;
      assert.equal(get(d).ints - 2 * get(b).ints + get(a).ints, 0, `${name}: work per call independent of position`);
    }
    // MLA attention: one call per token per MLA layer, over positions 1..n.
    const mlaLayers = opened.cfg.layerKinds.filter((x) => x !== "kda").length;
    assert.ok(mlaLayers > 0);
    const npos = (w: Work) => {
      // ints = the sum of npos plus the per-call constant arguments (heads, dims, ...).
      const perCall = (a.get("k3_mla_attend")!.ints - mlaLayers * (N * (N + 1)) / 2) / a.get("k3_mla_attend")!.calls;
      return w.get("k3_mla_attend")!.ints - perCall * w.get("k3_mla_attend")!.calls;
    };
    for (const [w, n] of [[b, 2 * N], [d, 3 * N]] as const) {
      assert.equal(npos(w), mlaLayers * (n * (n + 1)) / 2, `attention over 1..${n} positions a layer`);
      assert.equal(w.get("k3_mla_attend")!.calls, mlaLayers * n);
    }
  } finally {
    await opened.close();
  }
});

Deno.test("the prompt limit: MAX_PROMPT_IDS ids are accepted, one more is refused (run and batch)", async () => {
  const ids = (n: number) => Array.from({ length: n }, (_, i) => (i % 700) + 1);
  const tok = () => {
    throw new Error("no tokenizer needed");
  };
  assert.equal(
    (await promptIds({ kind: "ids", text: ids(MAX_PROMPT_IDS).join(",") }, 1024, tok)).length,
    MAX_PROMPT_IDS,
  );
  await assert.rejects(
    async () => await promptIds({ kind: "ids", text: ids(MAX_PROMPT_IDS + 1).join(",") }, 1024, tok),
    new RegExp(`the prompt has ${MAX_PROMPT_IDS + 1} ids, at most ${MAX_PROMPT_IDS}`),
  );
  const job = (n: number) => JSON.stringify({ id: 1, ids: ids(n) });
  const opts = { vocab: 1024, gen: 1, stopIds: [], tokenizer: () => undefined };
  assert.equal(parseJob(job(MAX_PROMPT_IDS), 1, opts).promptIds.length, MAX_PROMPT_IDS);
  assert.throws(() => parseJob(job(MAX_PROMPT_IDS + 1), 1, opts), new RegExp(`at most ${MAX_PROMPT_IDS}$`));
});
