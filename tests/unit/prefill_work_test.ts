/**
 * Prefill work is linear in the prompt except MLA attention over the cache: every kernel
 * call made by the forward pass is counted (calls, and the sum of their integer
 * arguments, which carry every size a kernel works on) for prompts of N, 2N and 3N ids.
 * Linear work has a zero second difference; only MLA attention's positions grow with the
 * square (exactly 1 + 2 + ... + N per MLA layer, one query row per token, whatever the
 * tiles of rows k3_mla_attend_rows takes them in), and nothing is allocated per chunk.
 * The prompt limits are enforced at exactly their length: the model's window (run, batch),
 * and what the memory plan holds at the budget (a longer context refused naming it, exit 2).
 */

import assert from "node:assert/strict";
import { openModel, readModelConfig } from "../../engine/open.ts";
import { K3Model } from "../../engine/model/model.ts";
import type { Kernels } from "../../engine/native/ffi.ts";
import { promptIds } from "../../cli/run_options.ts";
import { modelWindow } from "../../engine/model/config.ts";
import { EXIT, K3Error } from "../../engine/errors.ts";
import { parseJob } from "../../cli/batch/jobs.ts";
import { TINY } from "../helpers.ts";

/** Per kernel: calls and the sum of integer arguments; for MLA attention also its query
 * rows and the positions they attend over (row j of a call sees npos + j). */
type Work = Map<string, { calls: number; ints: number; rows: number; positions: number }>;
const ATTEND = "k3_mla_attend_rows";

/** The kernels with every call counted into `work` (when it is set). */
function counting(k: Kernels): { k: Kernels; start(): Work } {
  let work: Work | undefined;
  const proxy = new Proxy(k, {
    get(target, name: string) {
      const f = (target as unknown as Record<string, unknown>)[name];
      if (typeof f !== "function") return f;
      return (...args: unknown[]) => {
        if (work) {
          const w = work.get(name) ?? { calls: 0, ints: 0, rows: 0, positions: 0 };
          w.calls++;
          for (const a of args) if (typeof a === "number" && Number.isInteger(a)) w.ints += a;
          if (name === ATTEND) {
            const [npos, nrows] = [args[6], args[7]] as number[];
            w.rows += nrows;
            w.positions += nrows * npos + (nrows * (nrows - 1)) / 2;
          }
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
    assert.ok(names.has(ATTEND) && names.has("k3_kda_steps"), [...names].join(" "));
    for (const name of names) {
      const get = (w: Work) => w.get(name) ?? { calls: 0, ints: 0 };
      assert.notEqual(name, "k3_alloc", "nothing is allocated during prefill");
      // (MLA attention's calls follow its tiles of rows; its rows are counted below)
      if (name === ATTEND) continue;
      assert.equal(get(d).calls - 2 * get(b).calls + get(a).calls, 0, `${name}: calls linear in the prompt`);
      assert.equal(get(d).ints - 2 * get(b).ints + get(a).ints, 0, `${name}: work per call independent of position`);
    }
    // MLA attention: one query row per token per MLA layer, over positions 1..n.
    const mlaLayers = opened.cfg.layerKinds.filter((x) => x !== "kda").length;
    assert.ok(mlaLayers > 0);
    for (const [w, n] of [[a, N], [b, 2 * N], [d, 3 * N]] as const) {
      assert.equal(w.get(ATTEND)!.positions, mlaLayers * (n * (n + 1)) / 2, `attention over 1..${n} positions a layer`);
      assert.equal(w.get(ATTEND)!.rows, mlaLayers * n);
    }
  } finally {
    await opened.close();
  }
});

Deno.test("the prompt limit: the model's window of ids is accepted, one more is refused (run and batch)", async () => {
  const { cfg } = await readModelConfig(TINY);
  const limit = modelWindow(cfg);
  assert.equal(limit, 262144, "the tiny config's max_position_embeddings");
  const ids = (n: number) => Array.from({ length: n }, (_, i) => (i % 700) + 1);
  const tok = () => {
    throw new Error("no tokenizer needed");
  };
  assert.equal((await promptIds({ kind: "ids", text: ids(limit).join(",") }, 1024, tok, limit)).length, limit);
  await assert.rejects(
    async () => await promptIds({ kind: "ids", text: ids(limit + 1).join(",") }, 1024, tok, limit),
    new RegExp(`the prompt has ${limit + 1} ids, at most ${limit} \\(the model's window, max_position_embeddings\\)$`),
  );
  const job = (n: number) => JSON.stringify({ id: 1, ids: ids(n) });
  const opts = { vocab: 1024, maxPromptIds: limit, gen: 1, stopIds: [], tokenizer: () => undefined };
  assert.equal(parseJob(job(limit), 1, opts).promptIds.length, limit);
  assert.throws(() => parseJob(job(limit + 1), 1, opts), new RegExp(`at most ${limit} \\(the model's window`));
});

Deno.test("the memory plan's limit: the most positions it holds open, one more is refused naming them (exit 2)", async () => {
  const config = await readModelConfig(TINY);
  // A budget with room for the weights and about 3,000 positions of state.
  const sized = await openModel(config, { capacity: 1000, chunk: 16, threads: 1 });
  const budget = sized.plan.totalBytes + sized.plan.overheadBytes + 2000 * sized.plan.state.kvPerPosition;
  await sized.close();
  const memoryAvailable = { bytes: budget, source: "the test's budget" };
  const refusal = (capacity: number) =>
    openModel(config, {
      capacity,
      chunk: 16,
      threads: 1,
      memoryAvailable,
      capacityRefusal: (most) => `--context ${capacity}: at most ${most}`,
    });
  let most = 0;
  await assert.rejects(() => refusal(modelWindow(config.cfg)), (e) => {
    assert.ok(e instanceof K3Error && e.exitCode === EXIT.usage, String(e));
    most = Number(/: at most (\d+)$/.exec(e.message)?.[1]);
    return true;
  });
  assert.ok(most > 1000 && most < modelWindow(config.cfg), `the budget holds ${most} positions`);
  const atLimit = await refusal(most);
  try {
    assert.equal(atLimit.plan.state.positions, most);
  } finally {
    await atLimit.close();
  }
  await assert.rejects(() => refusal(most + 1), new RegExp(`--context ${most + 1}: at most ${most}$`));
  // --context auto takes that many (the states' share of a budget this small is less).
  const auto = await openModel(config, {
    capacity: modelWindow(config.cfg),
    autoCapacity: true,
    chunk: 16,
    threads: 1,
    memoryAvailable,
  });
  try {
    assert.ok(auto.plan.state.positions >= 1 && auto.plan.state.positions <= most, `${auto.plan.state.positions}`);
  } finally {
    await auto.close();
  }
});
