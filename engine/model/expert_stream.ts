/**
 * One layer's routed experts, run as their bytes land.
 *
 * The stream claims the experts any row chose as soon as the routing is known: every one
 * already in memory (or being read) and as many others as the source has room for, all
 * their reads issued at once. The pass then computes what does not need them (the latent
 * projection, the shared experts) and `run` computes each expert the moment it lands, hits
 * first, releasing its slot right after, and claims the next ones into the room that frees:
 * a union larger than the cache flows through it with every free slot reading, instead of in
 * waves. Each expert's output has its own place (noted per row and router slot) and the rows
 * sum them in router order afterwards, so the order experts land in never changes a bit.
 *
 * @module
 */

import type { Expert } from "../native/tensors.ts";
import type { IoStats, WeightSource } from "./weight_source.ts";

/** Layer L's experts `ids`, claimed at construction and run as they land. */
export class ExpertStream {
  /** Experts not claimed yet (no room), in the order they will be claimed. */
  private pending: number[];
  private readonly landing = new Map<number, Promise<{ E: number; ex: Expert }>>();

  /** Claims what fits of layer L's `ids` and starts their reads. */
  constructor(private readonly src: WeightSource, private readonly L: number, ids: number[]) {
    this.pending = [...ids];
    this.claim();
  }

  /** Claims what fits of the pending experts and starts their reads. */
  private claim(): void {
    if (this.pending.length === 0) return;
    const got = this.src.experts(this.L, this.pending);
    for (const [E, p] of got) {
      const landed = Promise.resolve(p).then((ex) => ({ E, ex }));
      landed.catch(() => {}); // handled by run's race; a failure must not surface unhandled meanwhile
      this.landing.set(E, landed);
    }
    if (got.size > 0) this.pending = this.pending.filter((E) => !got.has(E));
  }

  /**
   * Runs `each` on every expert as it lands (`waited` gets the milliseconds spent waiting for
   * one), releasing each after its run and claiming more into the room it leaves.
   * On a failed read or a failed `each`, waits for the reads in flight, then throws.
   */
  async run(each: (E: number, ex: Expert) => void, waited: (t0: number) => void): Promise<void> {
    try {
      while (this.landing.size > 0 || this.pending.length > 0) {
        const t0 = performance.now();
        const room = this.pending.length > 0 ? this.src.whenExpertRoom?.() : undefined;
        if (this.landing.size === 0 && !room) {
          throw new Error(`internal: no room for layer ${this.L}'s experts ${this.pending.join(",")}`);
        }
        const next = await Promise.race([...this.landing.values(), ...(room ? [room.then(() => undefined)] : [])]);
        waited(t0);
        if (next) {
          this.landing.delete(next.E);
          each(next.E, next.ex);
          this.src.doneWithExperts?.(this.L, [next.E]);
        }
        this.claim();
      }
    } catch (e) {
      // No read may land in a slot we no longer hold.
      await Promise.allSettled(this.landing.values());
      throw e;
    }
  }
}

/**
 * The share of a layer's experts the guess gets right, as the plan counts it: 148 of 158 on
 * the real-width decode slice (bench/README.md, "Expert reads").
 */
export const GUESS_RIGHT = 0.9;

/**
 * Whether reading experts ahead on a guess still pays, from the counters so far (`io`): guesses
 * that mostly miss cost more reads than they hide, so after 8 layers' worth of them (8 x
 * `topK`) read ahead only while at least half were taken; and a cache that already serves 19
 * lookups in 20 by itself (hits that were not guesses) leaves too little to hide for the
 * router matvec each guess costs.
 */
export function readAheadPays(
  io: Pick<IoStats, "expertPrefetched" | "expertPrefetchHits" | "expertHits" | "expertMisses">,
  topK: number,
): boolean {
  const { expertPrefetched: guessed, expertPrefetchHits: taken } = io;
  if (guessed >= 8 * topK && 2 * taken < guessed) return false;
  const lookups = io.expertHits + io.expertMisses;
  return lookups < 8 * topK || 20 * (io.expertHits - taken) < 19 * lookups;
}
