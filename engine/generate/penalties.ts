/**
 * OpenAI's and vLLM's logit adjustments: `logit_bias`, `repetition_penalty`,
 * `frequency_penalty` and `presence_penalty`, applied to a sequence's logits before each
 * pick, in this fixed order and arithmetic (per token t, in float64, rounded to float32
 * once at the end):
 *
 *   x = logit[t] + bias[t]
 *   if t was seen (prompt or output) and r != 1: x = x > 0 ? x / r : x * r
 *   x = x - frequency * count[t] - presence * (count[t] > 0 ? 1 : 0)
 *
 * `count[t]` counts t among the generated tokens (as OpenAI and vLLM count); the
 * repetition penalty reads the prompt too (as vLLM and Hugging Face do). Only the tokens
 * these touch are written, so the cost is that of the prompt's distinct tokens and the
 * output, not of the vocabulary. The logits are a pure function of the model's, the prompt
 * and the tokens picked, so the adjustment is as reproducible as they are (every budget,
 * alone or in a batch).
 *
 * @module
 */

import type { TokenFilter } from "./scheduler.ts";

/** The adjustments one request asks for (neutral values: 0, 0, 1, no bias). */
export interface Penalties {
  /** Subtracted once from every token already generated (-2..2). */
  presence: number;
  /** Subtracted per occurrence among the generated tokens (-2..2). */
  frequency: number;
  /** Divides positive logits (multiplies negative ones) of tokens seen in the prompt or output (> 0). */
  repetition: number;
  /** Added to the logits of these token ids (-100..100). */
  bias: ReadonlyMap<number, number>;
}

/** True when `p` changes no logit. */
export function neutral(p: Penalties): boolean {
  return p.presence === 0 && p.frequency === 0 && p.repetition === 1 && p.bias.size === 0;
}

/** One token's adjusted logit (see the module comment): the one formula, shared with tests. */
export function adjustedLogit(logit: number, p: Penalties, token: number, seen: boolean, count: number): number {
  let x = logit + (p.bias.get(token) ?? 0);
  if (seen && p.repetition !== 1) x = x > 0 ? x / p.repetition : x * p.repetition;
  x = x - p.frequency * count - p.presence * (count > 0 ? 1 : 0);
  return Math.fround(x);
}

/**
 * Applies `p` to a sequence's logits before the inner filter (a grammar) or the sampler
 * picks, and counts what is picked.
 */
export class PenaltyFilter implements TokenFilter {
  /** Occurrences of each generated token. */
  readonly #counts = new Map<number, number>();
  /** Tokens of the prompt (read by the repetition penalty). */
  readonly #prompt: ReadonlySet<number>;
  /** Tokens the adjustment touches, in ascending order once sorted (bias, prompt, output). */
  #touched: number[] = [];
  #dirty = true;

  /** Over a sequence of `prompt`, before `inner` (a grammar) when given. */
  constructor(readonly penalties: Penalties, prompt: readonly number[], readonly inner?: TokenFilter) {
    this.#prompt = new Set(penalties.repetition !== 1 ? prompt : []);
  }

  /** See {@link TokenFilter.pick}. */
  pick(logits: Float32Array, choose: (logits: Float32Array) => number): number {
    this.apply(logits);
    const t = this.inner ? this.inner.pick(logits, choose) : choose(logits);
    this.#counts.set(t, (this.#counts.get(t) ?? 0) + 1);
    this.#dirty ||= this.#counts.get(t) === 1;
    return t;
  }

  /** Adjusts `logits` in place for the tokens picked so far. */
  apply(logits: Float32Array): void {
    const pen = this.penalties;
    if (this.#dirty) {
      const all = new Set<number>([...pen.bias.keys(), ...this.#prompt, ...this.#counts.keys()]);
      this.#touched = [...all].filter((t) => t >= 0 && t < logits.length).sort((a, b) => a - b);
      this.#dirty = false;
    }
    for (const t of this.#touched) {
      const count = this.#counts.get(t) ?? 0;
      logits[t] = adjustedLogit(logits[t], pen, t, count > 0 || this.#prompt.has(t), count);
    }
  }
}

/** `inner` with `penalties` applied first (or `inner` itself when they change nothing). */
export function withPenalties(
  inner: TokenFilter | undefined,
  penalties: Penalties | undefined,
  prompt: readonly number[],
): TokenFilter | undefined {
  if (!penalties || neutral(penalties)) return inner;
  return new PenaltyFilter(penalties, prompt, inner);
}
