/**
 * Log probabilities of generated tokens, as OpenAI documents them: the log-softmax of the
 * logits the sampler was given (after a constrained decoder's mask, which sets a refused
 * id's logit to -Infinity, and before temperature and any truncation), in float64.
 *
 * The arithmetic is fixed, so the same logit bits give the same log probability bits at
 * every budget, thread count and batch composition: m = the largest logit; s = the sum of
 * exp(logit - m) over the ids in ascending order (Math.exp: V8's fdlibm port, the same
 * bits on every platform); logprob(i) = (logit_i - m) - log(s). A masked id's is
 * -Infinity and never among the most likely.
 *
 * @module
 */

/** One token's log probability and, when asked, the most likely alternatives. */
export interface TokenLogprob {
  /** The token id. */
  id: number;
  /** Its log probability (float64). */
  logprob: number;
  /** The `top` most likely ids with theirs, most likely first, ties by lower id. */
  top: { id: number; logprob: number }[];
}

/** The most alternatives a request may ask for (OpenAI's limit). */
export const MAX_TOP_LOGPROBS = 20;

/** log(sum(exp(logit - max))) and max over `logits`, in float64, ids in ascending order. */
function logSumExp(logits: Float32Array): { max: number; logSum: number } {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  return { max, logSum: Math.log(sum) };
}

/**
 * The log probability of `id` under `logits` and the `top` (0..20) most likely ids'.
 * The logits are the sampler's input for this step (a view valid only during the call).
 */
export function tokenLogprob(logits: Float32Array, id: number, top: number): TokenLogprob {
  const { max, logSum } = logSumExp(logits);
  const lp = (i: number) => (logits[i] - max) - logSum;
  const best: number[] = [];
  if (top > 0) {
    // Insertion into a short sorted list: one pass over the vocabulary.
    for (let i = 0; i < logits.length; i++) {
      const x = logits[i];
      if (x === -Infinity) continue;
      if (best.length === top && !(x > logits[best[top - 1]])) continue;
      let j = Math.min(best.length, top - 1);
      if (best.length < top) best.push(i);
      while (j > 0 && x > logits[best[j - 1]]) (best[j] = best[j - 1], j--);
      best[j] = i;
    }
  }
  return { id, logprob: lp(id), top: best.map((i) => ({ id: i, logprob: lp(i) })) };
}
