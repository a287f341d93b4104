/**
 * `k3 pull`'s progress on stderr: bytes, rate and ETA in all and for each file in flight.
 * On a terminal, a block of lines redrawn at most ~8 times a second (the total first,
 * then one line per file); in a log, the total every 30 s and one line per finished file.
 * Notes (retries, repairs) are printed above the block.
 *
 * @module
 */

import { fmtDuration, info, isProgressEnabled, transferLine } from "../progress.ts";
import type { TransferResult } from "./transfer.ts";

/** One file in flight. */
interface Active {
  size: number;
  done: number;
  fetched: number;
  start: number;
}

const LOG_INTERVAL_MS = 30_000;
const DRAW_INTERVAL_MS = 125;
const enc = new TextEncoder();

/** Collects the transfers' bytes and prints the progress (see the module doc). */
export class PullProgress {
  /** Bytes of every file to be in place. */
  total = 0;
  /** Bytes in place so far (verified or written). */
  done = 0;
  /** Bytes that came over the network in this run. */
  fetchedBytes = 0;
  /** Bytes of the trunk to pack (0: no --pack). */
  packTotal = 0;
  /** Bytes of the trunk packed (or kept from an earlier run). */
  packDone = 0;
  #firstFetch = 0;
  #active = new Map<string, Active>();
  #drawn = 0;
  #lastDraw = 0;
  #lastLog = performance.now();
  readonly #terminal: boolean;
  readonly #write: (text: string) => void;

  /** `terminal` (default: whether progress lines are on) and `write` are for tests. */
  constructor(terminal = isProgressEnabled(), write?: (text: string) => void) {
    this.#terminal = terminal;
    this.#write = write ?? ((t) => {
      try {
        Deno.stderr.writeSync(enc.encode(t));
      } catch { /* stderr closed: progress is best effort */ }
    });
  }

  /** Sets the bytes of the files now to be in place (done counts on). */
  setTotal(bytes: number): void {
    this.total = bytes;
  }

  /** Network bytes a second since the first one arrived. */
  rate(): number | undefined {
    const s = (performance.now() - this.#firstFetch) / 1000;
    return this.fetchedBytes > 0 && s > 0 ? this.fetchedBytes / s : undefined;
  }

  /** A file's transfer starts. */
  begin(path: string, size: number): void {
    this.#active.set(path, { size, done: 0, fetched: 0, start: performance.now() });
  }

  /** `n` more bytes of `path` are in place (negative: a part was discarded). */
  bytes(path: string, n: number, fetched: boolean): void {
    const a = this.#active.get(path);
    if (a) a.done += n;
    this.done += n;
    if (fetched) {
      if (this.fetchedBytes === 0) this.#firstFetch = performance.now();
      this.fetchedBytes += n;
      if (a) a.fetched += n;
    }
    this.#tick();
  }

  /** `n` more bytes of the trunk are packed. */
  packed(n: number): void {
    this.packDone += n;
    this.#tick();
  }

  /** A file is in place and verified. */
  end(path: string, result: TransferResult): void {
    const a = this.#active.get(path);
    this.#active.delete(path);
    if (!a) return;
    const s = (performance.now() - a.start) / 1000;
    const how = result === "present"
      ? "already there, verified"
      : result === "unchanged"
      ? "already there, unchanged since it was verified"
      : `${result}, verified`;
    const speed = a.fetched > 0 && s > 0 ? ` in ${fmtDuration(s)}` : "";
    this.#above(() => info(`pull: ${path}: ${how}${speed}`));
  }

  /** A note (a retry, a repair), printed above the progress block. */
  note(line: string): void {
    this.#above(() => console.error(line));
  }

  /** Clears the block at the end. */
  finish(): void {
    if (this.#terminal) this.#clear();
  }

  #lines(): string[] {
    const lines = [transferLine("pull", this.done, this.total, this.rate())];
    if (this.packTotal > 0) lines.push(transferLine("pack", this.packDone, this.packTotal));
    const now = performance.now();
    for (const [path, a] of this.#active) {
      const s = (now - a.start) / 1000;
      lines.push(transferLine(`  ${path}`, a.done, a.size, a.fetched > 0 && s > 0 ? a.fetched / s : undefined));
    }
    return lines;
  }

  #clear(): void {
    if (this.#drawn === 0) return;
    this.#write(`${this.#drawn > 1 ? `\x1b[${this.#drawn - 1}A` : ""}\r\x1b[J`);
    this.#drawn = 0;
  }

  #above(print: () => void): void {
    if (this.#terminal) this.#clear();
    print();
    if (this.#terminal) this.#draw();
  }

  #draw(): void {
    const lines = this.#lines();
    this.#clear();
    this.#write(lines.join("\n"));
    this.#drawn = lines.length;
    this.#lastDraw = performance.now();
  }

  #tick(): void {
    const now = performance.now();
    if (this.#terminal) {
      if (now - this.#lastDraw >= DRAW_INTERVAL_MS) this.#draw();
    } else if (now - this.#lastLog >= LOG_INTERVAL_MS) {
      this.#lastLog = now;
      info(this.#lines().join("\n"));
    }
  }
}
