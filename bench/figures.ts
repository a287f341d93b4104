/**
 * The shapes every limits section shares: a measured figure, what a section is given, a
 * section, the options of a run. Their own module so that bench/limits.ts (which runs the
 * sections) and the sections kept in other files (bench/speculation.ts) both import them
 * and neither imports the other back.
 */

import type { Kernels } from "../engine/native/ffi.ts";

/** One measured figure: `key` is its JSON name; `of` names the limit it is a ratio to. */
export interface Figure {
  key: string;
  label: string;
  value: number;
  unit: string;
  /** key of the figure this one is measured against (its limit), when it has one */
  of?: string;
  /** value / that limit (or a ratio measured directly, e.g. per-token costs) */
  ratio?: number;
}

/** What every section gets: the kernels, the options, and the figures measured so far. */
export interface Context {
  k: Kernels;
  opts: LimitsOptions;
  figures: Figure[];
  /** the value of an earlier figure by key (throws if it was not measured) */
  get(key: string): number;
  /** progress lines (stderr) */
  log(line: string): void;
}

/** A group of measurements. */
export type Section = (ctx: Context) => Promise<Figure[]>;

/** Options of a run. */
export interface LimitsOptions {
  /** directory for the disk's scratch file */
  dir: string;
  dramBytes: number;
  diskBytes: number;
  skipDisk: boolean;
  /** skip the decode runs on a real-width slice */
  skipDecode?: boolean;
  /** runs per timing (the median is reported) */
  reps: number;
  /** the split-coded trunk of the decode slice (default: beside the slice's raw trunk) */
  codedTrunk?: string;
  /** the disk rate (GB/s) the codec's capped floor runs are held to (default ISSUE_DISK_GBPS) */
  throttleGbps?: number;
}
