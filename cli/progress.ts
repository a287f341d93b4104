/**
 * Progress of long phases (indexing shards, pinning layers, packing, batches) on stderr:
 * one self-overwriting line with rate and ETA, only when stderr is a terminal, at most
 * ~8 updates a second. Logs and pipes stay clean.
 *
 *     progress("pack", layersDone, layers, bytesDone);
 *
 * @module
 */

import { usageError } from "../engine/errors.ts";

/** State of one labelled phase. */
interface Phase {
  start: number;
  lastPrint: number;
  lastDone: number;
}

const phases = new Map<string, Phase>();
const MIN_INTERVAL_MS = 125;
let enabledOverride: boolean | undefined;

/** Forces progress output on or off (undefined: only when stderr is a terminal). */
export function setProgressEnabled(on: boolean | undefined): void {
  enabledOverride = on;
}

/** Whether progress lines are on (forced, or stderr is a terminal). */
export function isProgressEnabled(): boolean {
  return enabled();
}

function enabled(): boolean {
  if (enabledOverride !== undefined) return enabledOverride;
  try {
    return Deno.stderr.isTerminal();
  } catch {
    return false;
  }
}

/** Seconds as "42 s", "3 min 05 s", "2 h 04 min". */
export function fmtDuration(s: number): string {
  if (!Number.isFinite(s) || s < 0) return "?";
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** The text of a progress line (without the carriage return): done/total, %, rate, ETA. */
export function progressLine(
  label: string,
  done: number,
  total: number,
  elapsedSeconds: number,
  bytes?: number,
): string {
  const pct = total > 0 ? (100 * done) / total : 100;
  const parts = [`${label}: ${done}/${total} (${pct.toFixed(pct < 10 ? 1 : 0)}%)`];
  if (elapsedSeconds > 0 && done > 0) {
    if (bytes !== undefined) parts.push(`${(bytes / 1e6 / elapsedSeconds).toFixed(1)} MB/s`);
    else parts.push(`${(done / elapsedSeconds).toFixed(done / elapsedSeconds < 10 ? 2 : 0)}/s`);
    if (done < total) parts.push(`ETA ${fmtDuration((elapsedSeconds * (total - done)) / done)}`);
    else parts.push(`in ${fmtDuration(elapsedSeconds)}`);
  }
  return parts.join(", ");
}

const enc = new TextEncoder();

/**
 * Reports that `done` of `total` units of the phase `label` are finished (`bytes`: bytes
 * processed so far, shown as a rate). The first call (or done going backwards) starts the
 * clock; done === total ends the line.
 */
export function progress(label: string, done: number, total: number, bytes?: number): void {
  if (!enabled()) return;
  const now = performance.now();
  let p = phases.get(label);
  if (!p || done < p.lastDone) {
    p = { start: now, lastPrint: 0, lastDone: done };
    phases.set(label, p);
  }
  p.lastDone = done;
  const finished = done >= total;
  if (!finished && now - p.lastPrint < MIN_INTERVAL_MS) return;
  p.lastPrint = now;
  const elapsed = (now - p.start) / 1000;
  const line = progressLine(label, done, total, elapsed, bytes);
  try {
    // A phase done within a second leaves no line behind (a tiny model's load is not news).
    const text = finished && elapsed < 1 ? "\r\x1b[K" : `\r\x1b[K${line}${finished ? "\n" : ""}`;
    Deno.stderr.writeSync(enc.encode(text));
  } catch { /* stderr closed: progress is best effort */ }
  if (finished) phases.delete(label);
}

/** The prefill (prompt eval) progress line: tokens, chunks, tokens/s, ETA. */
export function prefillLine(done: number, total: number, chunk: number, elapsedSeconds: number): string {
  const chunks = Math.ceil(total / Math.max(chunk, 1));
  const parts = [`prefill: ${done}/${total} tokens (chunk ${Math.ceil(done / Math.max(chunk, 1))}/${chunks})`];
  if (elapsedSeconds > 0 && done > 0) {
    const rate = done / elapsedSeconds;
    parts.push(`${rate.toFixed(rate < 10 ? 2 : 0)} tokens/s`);
    parts.push(done < total ? `ETA ${fmtDuration((total - done) / rate)}` : `in ${fmtDuration(elapsedSeconds)}`);
  }
  return parts.join(", ");
}

/** Where prefill progress goes and how often (injectable for tests). */
export interface PrefillSink {
  /** A terminal: one self-overwriting line, ~8 updates a second. */
  terminal: boolean;
  /** Writes progress text (carriage returns included on a terminal). */
  write(text: string): void;
  /** Milliseconds on a monotonic clock. */
  now(): number;
}

/** Lines every this many seconds when stderr is not a terminal (logs stay short). */
const LOG_INTERVAL_S = 5;

/**
 * A prefill progress reporter for the scheduler's `onPrefill(done, total)`: on a terminal
 * a self-overwriting line; otherwise a plain line every 5 s, so a long prompt in a log is
 * never minutes of silence. Short prefills print nothing off a terminal.
 */
export function prefillProgress(chunk: number, sink?: PrefillSink): (done: number, total: number) => void {
  if (!sink && verbosity === "quiet") return () => {};
  const show = throttledLine(sink ?? stderrSink());
  return (done, total) => show((elapsed) => prefillLine(done, total, chunk, elapsed), done >= total);
}

/** Prefill passes of at least this many rows report each layer (a shorter one is quick). */
export const LAYER_PROGRESS_ROWS = 64;

/** What the layer line of a long prefill says. */
export interface LayerLine {
  /** The layer just finished (0-based). */
  layer: number;
  /** The model's layers. */
  layers: number;
  /** The segment running (1-based). */
  segment: number;
  /** The prompt's segments. */
  segments: number;
  /** Prompt tokens through this segment. */
  tokens: number;
  /** Prompt tokens in all. */
  total: number;
  /** Bytes read from disk since the prefill started. */
  bytesRead: number;
  /** Seconds since the segment started. */
  segmentSeconds: number;
}

/** The layer-major prefill line: layer L of N of segment s of S, tokens, bytes read, ETA
 * (the segment's pace per layer, carried to the segments left). */
export function prefillLayerLine(p: LayerLine): string {
  const done = p.layer + 1;
  const perLayer = p.segmentSeconds / done;
  const eta = perLayer * (p.layers - done) + perLayer * p.layers * (p.segments - p.segment);
  return `prefill: layer ${done}/${p.layers} of segment ${p.segment}/${p.segments} (${p.tokens}/${p.total} tokens), ${
    fmtBytes(p.bytesRead)
  } read, ${
    done < p.layers || p.segment < p.segments ? `ETA ${fmtDuration(eta)}` : `in ${fmtDuration(p.segmentSeconds)}`
  }`;
}

/**
 * A per-layer progress reporter for K3Model.onLayer during a prefill of `total` tokens in
 * segments of `chunk`: passes of fewer than LAYER_PROGRESS_ROWS rows (decode, short
 * prompts) say nothing; `bytesRead` is the weight source's bytes read so far.
 */
export function layerProgress(
  total: number,
  chunk: number,
  bytesRead: () => number,
  sink?: PrefillSink,
): (p: { layer: number; layers: number; rows: number; seconds: number }) => void {
  if (!sink && verbosity === "quiet") return () => {};
  const show = throttledLine(sink ?? stderrSink());
  const segments = Math.max(1, Math.ceil(total / Math.max(chunk, 1)));
  const bytes0 = bytesRead();
  let segment = 0, tokens = 0;
  return (p) => {
    if (p.rows < LAYER_PROGRESS_ROWS) return;
    if (p.layer === 0) {
      segment++;
      tokens = Math.min(total, tokens + p.rows);
    }
    const line: LayerLine = {
      ...p,
      segment,
      segments: Math.max(segments, segment),
      tokens,
      total,
      bytesRead: bytesRead() - bytes0,
      segmentSeconds: p.seconds,
    };
    show(() => prefillLayerLine(line), p.layer + 1 === p.layers && segment >= segments);
  };
}

/** Decimal bytes as "12.3 MB" (progress lines). */
function fmtBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  return `${(n / 1e3).toFixed(1)} kB`;
}

/** Progress text on stderr (best effort). */
function stderrSink(): PrefillSink {
  return {
    terminal: enabled(),
    write: (t) => {
      try {
        Deno.stderr.writeSync(enc.encode(t));
      } catch { /* best effort */ }
    },
    now: () => performance.now(),
  };
}

/**
 * One progress line at a time on `out`: on a terminal a self-overwriting line, ~8 updates a
 * second; otherwise a plain line every 5 s (and the finished one, if any was printed).
 * `text` gets the seconds since the first call.
 */
function throttledLine(out: PrefillSink): (text: (elapsed: number) => string, finished: boolean) => void {
  const start = out.now();
  let last = start;
  let printed = false;
  return (text, finished) => {
    const now = out.now(), elapsed = (now - start) / 1000;
    if (out.terminal) {
      if (!finished && now - last < MIN_INTERVAL_MS) return;
      last = now;
      out.write(`\r\x1b[K${text(elapsed)}${finished ? "\n" : ""}`);
      return;
    }
    if ((now - last) / 1000 >= LOG_INTERVAL_S || (finished && printed)) {
      last = now;
      printed = true;
      out.write(`k3: ${text(elapsed)}\n`);
    }
  };
}

/** How much k3 says on stderr: errors only, the default, or everything (the per-step table). */
export type Verbosity = "quiet" | "normal" | "verbose";

let verbosity: Verbosity = "normal";

/** Sets what `info` and the progress lines print (`--quiet`, `--verbose`). */
export function setVerbosity(v: Verbosity): void {
  verbosity = v;
  if (v === "quiet") setProgressEnabled(false);
}

/** A status line on stderr (plans, timings, summaries), silenced by --quiet; errors and
 * warnings use console.error directly. */
export function info(line: string): void {
  if (verbosity !== "quiet") console.error(line);
}

/** What the output flags decided. */
export interface OutputMode {
  /** Errors only, the default, or everything. */
  verbosity: Verbosity;
  /** Print the per-step table on stderr. */
  stepTable: boolean;
  /** Use ANSI colours on stdout. */
  color: boolean;
}

function isTerminal(f: { isTerminal(): boolean }): boolean {
  try {
    return f.isTerminal();
  } catch {
    return false;
  }
}

/** NO_COLOR (https://no-color.org): set and not empty means no colours. An environment k3 may
 * not read counts as unset. */
export function noColorEnv(): boolean {
  try {
    return (Deno.env.get("NO_COLOR") ?? "") !== "";
  } catch {
    return false;
  }
}

/**
 * The output mode from the flags (`quiet`, `verbose`, `color` as parsed) and where stdout and
 * stderr go: like llama-cli, the step table is for logs and --verbose, not a terminal where
 * it would interleave with the text. Sets the verbosity `info` and progress use.
 */
export function outputMode(
  values: { quiet?: boolean; verbose?: boolean; color?: string },
  where = { stdout: isTerminal(Deno.stdout), stderr: isTerminal(Deno.stderr) },
  noColor = noColorEnv(),
): OutputMode {
  if (values.quiet && values.verbose) throw usageError("--quiet and --verbose conflict: choose one");
  const when = values.color ?? "auto";
  if (!["auto", "always", "never"].includes(when)) {
    throw usageError(`--color: expected auto, always or never, got ${JSON.stringify(when)}`);
  }
  const v: Verbosity = values.quiet ? "quiet" : values.verbose ? "verbose" : "normal";
  setVerbosity(v);
  return {
    verbosity: v,
    stepTable: v === "verbose" || (v === "normal" && !where.stderr),
    color: when === "always" || (when === "auto" && where.stdout && !noColor),
  };
}

/** Bytes as "1.56 TB", "113.5 GB", "3.1 MB" (decimal units, as disks are sold). */
export function fmtSize(n: number): string {
  if (Math.abs(n) >= 1e12) return `${(n / 1e12).toFixed(2)} TB`;
  if (Math.abs(n) >= 1e9) return `${(n / 1e9).toFixed(1)} GB`;
  if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (Math.abs(n) >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}

/**
 * One line of a byte transfer: `label: done / total (pct), rate, ETA`. `rate` is bytes a
 * second over the network (undefined or 0 before there is one); the ETA is what is left at
 * that rate.
 */
export function transferLine(label: string, done: number, total: number, rate?: number): string {
  const pct = total > 0 ? (100 * done) / total : 100;
  const parts = [`${label}: ${fmtSize(done)} / ${fmtSize(total)} (${pct.toFixed(pct < 10 ? 1 : 0)}%)`];
  if (rate && rate > 0) {
    parts.push(`${fmtSize(rate)}/s`);
    if (done < total) parts.push(`ETA ${fmtDuration((total - done) / rate)}`);
  }
  return parts.join(", ");
}
