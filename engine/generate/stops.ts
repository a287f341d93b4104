/**
 * Stop strings, matched on the decoded text as tokens arrive: a stop may span several
 * tokens (or end inside one), so text that could still become a stop string is held back
 * until it either completes one (and is dropped) or cannot any more (and is emitted).
 *
 * @module
 */

import type { StreamDecoder, Tokenizer } from "../text/tokenizer.ts";

/** Matches stop strings across token boundaries; never emits the stop text. */
export class StopMatcher {
  readonly #decoder: StreamDecoder;
  readonly #stops: string[];
  /** Decoded text not yet emitted (a possible start of a stop string). */
  #held = "";
  #stopped = false;

  /** `stops` must be non-empty strings (checked by the option parsers). */
  constructor(tokenizer: Tokenizer, stops: readonly string[]) {
    this.#decoder = tokenizer.streamDecoder();
    this.#stops = stops.filter((s) => s.length > 0);
  }

  /** Whether a stop string has matched (after that, push emits nothing). */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Feed one token; returns the text now safe to emit and whether a stop matched. */
  push(token: number): { text: string; stopped: boolean } {
    if (this.#stopped) return { text: "", stopped: true };
    return this.pushText(this.#decoder.push(token));
  }

  /** Feed decoded text (a caller that decodes itself, e.g. a reply's channel text). */
  pushText(more: string): { text: string; stopped: boolean } {
    if (this.#stopped) return { text: "", stopped: true };
    const text = this.#held + more;
    // The earliest stop wins (a stop that starts earlier ends the text earlier).
    let at = -1;
    for (const s of this.#stops) {
      const i = text.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    }
    if (at >= 0) {
      this.#stopped = true;
      this.#held = "";
      return { text: text.slice(0, at), stopped: true };
    }
    const keep = this.#heldLength(text);
    this.#held = text.slice(text.length - keep);
    return { text: text.slice(0, text.length - keep), stopped: false };
  }

  /** The held-back text at the end (call when generation ends without a stop). */
  flush(): string {
    if (this.#stopped) return "";
    const rest = this.#held + this.#decoder.flush();
    this.#held = "";
    return rest;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some stop. */
  #heldLength(text: string): number {
    let best = 0;
    for (const s of this.#stops) {
      for (let n = Math.min(s.length - 1, text.length); n > best; n--) {
        if (text.endsWith(s.slice(0, n))) {
          best = n;
          break;
        }
      }
    }
    return best;
  }
}
