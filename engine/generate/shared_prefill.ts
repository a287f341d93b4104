/**
 * Choices of one prompt that share its prefill (a request's `n` > 1): the first choice
 * the scheduler admits prefills the prompt; the others wait for it, then start from a copy
 * of its state (SequenceState.snapshot and restore, the state cache's copy) and pick their
 * first token from a copy of the prompt's last logits. A prompt of P ids is run through
 * the model once, P rows, whatever `n`, with or without the state cache; each choice's
 * tokens are those it would have got alone, since a state restored from a snapshot
 * continues exactly as the original (the scheduler's contract: a sequence's logits do not
 * depend on its company).
 *
 * @module
 */

/** The prompt's state after its prefill, and the logits of its last position. */
export interface Prefilled {
  /** SequenceState.snapshot() at `pos`. */
  state: Uint8Array;
  /** The prompt's length: the position the state is at. */
  pos: number;
  /** The logits of the prompt's last position, before any choice's filter masked them. */
  logits: Float32Array;
}

/** The group of `members` sequences of one prompt; every member's SequenceRequest names it. */
export class SharedPrefill {
  /** Members not started yet. */
  #unstarted: number;
  /** A member is prefilling the prompt for the group. */
  #leading = false;
  #prefilled?: Prefilled;

  /** A group of `members` sequences (the request's `n`). */
  constructor(members: number) {
    this.#unstarted = members;
  }

  /**
   * What a member about to be admitted does: "lead" (prefill the prompt for the group, once
   * admitted: {@link lead}), "wait" (another member is prefilling it) or "fork" (start from
   * {@link prefilled}).
   */
  role(): "lead" | "wait" | "fork" {
    return this.#prefilled ? "fork" : this.#leading ? "wait" : "lead";
  }

  /** A member was admitted to prefill the prompt for the group. */
  lead(): void {
    this.#leading = true;
  }

  /** The prompt's state and last logits, once the leader has prefilled them. */
  get prefilled(): Prefilled | undefined {
    return this.#prefilled;
  }

  /** Whether a member still waits for the prompt's state (the leader then publishes it). */
  get awaited(): boolean {
    return this.#unstarted > 1 && !this.#prefilled;
  }

  /** The leader's prefill is done: members admitted from now on fork from this copy. */
  publish(prefilled: Prefilled): void {
    this.#prefilled = prefilled;
  }

  /** A member started (the leader at its first token, a fork at admission); the copy is
   * dropped once every member has. */
  started(): void {
    if (--this.#unstarted <= 0) this.#prefilled = undefined;
  }

  /** The leader ended before its prefill was done (cancelled, failed): it will never
   * start, and the next member admitted leads instead. */
  leaderGone(): void {
    this.#leading = false;
    this.#unstarted--;
  }
}
