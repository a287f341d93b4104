/**
 * Where `k3 batch` keeps states so lines that share a prefix (a system prompt, a tool
 * list, a few-shot block) prefill it once: for each line, every length of prefix it shares
 * with some other line (at least {@link MIN_SHARED} ids). The scheduler keeps the first
 * line's state at those positions and lets a line that needs one wait for it.
 *
 * @module
 */

/** Shorter shared prefixes are not worth a kept state (and a line waiting for it). */
export const MIN_SHARED = 32;

function lcp(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

function compare(a: readonly number[], b: readonly number[]): number {
  const i = lcp(a, b);
  if (i === a.length || i === b.length) return a.length - b.length;
  return a[i] - b[i];
}

/**
 * For each prompt, the lengths of the prefixes it shares with other prompts (each at
 * least `min` ids), ascending. With the prompts sorted, the prefix two share is the
 * smallest neighbour overlap between them, so walking out from each prompt while that
 * running minimum stays at least `min` finds every length.
 */
export function sharedPrefixes(prompts: readonly (readonly number[])[], min = MIN_SHARED): number[][] {
  const order = prompts.map((_, i) => i).sort((a, b) => compare(prompts[a], prompts[b]) || a - b);
  const next = order.slice(0, -1).map((a, k) => lcp(prompts[a], prompts[order[k + 1]]));
  const out: number[][] = prompts.map(() => []);
  order.forEach((job, k) => {
    const found = new Set<number>();
    for (const step of [-1, 1]) {
      let m = Infinity;
      for (let j = k;; j += step) {
        const edge = step < 0 ? j - 1 : j;
        if (edge < 0 || edge >= next.length) break;
        m = Math.min(m, next[edge]);
        if (m < min) break;
        found.add(m);
      }
    }
    out[job] = [...found].sort((a, b) => a - b);
  });
  return out;
}
