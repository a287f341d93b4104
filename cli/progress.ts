/**
 * Progress of long phases (indexing shards, pinning layers, packing, batches) on stderr:
 * one self-overwriting line with rate and ETA, only when stderr is a terminal, at most
 * ~8 updates a second. Logs and pipes stay clean.
 *
 *     progress("pack", layersDone, layers, bytesDone);
 *
 * @module
 */

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
  const line = progressLine(label, done, total, (now - p.start) / 1000, bytes);
  try {
    Deno.stderr.writeSync(enc.encode(`\r\x1b[K${line}${finished ? "\n" : ""}`));
  } catch { /* stderr closed: progress is best effort */ }
  if (finished) phases.delete(label);
}
