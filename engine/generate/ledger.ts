/**
 * The ledger of a run: where its wall-clock seconds went, and what it read.
 *
 * Take a `LedgerMark` before and after the work; `ledgerBetween` turns the difference into
 * the report's `ledger` object, whose `*_seconds` fields add up to the wall clock (the
 * remainder is `other_seconds`), with the bytes read by kind and the bandwidth reads
 * achieved while at least one was in flight.
 *
 * @module
 */

import type { K3Model } from "../model/model.ts";
import type { Ledger } from "../model/ledger.ts";
import type { IoStats } from "../model/weight_source.ts";
import { readActivity } from "../native/io.ts";

/** The counters at one moment. */
export interface LedgerMark {
  /** performance.now() in milliseconds. */
  at: number;
  /** The model's ledger. */
  ledger: Ledger;
  /** The weight source's I/O counters (streamed weights only). */
  io?: IoStats;
  /** Bytes read by the I/O layer so far. */
  readBytes: number;
  /** Seconds with a read in flight so far. */
  readBusySeconds: number;
}

/** The ledger as reports write it (snake_case, seconds and bytes). */
export interface LedgerReport {
  /** Wall clock of the span. */
  wall_seconds: number;
  /** Waiting for trunk layers to be read. */
  trunk_read_wait_seconds: number;
  /** Waiting for routed experts to be read. */
  expert_read_wait_seconds: number;
  /** Dense matrix products. */
  dense_matmul_seconds: number;
  /** Routed and shared expert products. */
  expert_compute_seconds: number;
  /** KDA and MLA recurrences and attention. */
  attention_seconds: number;
  /** Final norm and lm_head. */
  head_seconds: number;
  /** Choosing tokens from logits. */
  sampling_seconds: number;
  /** Copying states into and out of the state cache, reading its spill files. */
  state_cache_seconds: number;
  /** The rest of the wall clock (norms, residuals, bookkeeping). */
  other_seconds: number;
  /** Trunk bytes read in the span. */
  trunk_bytes_read: number;
  /** Expert bytes read in the span. */
  expert_bytes_read: number;
  /** Prompt tokens restored from the state cache in the span instead of prefilled. */
  cached_tokens: number;
  /** The passes' seconds and rows split by what they did: prefill (a pass with some prompt
   * rows) or decode only. Beside the kinds of time above, not part of their sum. */
  passes: { prefill_seconds: number; prefill_rows: number; decode_seconds: number; decode_rows: number };
  /** `attention_seconds` split by layer kind: KDA (linear in the prompt) and MLA (attention
   * over the cache, quadratic). Inside `attention_seconds`, not added to the sum again. */
  attention_parts: { kda_seconds: number; mla_seconds: number };
  /** Bytes / seconds with a read in flight (null when nothing was read). */
  read_bytes_per_second_in_flight: number | null;
  /** Bytes the trunk read took on disk (fewer than `trunk_bytes_read` when split-coded). */
  trunk_bytes_stored: number;
  /** CPU seconds the I/O threads spent decoding coded trunk pieces: beside the wall clock, not
   * part of its sum (the decode overlaps the forward pass), so not named `*_seconds`. */
  trunk_decode_cpu: number;
  /** Of `trunk_bytes_stored`, those left coded for the bf16 products to decode (their decode
   * is inside `dense_matmul_seconds`). */
  trunk_bytes_left_coded: number;
}

/**
 * Seconds with a read in flight so far, counting the interval still open now: a read the
 * trunk ring issued during the load and still running when the run starts is split at the
 * mark instead of being counted whole on one side.
 */
export function readBusyNow(): number {
  const open = readActivity.inflight > 0 ? (performance.now() - readActivity.since) / 1000 : 0;
  return readActivity.busySeconds + open;
}

/** The counters of `model` now. */
export function markLedger(model: K3Model): LedgerMark {
  return {
    at: performance.now(),
    ledger: { ...model.ledger },
    io: model.weights.ioStats?.(),
    readBytes: readActivity.bytes,
    readBusySeconds: readBusyNow(),
  };
}

/** What happened between two marks. */
export function ledgerBetween(a: LedgerMark, b: LedgerMark): LedgerReport {
  const d = (k: keyof Ledger) => b.ledger[k] - a.ledger[k];
  const wall = (b.at - a.at) / 1000;
  const parts = {
    trunk_read_wait_seconds: d("trunkReadWait"),
    expert_read_wait_seconds: d("expertReadWait"),
    dense_matmul_seconds: d("denseMatmul"),
    expert_compute_seconds: d("expertCompute"),
    attention_seconds: d("attention"),
    head_seconds: d("head"),
    sampling_seconds: d("sampling"),
    state_cache_seconds: d("stateCache"),
  };
  const busy = b.readBusySeconds - a.readBusySeconds;
  const bytes = b.readBytes - a.readBytes;
  return {
    wall_seconds: wall,
    ...parts,
    other_seconds: wall - Object.values(parts).reduce((x, y) => x + y, 0),
    trunk_bytes_read: (b.io?.trunkBytes ?? 0) - (a.io?.trunkBytes ?? 0),
    expert_bytes_read: (b.io?.expertBytes ?? 0) - (a.io?.expertBytes ?? 0),
    cached_tokens: d("cachedTokens"),
    attention_parts: {
      kda_seconds: d("attention") - d("mlaAttention"),
      mla_seconds: d("mlaAttention"),
    },
    passes: {
      prefill_seconds: d("prefillPassSeconds"),
      prefill_rows: d("prefillPassRows"),
      decode_seconds: d("decodePassSeconds"),
      decode_rows: d("decodePassRows"),
    },
    read_bytes_per_second_in_flight: busy > 0 ? bytes / busy : null,
    trunk_bytes_stored: (b.io?.trunkStoredBytes ?? 0) - (a.io?.trunkStoredBytes ?? 0),
    trunk_decode_cpu: (b.io?.trunkDecodeSeconds ?? 0) - (a.io?.trunkDecodeSeconds ?? 0),
    trunk_bytes_left_coded: (b.io?.trunkCodedBytes ?? 0) - (a.io?.trunkCodedBytes ?? 0),
  };
}

/** Bytes read by the I/O layer between two marks, and the seconds with a read in flight. */
export function readsBetween(a: LedgerMark, b: LedgerMark): { bytes: number; busySeconds: number } {
  return { bytes: b.readBytes - a.readBytes, busySeconds: b.readBusySeconds - a.readBusySeconds };
}

/** The ledger as a table for stderr, one line per kind of time. */
export function formatLedger(l: LedgerReport): string[] {
  const rows: [string, number][] = [
    ["trunk read wait", l.trunk_read_wait_seconds],
    ["expert read wait", l.expert_read_wait_seconds],
    ["dense matmul", l.dense_matmul_seconds],
    ["expert compute", l.expert_compute_seconds],
    ["attention (KDA, MLA)", l.attention_seconds],
    ["head", l.head_seconds],
    ["sampling", l.sampling_seconds],
    ...(l.state_cache_seconds > 0 ? [["state cache", l.state_cache_seconds] as [string, number]] : []),
    ["other", l.other_seconds],
  ];
  const pct = (s: number) => (100 * s / Math.max(l.wall_seconds, 1e-9)).toFixed(1).padStart(5);
  const lines = [`ledger (wall ${l.wall_seconds.toFixed(3)} s):`];
  for (const [name, s] of rows) lines.push(`  ${name.padEnd(22)} ${s.toFixed(3).padStart(9)} s  ${pct(s)}%`);
  const gb = (n: number) => (n / 1e9).toFixed(3);
  const p = l.passes;
  lines.push(
    `  attention by kind: KDA ${l.attention_parts.kda_seconds.toFixed(3)} s, MLA ${
      l.attention_parts.mla_seconds.toFixed(3)
    } s (over the cache: grows with the square of the prompt)`,
  );
  lines.push(
    `  passes: prefill ${p.prefill_seconds.toFixed(3)} s for ${p.prefill_rows} rows, decode ${
      p.decode_seconds.toFixed(3)
    } s for ${p.decode_rows} rows`,
  );
  lines.push(
    `  read ${gb(l.trunk_bytes_read)} GB trunk + ${gb(l.expert_bytes_read)} GB experts` +
      (l.read_bytes_per_second_in_flight === null
        ? ""
        : `, ${(l.read_bytes_per_second_in_flight / 1e9).toFixed(2)} GB/s while reads were in flight`),
  );
  if (l.trunk_decode_cpu > 0) {
    lines.push(
      `  trunk decode ${l.trunk_decode_cpu.toFixed(3)} CPU s on the I/O threads (beside the wall clock): ${
        gb(l.trunk_bytes_stored)
      } GB stored for ${gb(l.trunk_bytes_read)} GB${
        l.trunk_bytes_left_coded > 0
          ? `, ${gb(l.trunk_bytes_left_coded)} GB of it decoded by the products (in the dense products' time)`
          : ""
      }`,
    );
  }
  if (l.cached_tokens > 0) lines.push(`  ${l.cached_tokens} prompt tokens from the state cache, not prefilled`);
  return lines;
}
