/**
 * A reasoning budget: a reply that is still in its think channel after `budget` tokens gets
 * the channel closed for it, `<|close|>think<|sep|><|open|>response<|sep|>` written as
 * forced tokens (whatever the logits say), and goes on in its response channel, under
 * its grammar when it has one (a forced call or a response format, which accept exactly
 * that markup there). A think channel the model closes by itself (its `<|close|>`) ends
 * the count.
 *
 * It is a TokenFilter, so every token goes through it in order, speculation on or off: a
 * forced token that differs from a draft is a mismatch like any other, and the tokens are
 * the same either way.
 *
 * @module
 */

import type { TokenFilter } from "./scheduler.ts";

/** A constraint the budget can step past a forced token (grammar/mask.ts TokenConstraint). */
export interface AdvancingFilter extends TokenFilter {
  /** Advances past `token`, chosen outside the constraint. */
  advance(token: number): void;
}

/** Closes the think channel after `budget` reasoning tokens; `inner`: the reply's grammar. */
export class ReasoningBudget implements TokenFilter {
  #thinking = true;
  #spent = 0;
  #forced = 0;
  /** `closing`: the ids of `<|close|>think<|sep|><|open|>response<|sep|>`; `close`: the
   * `<|close|>` id (the model closing the channel itself). */
  constructor(
    readonly budget: number,
    readonly closing: readonly number[],
    readonly close: number,
    readonly inner?: AdvancingFilter,
  ) {}

  /** Reasoning tokens generated so far (forced ones not counted). */
  get spent(): number {
    return this.#spent;
  }

  /** See {@link TokenFilter.pick}. */
  pick(logits: Float32Array, choose: (logits: Float32Array) => number): number {
    if (this.#thinking && (this.#forced > 0 || this.#spent >= this.budget)) {
      const token = this.closing[this.#forced++];
      if (this.#forced === this.closing.length) this.#thinking = false;
      this.inner?.advance(token);
      return token;
    }
    const token = this.inner ? this.inner.pick(logits, choose) : choose(logits);
    if (this.#thinking) {
      if (token === this.close) this.#thinking = false;
      else this.#spent++;
    }
    return token;
  }
}
