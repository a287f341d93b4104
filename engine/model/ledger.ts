/**
 * The forward pass's ledger: seconds by kind of work, summed over every pass (the run's
 * report, ../generate/ledger.ts, turns two readings into its `ledger` object).
 *
 * @module
 */

/**
 * Where the seconds go, summed over every pass: waits for trunk and expert reads, dense
 * products (attention projections, MLPs, shared experts, router, latent projections),
 * routed-expert compute, the attention recurrences (KDA delta rule, MLA over the cache),
 * the lm_head, and sampling (added by the scheduler). What a report's wall clock has
 * beyond these is "other" (norms, residual sums, bookkeeping, the JS between kernels).
 */
export interface Ledger {
  /** Seconds waiting for trunk reads. */
  trunkReadWait: number;
  /** Seconds waiting for expert reads. */
  expertReadWait: number;
  /** Seconds in dense matrix products. */
  denseMatmul: number;
  /** Seconds in expert products. */
  expertCompute: number;
  /** Seconds in the attention recurrences. */
  attention: number;
  /** Of `attention`, the MLA layers' seconds: attention over the cache, the one work that
   * grows with the square of the prompt (bench/long_prompt.ts measures its share). */
  mlaAttention: number;
  /** Seconds in the final norm and lm_head. */
  head: number;
  /** Seconds choosing tokens (the scheduler's). */
  sampling: number;
  /** Seconds copying states into and out of the state cache and reading its spill files
   * (the scheduler's). */
  stateCache: number;
  /** Prompt positions restored from the state cache instead of prefilled (a count, not
   * seconds; the scheduler's). */
  cachedTokens: number;
  /** Seconds of passes that prefilled some prompt (the scheduler's; a split of the pass
   * time beside the kinds above, not one of them). */
  prefillPassSeconds: number;
  /** Rows of those passes. */
  prefillPassRows: number;
  /** Seconds of passes that only decoded (the scheduler's). */
  decodePassSeconds: number;
  /** Rows of those passes. */
  decodePassRows: number;
}

/** A ledger of zeros. */
export function newLedger(): Ledger {
  return {
    trunkReadWait: 0,
    expertReadWait: 0,
    denseMatmul: 0,
    expertCompute: 0,
    attention: 0,
    mlaAttention: 0,
    head: 0,
    sampling: 0,
    stateCache: 0,
    cachedTokens: 0,
    prefillPassSeconds: 0,
    prefillPassRows: 0,
    decodePassSeconds: 0,
    decodePassRows: 0,
  };
}
