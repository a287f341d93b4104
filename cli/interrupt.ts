/**
 * SIGINT and SIGTERM as an abort signal: the first one asks generation to stop at the next
 * pass boundary (what exists is printed and reported, exit 130); a second one, while the
 * first is still being honoured, exits at once with 130.
 *
 * @module
 */

/** The signals that stop generation (SIGTERM only where the platform has it). */
const SIGNALS: Deno.Signal[] = Deno.build.os === "windows" ? ["SIGINT"] : ["SIGINT", "SIGTERM"];

/** Exit code of a run stopped by a signal (128 + SIGINT), as shells report it. */
export const EXIT_INTERRUPTED = 130;

/** Aborts for SIGINT/SIGTERM while installed. */
export class Interrupts {
  #ctl = new AbortController();
  readonly #listener = () => this.#fire();
  /** Called instead of aborting when nothing is running (chat waiting for input). */
  idle?: () => void;
  /** Whether generation is running (signals abort it) or not (signals call `idle`). */
  busy = true;

  constructor() {
    for (const s of SIGNALS) Deno.addSignalListener(s, this.#listener);
  }

  /** The current abort signal. */
  get signal(): AbortSignal {
    return this.#ctl.signal;
  }

  /** A fresh signal (chat: the next reply can run after an interrupted one). */
  renew(): AbortSignal {
    this.#ctl = new AbortController();
    return this.#ctl.signal;
  }

  #fire(): void {
    if (!this.busy && this.idle) return this.idle();
    if (this.#ctl.signal.aborted) Deno.exit(EXIT_INTERRUPTED);
    this.#ctl.abort();
  }

  /** Removes the listeners. */
  dispose(): void {
    for (const s of SIGNALS) Deno.removeSignalListener(s, this.#listener);
  }
}

/** Writes all of `text` to stdout now (no buffering: tokens appear as they exist). */
export function writeStdout(text: string | Uint8Array): void {
  const bytes = typeof text === "string" ? new TextEncoder().encode(text) : text;
  let off = 0;
  while (off < bytes.length) off += Deno.stdout.writeSync(bytes.subarray(off));
}
