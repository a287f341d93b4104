/**
 * The output of `k3 batch` as an append log: each result line is appended whole and
 * fsync'ed as soon as its prompt finishes, so a killed run loses nothing already done; a
 * write that fails is cut away again, so the file only ever holds whole lines (a kill
 * mid-write leaves at most a torn last line, which cli/batch/resume.ts cuts).
 *
 * @module
 */

import { K3Error } from "../../engine/errors.ts";
import { readProblem } from "../../engine/paths.ts";
import { openDirect, type OutputTarget, writeAllSync, writeFailure, type Writer } from "../../engine/native/files.ts";

/** An output file that takes whole JSON lines. */
export class AppendLog {
  readonly #out: Deno.FsFile | Writer | typeof Deno.stdout;
  readonly #durable: boolean;
  readonly #name: string;
  readonly #enc = new TextEncoder();

  private constructor(out: Deno.FsFile | Writer | typeof Deno.stdout, durable: boolean, name: string) {
    this.#out = out;
    this.#durable = durable;
    this.#name = name;
  }

  /** Opens `target` for appending (`name`: the path as given, for messages). */
  static async open(target: OutputTarget, name: string): Promise<AppendLog> {
    try {
      if (target.kind === "stdout") return new AppendLog(Deno.stdout, false, name);
      if (target.kind === "direct") return new AppendLog(await openDirect(target.real), false, name);
      return new AppendLog(await Deno.open(target.real, { append: true, create: true }), true, name);
    } catch (e) {
      throw new K3Error(`--output: cannot open ${readProblem(name, e)}`);
    }
  }

  /** Appends `value` as one JSON line, durably for a regular file; on a failed write the partial line is cut away. */
  append(value: unknown): void {
    const bytes = this.#enc.encode(JSON.stringify(value) + "\n");
    const out = this.#out;
    if (!this.#durable || !(out instanceof Deno.FsFile)) {
      try {
        writeAllSync(out, bytes);
      } catch (e) {
        throw writeFailure(this.#name, bytes.length, e);
      }
      return;
    }
    const before = out.statSync().size;
    try {
      writeAllSync(out, bytes);
      out.syncSync();
    } catch (e) {
      try {
        out.truncateSync(before);
      } catch { /* the failure below is what matters */ }
      throw writeFailure(this.#name, bytes.length, e);
    }
  }

  /** Closes the file (never stdout). */
  close(): void {
    if (this.#out !== Deno.stdout) this.#out.close();
  }
}
