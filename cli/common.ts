/**
 * Pieces every subcommand shares: strict flag parsing with one-line usage errors, number
 * and id-list parsing, atomic file writes and peak RSS.
 *
 * @module
 */

import { parseArgs, type ParseArgsConfig } from "node:util";
import { usageError } from "../engine/errors.ts";

/** parseArgs in strict mode; its errors become one-line usage errors (exit 2). */
export function parseFlags<T extends ParseArgsConfig["options"]>(
  cmd: string,
  args: string[],
  options: T,
  allowPositionals = true,
) {
  try {
    // tokens: flags whose order matters (memory budgets) are applied in command-line order.
    return parseArgs({ args, options, strict: true, allowPositionals, tokens: true });
  } catch (e) {
    // node:util messages are multi-line with hints; keep the first line.
    const msg = (e as Error).message.split("\n")[0].replace(/\. To specify a positional.*$/, "");
    throw usageError(`${cmd}: ${msg}`);
  }
}

/** An integer flag in [min, max], or a usage error naming the flag. */
export function intFlag(name: string, value: string | undefined, dflt: number, min: number, max: number): number {
  if (value === undefined) return dflt;
  if (!/^-?\d+$/.test(value.trim())) throw usageError(`--${name}: expected an integer, got ${JSON.stringify(value)}`);
  const n = Number(value);
  if (n < min || n > max) throw usageError(`--${name}: ${n} is out of range ${min}..${max}`);
  return n;
}

/** A non-negative number flag (fractions allowed), or a usage error. */
export function numFlag(name: string, value: string, min: number, max: number): number {
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n)) {
    throw usageError(`--${name}: expected a number, got ${JSON.stringify(value)}`);
  }
  if (n < min || n > max) throw usageError(`--${name}: ${n} is out of range ${min}..${max}`);
  return n;
}

/** Parses "1,2,3" into ids in [0, vocab); usage error otherwise. */
export function parseIds(flag: string, text: string, vocab?: number): number[] {
  const parts = text.split(",").map((s) => s.trim());
  if (parts.length === 0 || parts.some((p) => !/^\d+$/.test(p))) {
    throw usageError(`--${flag}: expected comma-separated token ids, got ${JSON.stringify(text)}`);
  }
  const ids = parts.map(Number);
  if (vocab !== undefined) {
    const bad = ids.find((id) => id >= vocab);
    if (bad !== undefined) throw usageError(`--${flag}: id ${bad} is outside the vocabulary (0..${vocab - 1})`);
  }
  return ids;
}

/** Writes a file atomically: a temporary sibling, then rename. */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const tmp = `${path}.tmp-${Deno.pid}-${Date.now()}`;
  try {
    if (typeof data === "string") await Deno.writeTextFile(tmp, data);
    else await Deno.writeFile(tmp, data);
    await Deno.rename(tmp, path);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
}

/** Peak resident set size of this process, from the OS (VmHWM), or current RSS. */
export function peakRssBytes(): number {
  try {
    const status = Deno.readTextFileSync("/proc/self/status");
    const m = status.match(/^VmHWM:\s+(\d+)\s+kB/m);
    if (m) return Number(m[1]) * 1024;
  } catch {
    // not Linux: fall through
  }
  return Deno.memoryUsage().rss;
}

/** Human-readable bytes. */
export function fmtBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}
