/**
 * The plan's state terms:
 *
 *   state  = KDA state (fixed) + KV per position x positions (MLA latent cache, fp32), per
 *            sequence
 *   drafts = sequences x a speculation record (model/state.ts speculationBytes: the KDA
 *            states before a drafted pass and each row's inputs), when sequences may draft
 *   state cache (serve, batch) = kept conversation states (generate/state_cache.ts):
 *            --state-cache-gb, or by default what the plan leaves of MemAvailable after
 *            everything else and the fixed overhead, less the same 10% headroom --preset
 *            auto keeps, at most STATE_CACHE_DEFAULT_CAP (see stateCacheDefault)
 *
 * @module
 */

import { SPEC_RECORD_ROWS, speculationBytes } from "../model/state.ts";
import { FIXED_OVERHEAD_BYTES, GB, type PlanInput } from "./plan_input.ts";

/** The sequences' states' part of the plan. */
export interface StatePlan {
  /** Bytes of one sequence's fixed state (KDA). */
  fixedBytes: number;
  /** Bytes of one position of one sequence's MLA cache. */
  kvPerPosition: number;
  /** Positions each state holds. */
  positions: number;
  /** Sequences, each with its own state. */
  sequences: number;
  /** Bytes of the term. */
  bytes: number;
}

/**
 * The share of the available memory `--context auto` gives the sequences' MLA caches: the
 * rest stays for the weights (pins and expert cache buy speed), the KDA states and the
 * prefill segment.
 */
export const AUTO_CONTEXT_SHARE = 0.25;

/** The fewest positions `--context auto` asks for (serve's and chat's fixed default before
 * it): less only when the plan cannot hold that many. */
export const AUTO_CONTEXT_MIN = 4096;

/**
 * The most positions `--context auto` lets each of `sequences` states hold: their MLA
 * caches within {@link AUTO_CONTEXT_SHARE} of `available`, and at least
 * {@link AUTO_CONTEXT_MIN} (unknown memory: no bound here; the model's window and the
 * plan's fit still apply). At the released widths (55,296 B a position) 8 GB gives one
 * sequence 36,168 positions and four 9,042; 64 GB four 72,337.
 */
export function autoContextPositions(
  state: { perPosition: number },
  available: number | undefined,
  sequences: number,
): number {
  if (available === undefined || state.perPosition <= 0) return Infinity;
  const perSequence = (AUTO_CONTEXT_SHARE * available) / Math.max(1, sequences);
  return Math.max(AUTO_CONTEXT_MIN, Math.floor(perSequence / state.perPosition));
}

/** The speculation records' part of the plan. */
export interface DraftsPlan {
  /** Rows a record holds. */
  rows: number;
  /** Bytes of one sequence's record. */
  perSequence: number;
  /** Sequences, each with a record. */
  sequences: number;
  /** Bytes of the term. */
  bytes: number;
}

/** The conversation state cache's part of the plan. */
export interface StateCachePlan {
  /** Its RAM budget. */
  bytes: number;
  /** Bytes of a kept state per position. */
  perPosition: number;
  /** Fixed bytes of a kept state. */
  fixedBytes: number;
  /** Where the budget comes from: --state-cache-gb, or the default. */
  source: "flag" | "default";
}

/** The state term: one state for each of `sequences`. */
export function planState(input: PlanInput, sequences: number): StatePlan {
  const st = input.stateBytes;
  return {
    fixedBytes: st.fixed,
    kvPerPosition: st.perPosition,
    positions: input.capacity,
    sequences,
    bytes: sequences * (st.fixed + st.perPosition * input.capacity),
  };
}

/** The drafts term for passes of `passRows` rows: a speculation record per sequence when
 * sequences may draft (null: they do not). */
export function planDrafts(input: PlanInput, sequences: number, passRows: number): DraftsPlan | null {
  if (!input.drafts) return null;
  const rows = Math.min(passRows, SPEC_RECORD_ROWS);
  const perSequence = speculationBytes(input.cfg, rows);
  return { rows, perSequence, sequences, bytes: sequences * perSequence };
}

/** The largest default state cache: enough for a few long conversations on the full model
 * (~55 KB per position: 8 GB holds ~145,000 positions). */
export const STATE_CACHE_DEFAULT_CAP = 8e9;

/**
 * The default state cache budget: what the plan leaves of `available` after `planned`
 * bytes (trunk, expert cache, state, scratch) and the fixed overhead, less 10% headroom
 * (as --preset auto keeps), capped at {@link STATE_CACHE_DEFAULT_CAP}; the cap when the
 * available memory is unknown. Entries take RAM only as conversations are kept, so the
 * budget is a ceiling, not an allocation.
 */
export function stateCacheDefault(available: number | undefined, planned: number): number {
  if (available === undefined) return STATE_CACHE_DEFAULT_CAP;
  const left = Math.max(0, 0.9 * (available - planned - FIXED_OVERHEAD_BYTES));
  return Math.floor(Math.min(STATE_CACHE_DEFAULT_CAP, left));
}

/** The state cache term, after `planned` bytes of everything else (null: none asked for). */
export function planStateCache(input: PlanInput, planned: number): StateCachePlan | null {
  if (!input.stateCache) return null;
  const gb = input.stateCache.gb;
  return {
    bytes: gb !== undefined ? Math.round(gb * GB) : stateCacheDefault(input.available, planned),
    perPosition: input.stateBytes.perPosition,
    fixedBytes: input.stateBytes.fixed,
    source: gb !== undefined ? "flag" : "default",
  };
}
