/**
 * Pieces every subcommand shares: strict flag parsing with one-line usage errors, number
 * and id-list parsing, atomic file writes and peak RSS.
 *
 * @module
 */

import process from "node:process";
import { prepareOutput, writeOutput } from "../engine/native/files.ts";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { usageError } from "../engine/errors.ts";

/** Edit distance (insertions, deletions, substitutions, adjacent swaps), for suggestions. */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.length][b.length];
}

/** The candidate nearest to `word` when it is near enough to be a likely typo (or `word`
 * is a prefix of exactly one candidate), else undefined. */
export function nearest(word: string, candidates: Iterable<string>): string | undefined {
  const list = [...candidates];
  const prefixed = list.filter((c) => word.length >= 2 && c.startsWith(word));
  if (prefixed.length === 1) return prefixed[0];
  let best: string | undefined, bestD = Infinity;
  for (const c of list) {
    const dist = editDistance(word, c);
    if (dist < bestD) [best, bestD] = [c, dist];
  }
  return bestD <= Math.max(1, Math.min(3, Math.floor(word.length / 3))) ? best : undefined;
}

/** " (did you mean X?)" or "", for error messages. */
export function didYouMean(word: string, candidates: Iterable<string>, prefix = ""): string {
  const n = nearest(word, candidates);
  return n === undefined ? "" : ` (did you mean ${prefix}${n}?)`;
}

/** What -ngl and its kin mean on a CPU: the memory budget. */
const MEMORY_HINT =
  "k3 runs on the CPU: the memory it uses is --preset NAME (k3 presets), or --trunk-gb and --cache-gb";

/**
 * Flags people bring from llama.cpp and ollama, and what k3 calls them: an unknown one gets
 * this as its suggestion. `-p`, `-n` and `-t` are also k3's own short aliases (of --prompt,
 * --gen, --threads) wherever the command has that flag; `-m` and `-c` are not (k3 takes the
 * model directory as its first argument, and `-c` means a config file elsewhere).
 */
export const HABITS: Record<string, { flag: string; hint?: string }> = {
  "-p": { flag: "prompt" },
  "-n": { flag: "gen" },
  "-t": { flag: "threads" },
  "-c": { flag: "context" },
  "-m": { flag: "", hint: "the model directory is the first argument: k3 run MODEL_DIR --prompt TEXT" },
  "--model": { flag: "", hint: "the model directory is the first argument: k3 run MODEL_DIR --prompt TEXT" },
  "--ctx-size": { flag: "context" },
  "--n-predict": { flag: "gen" },
  "--predict": { flag: "gen" },
  "--temp": { flag: "temperature" },
  "--file": { flag: "prompt-file" },
  "--system-prompt": { flag: "system" },
  "--num-ctx": { flag: "context" },
  "-ngl": { flag: "", hint: MEMORY_HINT },
  "--n-gpu-layers": { flag: "", hint: MEMORY_HINT },
  "--gpu-layers": { flag: "", hint: MEMORY_HINT },
  "-cnv": { flag: "", hint: "a conversation is its own command: k3 chat MODEL_DIR" },
  "--conversation": { flag: "", hint: "a conversation is its own command: k3 chat MODEL_DIR" },
  "--think": { flag: "no-think" },
};

/** The habit suggestion for an unknown flag `arg` of a command with `flags`, or "". */
export function habitHint(arg: string, flags: readonly string[]): string {
  const h = HABITS[arg.replace(/=.*$/, "")];
  if (!h) return "";
  if (h.hint) return ` (${h.hint})`;
  return flags.includes(h.flag) ? ` (k3 calls it --${h.flag})` : "";
}

/** What parseFlags returns: parseArgs' result with tokens, for `options`. */
export type ParsedFlags<T extends ParseArgsConfig["options"]> = ReturnType<
  typeof parseArgs<{ args: string[]; options: T; strict: true; allowPositionals: boolean; tokens: true }>
>;

/**
 * parseArgs in strict mode, with errors a user can act on (one line, exit 2): an unknown
 * flag names the nearest known one and points at `k3 <cmd> --help`; a flag given twice is
 * refused unless it is `multiple` or in `lastWins` (flags documented as "a later one
 * overrides an earlier one", the memory budget); a string flag's value may be negative
 * (`--trunk-gb -1` reaches the range check instead of "argument is ambiguous").
 */
export function parseFlags<T extends ParseArgsConfig["options"]>(
  cmd: string,
  args: string[],
  options: T,
  allowPositionals = true,
  lastWins: ReadonlySet<string> = new Set(),
): ParsedFlags<T> {
  const opts = (options ?? {}) as Record<string, { type: string; short?: string; multiple?: boolean }>;
  const help = `see k3 ${cmd} --help`;
  const shorts = new Map(Object.entries(opts).flatMap(([n, o]) => (o.short ? [[o.short, n] as const] : [])));
  const joined: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === "--") {
      joined.push(...args.slice(i));
      break;
    }
    const long = a.match(/^--([^=]+)(=.*)?$/);
    const name = long ? long[1] : /^-[^-\d]/.test(a) && a.length === 2 ? shorts.get(a[1]) : undefined;
    if (long && !Object.hasOwn(opts, long[1])) {
      const hint = habitHint(a, Object.keys(opts)) || didYouMean(long[1], Object.keys(opts), "--");
      throw usageError(`${cmd}: unknown option --${long[1]}${hint}; ${help}`);
    }
    if (!long && /^-[^-\d]/.test(a) && !name) {
      // `-ngl` is llama.cpp's own flag, not -n with "gl": the whole word's habit first.
      const hint = habitHint(a, Object.keys(opts)) || habitHint(a.slice(0, 2), Object.keys(opts));
      throw usageError(`${cmd}: unknown option ${a}${hint}; ${help}`);
    }
    // A string flag followed by a negative number: pass it as --flag=-1 so that the value
    // reaches the flag's own range check.
    if (name && !long?.[2] && opts[name].type === "string" && /^-\d/.test(args[i + 1] ?? "")) {
      joined.push(`--${name}=${args[++i]}`);
      continue;
    }
    joined.push(a);
  }
  let parsed;
  try {
    // tokens: flags whose order matters (memory budgets) are applied in command-line order.
    parsed = parseArgs({ args: joined, options, strict: true, allowPositionals, tokens: true });
  } catch (e) {
    // node:util messages are multi-line with hints; keep the first line.
    const msg = (e as Error).message.split("\n")[0].replace(/\. To specify a positional.*$/, "")
      .replace(/'-\w, (--[\w-]+)/, "'$1");
    throw usageError(`${cmd}: ${msg}; ${help}`);
  }
  const seen = new Map<string, number>();
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== "option") continue;
    seen.set(t.name, (seen.get(t.name) ?? 0) + 1);
    if (seen.get(t.name) === 2 && !opts[t.name]?.multiple && !lastWins.has(t.name)) {
      throw usageError(`${cmd}: --${t.name} given more than once; give it once (${help})`);
    }
  }
  return parsed;
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

/**
 * Writes a file atomically through engine/native/files.ts: checked, then temp + fsync +
 * rename beside the real path (symlinks followed; FIFOs and devices written directly).
 * Commands should prefer prepareOutput before their work and writeOutput after it.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  await writeOutput(prepareOutput(path, "output"), data);
}

/** Peak resident set size of this process from the OS (getrusage ru_maxrss, the same as
 * VmHWM; /proc/self/status would need --allow-all), or the current RSS. */
export function peakRssBytes(): number {
  try {
    const kb = process.resourceUsage().maxRSS;
    if (kb > 0) return kb * 1024;
  } catch {
    // no getrusage here: fall through
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

/** `word` for one, `word`s (or `many`) otherwise: "1 prompt", "2 prompts". */
export function plural(n: number, word: string, many = `${word}s`): string {
  return n === 1 ? word : many;
}

/**
 * The one `<model_dir>` of a command's positionals, or a usage error that says what to do: a
 * second word is most often a prompt typed as in `ollama run MODEL "text"`, so it names
 * the flag that takes it.
 */
export function modelDirArg(cmd: string, positionals: string[], textFlag?: string): string {
  if (positionals.length === 1) return positionals[0];
  if (positionals.length === 0) {
    throw usageError(`${cmd}: expected exactly one <model_dir> (k3 ${cmd} MODEL_DIR ...; see k3 ${cmd} --help)`);
  }
  const extra = positionals.slice(1).join(" ");
  throw usageError(
    `${cmd}: expected exactly one <model_dir>, got also ${JSON.stringify(extra)}` +
      (textFlag
        ? `; to give it as the ${textFlag.replace(/^--/, "")}: k3 ${cmd} ${positionals[0]} ${textFlag} ${
          JSON.stringify(extra)
        }`
        : `; see k3 ${cmd} --help`),
  );
}
