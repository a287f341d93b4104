/**
 * `k3 run`'s stdout: the text as tokens arrive (stop strings held back and cut), the ids
 * without a tokenizer, or JSON lines with --json.
 *
 * @module
 */

import { StopMatcher } from "../../engine/generate/stops.ts";
import { tokenLogprob } from "../../engine/generate/logprobs.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { writeStdout } from "../interrupt.ts";

/** Writes stdout as tokens arrive: text (stop strings held back and cut), ids, or JSON lines. */
export class Output {
  readonly #matcher?: StopMatcher;
  /** The text written so far (stop strings cut). */
  text = "";
  #n = 0;

  /** Matches `stops` with `tokenizer` (none: ids are written); `json`: JSON lines; `ends`:
   * the stop ids, whose text (`[EOS]`, `<|end_of_msg|>`) is never written. */
  constructor(
    tokenizer: Tokenizer | undefined,
    stops: string[],
    readonly json: boolean,
    readonly ends: readonly number[] = [],
  ) {
    if (tokenizer) this.#matcher = new StopMatcher(tokenizer, stops);
  }

  /** Emits one token; true when a stop string matched. */
  token(id: number, seconds: number, logits: Float32Array): boolean {
    // A stop id ends the text; it is not part of it.
    const r = this.#matcher && this.ends.includes(id) ? { text: "", stopped: false } : this.#matcher?.push(id);
    if (r) this.text += r.text;
    if (this.json) {
      const logprob = tokenLogprob(logits, id, 0).logprob;
      writeStdout(JSON.stringify({ index: this.#n, id, text: r ? r.text : null, seconds, logprob }) + "\n");
    } else if (r) writeStdout(r.text);
    else writeStdout((this.#n > 0 ? "," : "") + id);
    this.#n++;
    return r?.stopped ?? false;
  }

  /** The held-back text, then the end of the output. */
  end(summary: Record<string, unknown>): void {
    const rest = this.#matcher?.flush() ?? "";
    this.text += rest;
    if (this.json) {
      if (rest) writeStdout(JSON.stringify({ index: this.#n, id: null, text: rest, seconds: 0 }) + "\n");
      writeStdout(JSON.stringify({ ...summary, generated_text: this.#matcher ? this.text : null }) + "\n");
    } else writeStdout(rest + "\n");
  }
}
