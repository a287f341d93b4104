/**
 * Greedy generation on top of the forward pass: chunked prefill, then one token per step,
 * either carrying the recurrent state (incremental) or recomputing the whole sequence from
 * scratch every step (full recompute). Both give the same tokens.
 *
 * @module
 */

import { EXIT, K3Error } from "../errors.ts";
import type { K3Model, SequenceState } from "../model/model.ts";

/** One generated token and what it cost. */
export interface Step {
  step: number;
  token: number;
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

/** Index of the largest logit, ties to the lowest index. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

/**
 * Refuses logits that are not all finite: weights that passed every shape and checksum
 * check can still hold NaN or Inf, and an argmax over them is not an answer (exit 4).
 */
export function checkFinite(logits: Float32Array, step: number): void {
  for (let i = 0; i < logits.length; i++) {
    if (!Number.isFinite(logits[i])) {
      throw new K3Error(
        `output unsound: logit ${i} is ${logits[i]} at step ${step} (NaN or Inf in the weights or activations)`,
        EXIT.unsound,
      );
    }
  }
}

/** Runs `ids` through the model in chunks of at most model.maxT; returns the last logits. */
export async function prefill(model: K3Model, state: SequenceState, ids: number[]): Promise<Float32Array> {
  let logits: Float32Array | undefined;
  for (let i = 0; i < ids.length; i += model.maxT) {
    logits = await model.forward(state, ids.slice(i, i + model.maxT));
  }
  return logits!;
}

/** Greedy decode. Returns the generated ids and per-step timings. */
export async function generate(model: K3Model, prompt: number[], opts: GenerateOptions): Promise<Step[]> {
  if (prompt.length === 0) throw new Error("generate: empty prompt");
  const state = model.newState();
  const steps: Step[] = [];
  const seq = [...prompt];
  try {
    let t0 = performance.now();
    let logits = await prefill(model, state, seq);
    for (let i = 0; i < opts.gen; i++) {
      checkFinite(logits, i);
      opts.onLogits?.(logits);
      const token = argmax(logits);
      const step = { step: i, token, seconds: (performance.now() - t0) / 1000 };
      steps.push(step);
      opts.onStep?.(step);
      seq.push(token);
      if (opts.stopIds?.includes(token) || i === opts.gen - 1) break;
      t0 = performance.now();
      if (opts.incremental) {
        logits = await model.forward(state, [token]);
      } else {
        state.reset();
        logits = await prefill(model, state, seq);
      }
    }
  } finally {
    state.free();
  }
  return steps;
}

/** Teacher forcing: the argmax of the logits at every position of `ids`. */
export async function teacherForce(
  model: K3Model,
  ids: number[],
  onLogits?: (pos: number, logits: Float32Array) => void,
): Promise<number[]> {
  const state = model.newState();
  const V = model.cfg.vocabSize;
  const out: number[] = [];
  try {
    for (let i = 0; i < ids.length; i += model.maxT) {
      const chunk = ids.slice(i, i + model.maxT);
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
