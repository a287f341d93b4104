/**
 * The one place k3 reads user files and writes its outputs.
 *
 * Inputs: the path must name a regular file (a FIFO, directory or device is refused with
 * one line, never read, so nothing hangs or reads without bound; `-` is stdin where the
 * flag documents it), no larger than its bound, and the message says what was expected.
 *
 * Outputs: `prepareOutput` checks the target before the model loads (a directory given as
 * a file, a missing or unwritable directory: exit 2) and resolves symlinks to the REAL
 * path; `writeOutput` then writes a regular file atomically beside that real path
 * (temporary file, fsync, rename, fsync of the directory), writes FIFOs and character
 * devices directly, and `-` to stdout. A failed write (ENOSPC, EIO, ...) is one line
 * naming the file and what was needed, exit 1, and the temporary file is removed.
 *
 * Fault injection for tests where no small filesystem can be mounted:
 * `K3_FAULT_WRITE_ENOSPC=N` makes every write through this module fail with ENOSPC once
 * N bytes of it have been written.
 *
 * @module
 */

import { EXIT, K3Error, usageError } from "../errors.ts";
import { readProblem } from "../paths.ts";
import { errnoText, IoWriter, pathKind } from "./io.ts";
import { testHook } from "./test_hooks.ts";

/** How to read one input. */
export interface InputOptions {
  /** What the file is, for messages ("--prompt-file", "config.json"). */
  what: string;
  /** Largest accepted size in bytes. */
  maxBytes: number;
  /** `-` reads stdin (only where the flag documents it). */
  allowStdin?: boolean;
  /** Exit code of a refusal (default 1; flags and configs use 2). */
  exitCode?: number;
}

const err = (message: string, code: number) => new K3Error(message, code);

/** What a path is, following symlinks. */
export type PathKind = "missing" | "file" | "directory" | "fifo" | "char" | "block" | "socket" | "other";

const KIND_WORDS: Record<PathKind, string> = {
  missing: "no such file",
  file: "a file",
  directory: "a directory",
  fifo: "a FIFO",
  char: "a character device",
  block: "a block device",
  socket: "a socket",
  other: "not a regular file",
};
const K3IO_KINDS: PathKind[] = ["missing", "file", "directory", "fifo", "char", "block", "socket", "other"];

/**
 * What `path` is (following symlinks). The runtime refuses to stat devices and /sys under
 * k3's permissions; those are asked of k3io (a plain stat in C), so a device or FIFO is
 * still recognised as one. Throws the OS error for anything else.
 */
export function statKind(path: string): PathKind {
  try {
    const i = Deno.statSync(path);
    if (i.isFile) return "file";
    if (i.isDirectory) return "directory";
    if (i.isFifo) return "fifo";
    if (i.isCharDevice) return "char";
    if (i.isBlockDevice) return "block";
    if (i.isSocket) return "socket";
    return "other";
  } catch (e) {
    if (e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotADirectory) return "missing";
    if (!(e instanceof Deno.errors.NotCapable)) throw e;
    const k = pathKind(path);
    if (k < 0) throw new Error(`${path}: ${errnoText(k)}`);
    return K3IO_KINDS[k] ?? "other";
  }
}

/** Words for a kind ("a FIFO", "a character device"). */
export function kindWords(k: PathKind): string {
  return KIND_WORDS[k];
}

/** Why a path is not a regular file (following symlinks), or undefined when it is one. */
export function notRegular(path: string): string | undefined {
  let k: PathKind;
  try {
    k = statKind(path);
  } catch (e) {
    return readProblem(path, e);
  }
  if (k === "file") return undefined;
  return k === "missing" ? KIND_WORDS.missing : `${KIND_WORDS[k]}, expected a regular file`;
}

/** What `path` is when it exists and is not a regular file or directory ("a FIFO"), else undefined. */
export function specialKind(path: string): string | undefined {
  try {
    const k = statKind(path);
    return k === "file" || k === "directory" || k === "missing" ? undefined : KIND_WORDS[k];
  } catch {
    return undefined;
  }
}

/** Does `path` exist as a regular file (following symlinks)? */
export function isRegularFile(path: string): boolean {
  return notRegular(path) === undefined;
}

/** Refuses (K3Error `code`) a path that is not a regular file, naming what it is. */
export function requireRegular(path: string, what: string, code: number = EXIT.runtime): void {
  const why = notRegular(path);
  if (why !== undefined) throw err(`${what}: ${path}: ${why}`, code);
}

function readAllSync(f: { readSync(p: Uint8Array): number | null }, max: number, what: string, code: number) {
  const chunks: Uint8Array[] = [];
  let total = 0;
  while (true) {
    const buf = new Uint8Array(Math.min(1 << 20, max + 1 - total) || 1);
    const n = f.readSync(buf);
    if (n === null || n === 0) break;
    total += n;
    if (total > max) throw err(`${what}: larger than ${max} bytes`, code);
    chunks.push(buf.subarray(0, n));
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/**
 * Refuses (K3Error `code`, one line naming `what`) an input path that is not a regular
 * file, from its stat alone: a FIFO is never opened (an open would wait for a writer,
 * and no signal could end k3 meanwhile), a device or directory never read. A missing
 * path is refused too unless `missingOk`; `pipeOk` accepts a FIFO (a key read as one
 * bounded line, e.g. from `<(command)`).
 */
export function checkInputPath(path: string, what: string, code: number, pipeOk = false, missingOk = true): void {
  const why = notRegular(path);
  if (why === undefined || (missingOk && why === KIND_WORDS.missing)) return;
  if (pipeOk && why.startsWith(KIND_WORDS.fifo)) return;
  // A directory is said the way engine/paths.ts says it everywhere else.
  const text = why.startsWith("a directory") ? readProblem(path, new Deno.errors.IsADirectory()) : `${path}: ${why}`;
  throw err(`${what}: cannot read ${text}`, code);
}

/** Reads a user file (or stdin for `-` when allowed), checked as the module doc says. */
export function readInput(path: string, opts: InputOptions): Uint8Array {
  const code = opts.exitCode ?? EXIT.runtime;
  if (path === "-" && opts.allowStdin) return readAllSync(Deno.stdin, opts.maxBytes, `${opts.what}: stdin`, code);
  checkInputPath(path, opts.what, code, false, false);
  let f: Deno.FsFile;
  try {
    f = Deno.openSync(path, { read: true });
  } catch (e) {
    throw err(`${opts.what}: cannot read ${readProblem(path, e)}`, code);
  }
  try {
    const size = f.statSync().size;
    if (size > opts.maxBytes) {
      throw err(`${opts.what}: ${path} is ${size} bytes, at most ${opts.maxBytes} are accepted`, code);
    }
    return readAllSync(f, opts.maxBytes, `${opts.what}: ${path}`, code);
  } catch (e) {
    if (e instanceof K3Error) throw e;
    throw err(`${opts.what}: cannot read ${readProblem(path, e)}`, code);
  } finally {
    f.close();
  }
}

/**
 * The first line of a regular file or a pipe (a key file), at most `opts.maxBytes` bytes
 * before its end (a line ending in CR LF loses the CR). Opened off the main thread, so a
 * FIFO nobody writes to leaves signals working; more than the bound without a line end
 * is refused.
 */
export async function readFirstLine(path: string, opts: InputOptions): Promise<string> {
  const code = opts.exitCode ?? EXIT.runtime;
  checkInputPath(path, opts.what, code, true, false);
  let f: Deno.FsFile;
  try {
    f = await Deno.open(path, { read: true });
  } catch (e) {
    throw err(`${opts.what}: cannot read ${readProblem(path, e)}`, code);
  }
  const buf = new Uint8Array(opts.maxBytes + 1);
  let n = 0, end = -1;
  try {
    while (end < 0 && n < buf.length) {
      const got = await f.read(buf.subarray(n));
      if (got === null) break;
      end = buf.subarray(n, n + got).indexOf(10);
      if (end >= 0) end += n;
      n += got;
    }
  } catch (e) {
    throw err(`${opts.what}: cannot read ${readProblem(path, e)}`, code);
  } finally {
    f.close();
  }
  if (end < 0 && n > opts.maxBytes) throw err(`${opts.what}: ${path}: no line end within ${opts.maxBytes} bytes`, code);
  const line = buf.subarray(0, end < 0 ? n : end);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(line).replace(/\r$/, "");
  } catch {
    throw err(`${opts.what}: ${path} is not valid UTF-8`, code);
  }
}

/** Reads a user file as text (UTF-8, a leading BOM dropped; invalid UTF-8 refused). */
export function readInputText(path: string, opts: InputOptions): string {
  const bytes = readInput(path, opts);
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: false }).decode(bytes);
  } catch {
    throw err(`${opts.what}: ${path} is not valid UTF-8`, opts.exitCode ?? EXIT.runtime);
  }
}

/** Reads and parses a JSON user file; a parse error is one line naming the file (`code`). */
export function readInputJson(path: string, opts: InputOptions): unknown {
  const text = readInputText(path, opts);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw err(`${path}: invalid JSON: ${(e as Error).message}`, opts.exitCode ?? EXIT.runtime);
  }
}

/** Where an output goes, checked before the work that produces it. */
export interface OutputTarget {
  /** The path as given (for messages). */
  path: string;
  /** stdout, a FIFO or character device written directly, or a regular file written atomically. */
  kind: "stdout" | "direct" | "atomic";
  /** The real path (symlinks resolved): the file that is replaced or written. */
  real: string;
}

const dirOf = (p: string) => (p.includes("/") ? p.slice(0, p.lastIndexOf("/")) || "/" : ".");
const baseOf = (p: string) => p.slice(p.lastIndexOf("/") + 1);

/** Follows symlinks of `path` (also dangling ones: the target is where the file will be). */
function resolveLinks(path: string, flag: string): string {
  let p = path;
  for (let hops = 0; hops < 40; hops++) {
    let info: Deno.FileInfo;
    try {
      info = Deno.lstatSync(p);
    } catch {
      return p; // does not exist: this is where the file goes
    }
    if (!info.isSymlink) return p;
    const target = Deno.readLinkSync(p);
    p = target.startsWith("/") ? target : `${dirOf(p)}/${target}`;
  }
  throw usageError(`${flag}: ${path}: too many levels of symbolic links`);
}

/**
 * Checks an output path before anything is computed: `-` is stdout; an existing directory,
 * socket or block device is refused (exit 2); a FIFO or character device is written
 * directly; otherwise the real path's directory must exist and accept a new file (tried
 * by creating and removing one), since the file is written there atomically.
 */
export function prepareOutput(path: string, flag: string): OutputTarget {
  if (path === "-") return { path, kind: "stdout", real: path };
  if (path === "") throw usageError(`${flag}: empty path`);
  let kind: PathKind;
  try {
    kind = statKind(path); // follows symlinks
  } catch (e) {
    throw usageError(`${flag}: cannot write ${readProblem(path, e)}`);
  }
  // A FIFO or device (e.g. /dev/stdout, whose link chain may end in "pipe:[...]") is
  // opened by the name given; a regular file is replaced at its real path; a new file
  // (perhaps behind a dangling symlink) goes where the links lead.
  if (kind === "fifo" || kind === "char") return { path, kind: "direct", real: path };
  if (kind !== "file" && kind !== "missing") {
    throw usageError(`${flag}: ${path} is ${KIND_WORDS[kind]}, expected a file to write`);
  }
  const real = kind === "file" ? Deno.realPathSync(path) : resolveLinks(path, flag);
  const dir = dirOf(real);
  let d: Deno.FileInfo;
  try {
    d = Deno.statSync(dir);
  } catch {
    throw usageError(`${flag}: cannot write ${path}: directory ${dir} does not exist`);
  }
  if (!d.isDirectory) throw usageError(`${flag}: cannot write ${path}: ${dir} is not a directory`);
  const probe = `${dir}/.${baseOf(real)}.k3-probe-${Deno.pid}`;
  try {
    Deno.writeFileSync(probe, new Uint8Array(0), { createNew: true });
    Deno.removeSync(probe);
  } catch (e) {
    throw usageError(`${flag}: cannot write ${path}: directory ${dir} is not writable (${(e as Error).message})`);
  }
  return { path, kind: "atomic", real };
}

let injectedBytes = 0;
/** Writes all of `data` to `f`, honouring the test fault injection. */
export function writeAllSync(f: { writeSync(p: Uint8Array): number }, data: Uint8Array): void {
  const limit = testHook("K3_FAULT_WRITE_ENOSPC");
  let off = 0;
  while (off < data.length) {
    let chunk = data.subarray(off);
    if (limit !== undefined) {
      const room = Number(limit) - injectedBytes;
      if (room <= 0) throw new Error("No space left on device (os error 28) [injected]");
      chunk = chunk.subarray(0, room);
    }
    const n = f.writeSync(chunk);
    injectedBytes += n;
    off += n;
  }
}

/** One line for a failed write of `bytes` to `path`, saying what is needed. */
export function writeFailure(path: string, bytes: number, e: unknown): K3Error {
  const msg = (e as Error)?.message ?? String(e);
  const full = /no space left|os error 28|ENOSPC|quota|os error 122/i.test(msg);
  return new K3Error(
    full
      ? `cannot write ${path}: no space left on the device (${bytes} bytes needed); free some space or choose another path`
      : `cannot write ${path}: ${msg}`,
    EXIT.runtime,
  );
}

/** Something written sequentially and closed. */
export interface Writer {
  /** Writes some of `p`; returns how many bytes. */
  writeSync(p: Uint8Array): number;
  /** Closes it. */
  close(): void;
}

/**
 * Opens a FIFO or device for writing: through the runtime when it may, else through k3io
 * (the runtime refuses devices such as /dev/full under k3's permissions).
 */
export async function openDirect(path: string): Promise<Writer> {
  try {
    return await Deno.open(path, { write: true });
  } catch (e) {
    if (!(e instanceof Deno.errors.NotCapable)) throw e;
    return IoWriter.open(path);
  }
}

/**
 * Creates `path` (it must not exist), writes `bytes` and fsyncs it; throws the OS error
 * (the caller names the file and removes it).
 */
export function writeFileDurable(path: string, bytes: Uint8Array, mode = 0o644): void {
  const f = Deno.openSync(path, { write: true, createNew: true, mode });
  try {
    writeAllSync(f, bytes);
    f.syncSync();
  } finally {
    f.close();
  }
}

/** Writes `data` to a prepared target (see the module doc). */
export async function writeOutput(t: OutputTarget, data: Uint8Array | string): Promise<void> {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  if (t.kind === "stdout") {
    try {
      writeAllSync(Deno.stdout, bytes);
    } catch (e) {
      throw writeFailure("stdout", bytes.length, e);
    }
    return;
  }
  if (t.kind === "direct") {
    let f: Writer | undefined;
    try {
      f = await openDirect(t.real);
      writeAllSync(f, bytes);
    } catch (e) {
      throw writeFailure(t.path, bytes.length, e);
    } finally {
      f?.close();
    }
    return;
  }
  const dir = dirOf(t.real);
  const tmp = `${dir}/.${baseOf(t.real)}.k3-tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  try {
    let mode = 0o644;
    try {
      mode = (Deno.statSync(t.real).mode ?? 0o100644) & 0o7777;
    } catch { /* new file */ }
    writeFileDurable(tmp, bytes, mode);
    await Deno.rename(tmp, t.real);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw writeFailure(t.path, bytes.length, e);
  }
  try {
    // The rename is durable once the directory is synced (not possible everywhere).
    const d = await Deno.open(dir, { read: true });
    try {
      d.syncSync();
    } finally {
      d.close();
    }
  } catch { /* best effort */ }
}
