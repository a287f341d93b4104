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
  #listeners: (readonly [Deno.Signal, () => void])[] = SIGNALS.map((s) => [s, () => this.#fire(s)] as const);
  readonly #exitOnSecond: boolean;
  /** Called instead of aborting when nothing is running (chat waiting for input). */
  idle?: () => void;
  /** Whether generation is running (signals abort it) or not (signals call `idle`). */
  busy = true;

  /** Installs the listeners (none with `listen` false: the signals keep ending the
   * process); `exitOnSecond` false: a second signal is ignored (serve's grace period
   * runs to its end). */
  constructor({ exitOnSecond = true, listen = true }: { exitOnSecond?: boolean; listen?: boolean } = {}) {
    this.#exitOnSecond = exitOnSecond;
    if (!listen) this.#listeners = [];
    for (const [s, listener] of this.#listeners) Deno.addSignalListener(s, listener);
  }

  /** The current abort signal; its reason is the name of the signal that fired it. */
  get signal(): AbortSignal {
    return this.#ctl.signal;
  }

  /** A fresh signal (chat: the next reply can run after an interrupted one). */
  renew(): AbortSignal {
    this.#ctl = new AbortController();
    return this.#ctl.signal;
  }

  #fire(sig: Deno.Signal): void {
    if (!this.busy && this.idle) return this.idle();
    if (this.#ctl.signal.aborted) {
      if (this.#exitOnSecond) Deno.exit(EXIT_INTERRUPTED);
      return;
    }
    this.#ctl.abort(sig);
  }

  /** Removes the listeners. */
  dispose(): void {
    for (const [s, listener] of this.#listeners) Deno.removeSignalListener(s, listener);
  }
}

/** Writes all of `text` to stdout now (no buffering: tokens appear as they exist). */
export function writeStdout(text: string | Uint8Array): void {
  const bytes = typeof text === "string" ? new TextEncoder().encode(text) : text;
  let off = 0;
  while (off < bytes.length) off += Deno.stdout.writeSync(bytes.subarray(off));
}
