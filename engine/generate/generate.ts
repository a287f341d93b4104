/**
 * One sequence at a time on top of the scheduler (the one-sequence case of its loop), and
 * teacher forcing for the oracle tests.
 *
 * @module
 */

import type { K3Model } from "../model/model.ts";
import type { SequenceState } from "../model/state.ts";
import { argmax } from "./sampling.ts";
import { Scheduler } from "./scheduler.ts";

/** One generated token and what it cost. */
export interface Step {
  /** Index of the generated token (0 = the first). */
  step: number;
  /** The token id. */
  token: number;
  /** Seconds since the previous step (the first includes the prefill). */
  seconds: number;
}

/** What `generate` needs to know. */
export interface GenerateOptions {
  /** Tokens to generate (at most). */
  gen: number;
  /** Carry state between steps (true) or recompute the whole sequence each step. */
  incremental: boolean;
  /** Stop after emitting one of these. */
  stopIds?: number[];
  /** Called with the logits each token was chosen from. */
  onLogits?: (logits: Float32Array) => void;
  /** Called after each token. */
  onStep?: (s: Step) => void;
}

/** Runs `ids` through the model in chunks of at most model.maxT; returns the last logits. */
export async function prefill(model: K3Model, state: SequenceState, ids: number[]): Promise<Float32Array> {
  let logits: Float32Array | undefined;
  for (let i = 0; i < ids.length; i += model.maxT) {
    logits = await model.forward(state, ids.slice(i, i + model.maxT));
  }
  return logits!;
}

/** Greedy decode of one sequence. Returns the generated ids and per-step timings. */
export async function generate(model: K3Model, prompt: number[], opts: GenerateOptions): Promise<Step[]> {
  if (prompt.length === 0) throw new Error("generate: empty prompt");
  const steps: Step[] = [];
  let last = performance.now();
  await new Scheduler(model).submit({
    prompt,
    maxTokens: opts.gen,
    stopIds: opts.stopIds,
    recompute: !opts.incremental,
    onToken: (token, logits) => {
      opts.onLogits?.(logits);
      const now = performance.now();
      const step = { step: steps.length, token, seconds: (now - last) / 1000 };
      last = now;
      steps.push(step);
      opts.onStep?.(step);
    },
  });
  return steps;
}

/** Teacher forcing: the argmax of the logits at every position of `ids` (passes of as many
 * rows as the model returns logits for). */
export async function teacherForce(
  model: K3Model,
  ids: number[],
  onLogits?: (pos: number, logits: Float32Array) => void,
): Promise<number[]> {
  const state = model.newState();
  const V = model.cfg.vocabSize;
  const out: number[] = [];
  const step = Math.min(model.maxT, model.logitRows);
  try {
    for (let i = 0; i < ids.length; i += step) {
      const chunk = ids.slice(i, i + step);
      const logits = await model.forward(state, chunk, true);
      for (let t = 0; t < chunk.length; t++) {
        const row = logits.subarray(t * V, (t + 1) * V);
        onLogits?.(i + t, row);
        out.push(argmax(row));
      }
    }
  } finally {
    state.free();
  }
  return out;
}
