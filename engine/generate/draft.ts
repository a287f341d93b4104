/**
 * Drafts for exact speculative decoding, and the cost model that decides how many to try.
 *
 * A draft is a guess at a sequence's next tokens taken from text it has already seen: no
 * second model, no memory beyond token ids. The scheduler runs the sequence's pending token
 * and its draft as one multi-position segment of a pass; each draft token is then compared
 * with the token the sequence's own sampler picks from the verified logits, so the emitted
 * tokens are exactly those of plain decoding (engine/generate/scheduler.ts).
 *
 * Two drafters:
 * - `lookup`: n-gram prompt lookup. The last n tokens (n = 4 down to 1) are searched for in
 *   the sequence's prompt and output, most recent occurrence first; the tokens that followed
 *   it are the draft.
 * Neither drafts from a match shorter than 2 tokens.
 * - `suffix`: a suffix automaton over the sequence's own text finds the longest suffix that
 *   occurred before (any length, in time linear in the text), and a second automaton over
 *   recent finished sequences of the same scheduler (in `k3 serve`, recent requests) is
 *   walked by the sequence's text; the longer match drafts.
 *
 * The cost model (`DraftPolicy`) keeps, per sequence, a decayed count of drafted and
 * accepted tokens (the acceptance rate a), and takes from the scheduler the measured cost of
 * one drafted row relative to a pass without drafts (c, from the fastest passes seen with
 * and without drafts). With k drafts a pass emits
 * E(k) = (1 - a^(k+1)) / (1 - a) tokens on average and costs 1 + c k; the policy drafts the k
 * that maximises E(k) / (1 + c k), and none when no k beats plain decoding.
 *
 * @module
 */

import { SPEC_RECORD_ROWS } from "../model/state.ts";

/** Which drafter a sequence uses; "off" drafts nothing. */
export type DraftMode = "lookup" | "suffix" | "off";

/** The draft modes, for flags and messages. */
export const DRAFT_MODES: readonly DraftMode[] = ["lookup", "suffix", "off"];

/** How a scheduler drafts. */
export interface DraftOptions {
  /** The drafter; "off" disables speculation. */
  mode: DraftMode;
  /** Draft tokens per pass at most (default 8; also capped by the pass's rows). */
  maxDraft?: number;
  /** Draft the most tokens that fit on every pass, padding a short draft, and ignore the
   * cost model (a test of exactness: every position drafted). */
  force?: boolean;
  /** The relative cost of a drafted row, fixed instead of measured (tests: the choice of
   * draft lengths then does not depend on timing). */
  rowCost?: number;
  /** Replaces the drafter (tests): the sequence's text so far and the tokens wanted. */
  propose?: (text: readonly number[], k: number) => number[];
}

/** Draft tokens per pass at most, by default: what a speculation record holds beside the
 * pending token (the memory plan counts a record of that size per sequence). */
export const DEFAULT_MAX_DRAFT = SPEC_RECORD_ROWS - 1;

/** The longest n-gram prompt lookup tries. */
const LOOKUP_MAX_N = 4;
/** The shortest match either drafter drafts from: after one matching token the next is a
 * poor guess on text that does not repeat (measured: bench/speculation.ts). */
export const MIN_MATCH = 2;

/**
 * n-gram prompt lookup: the tokens after the most recent earlier occurrence of the text's
 * last n tokens, for the largest n (at most 4, at least `minN`) that occurs; [] when none does.
 */
export function lookupDraft(text: readonly number[], k: number, minN = MIN_MATCH): number[] {
  const len = text.length;
  for (let n = Math.min(LOOKUP_MAX_N, len - 1); n >= minN; n--) {
    // An occurrence starting at i ends before the text's own last n tokens begin to overlap
    // its end: i + n <= len - 1, so at least one token follows it.
    for (let i = len - n - 1; i >= 0; i--) {
      let j = 0;
      while (j < n && text[i + j] === text[len - n + j]) j++;
      if (j === n) return text.slice(i + n, Math.min(i + n + k, len)) as number[];
    }
  }
  return [];
}

/**
 * An online suffix automaton (Blokh et al. 1983): after each appended token it knows the
 * states of every substring, with the end of each state's first occurrence, in space and
 * amortised time linear in the text.
 */
export class SuffixAutomaton {
  /** The text, in order. */
  readonly text: number[] = [];
  private readonly next: Map<number, number>[] = [new Map()];
  private readonly link: number[] = [-1];
  private readonly len: number[] = [0];
  private readonly firstEnd: number[] = [-1];
  private last = 0;

  /** States so far (the root included). */
  get size(): number {
    return this.len.length;
  }

  /** Appends one token. */
  append(c: number): void {
    const pos = this.text.length;
    this.text.push(c);
    const cur = this.newState(this.len[this.last] + 1, pos);
    let p = this.last;
    while (p !== -1 && !this.next[p].has(c)) {
      this.next[p].set(c, cur);
      p = this.link[p];
    }
    if (p === -1) this.link[cur] = 0;
    else {
      const q = this.next[p].get(c)!;
      if (this.len[p] + 1 === this.len[q]) this.link[cur] = q;
      else {
        const clone = this.newState(this.len[p] + 1, this.firstEnd[q]);
        this.next[clone] = new Map(this.next[q]);
        this.link[clone] = this.link[q];
        while (p !== -1 && this.next[p].get(c) === q) {
          this.next[p].set(c, clone);
          p = this.link[p];
        }
        this.link[q] = clone;
        this.link[cur] = clone;
      }
    }
    this.last = cur;
  }

  /** The longest suffix of the text that also occurs ending earlier: its length and the end
   * index of its first occurrence (length 0 when none). */
  repeatedSuffix(): { length: number; end: number } {
    const s = this.link[this.last];
    if (s <= 0) return { length: 0, end: -1 };
    return { length: this.len[s], end: this.firstEnd[s] };
  }

  /** One step of a walk through the automaton by another text: from match (state, length)
   * to the longest suffix of the walked text plus `c` that occurs in this text. */
  walk(m: SuffixMatch, c: number): void {
    let s = m.state, l = m.length;
    while (s > 0 && !this.next[s].has(c)) {
      s = this.link[s];
      l = this.len[s];
    }
    const to = this.next[s].get(c);
    if (to === undefined) {
      m.state = 0;
      m.length = 0;
    } else {
      m.state = to;
      m.length = l + 1;
    }
  }

  /** The end index of the first occurrence of a match's state. */
  endOf(m: SuffixMatch): number {
    return this.firstEnd[m.state];
  }

  /** A new state of longest length `len` whose first occurrence ends at `firstEnd`. */
  private newState(len: number, firstEnd: number): number {
    this.next.push(new Map());
    this.link.push(-1);
    this.len.push(len);
    this.firstEnd.push(firstEnd);
    return this.len.length - 1;
  }
}

/** Where a walk through a suffix automaton stands: a state and the matched length. */
export interface SuffixMatch {
  /** The automaton's state (0: the root, nothing matched). */
  state: number;
  /** Tokens matched (the walked text's longest suffix found in the automaton's text). */
  length: number;
}

/**
 * Recent finished sequences of one scheduler, one suffix automaton over their texts (each
 * ended by a separator no token equals, so no match crosses two sequences). Started afresh
 * when it holds `limit` tokens.
 */
export class SuffixPool {
  private sam = new SuffixAutomaton();
  private separators = 0;
  /** Bumped when the pool starts afresh: matches into the old automaton are void. */
  generation = 0;

  /** A pool of at most `limit` tokens (an automaton state per token or two, each with a
   * map of its transitions: ~10 MB at the default). */
  constructor(readonly limit = 1 << 16) {}

  /** The automaton (read only for walks). */
  get automaton(): SuffixAutomaton {
    return this.sam;
  }

  /** Adds a finished sequence's text (prompt and output). */
  add(text: readonly number[]): void {
    if (this.sam.text.length + text.length + 1 > this.limit) {
      this.sam = new SuffixAutomaton();
      this.separators = 0;
      this.generation++;
    }
    for (const t of text.slice(-this.limit + 1)) this.sam.append(t);
    this.sam.append(-1 - this.separators++);
  }
}

/** One sequence's drafter: its text so far, and drafts from it (and from a pool). */
export class SequenceDrafter {
  /** The sequence's text: its prompt and every emitted token. */
  readonly text: number[] = [];
  private readonly own?: SuffixAutomaton;
  private poolMatch: SuffixMatch = { state: 0, length: 0 };
  private poolGeneration = -1;
  private poolSize = 0;

  /** A drafter of `opts.mode`, drawing also on `pool` in suffix mode. */
  constructor(private readonly opts: DraftOptions, private readonly pool?: SuffixPool) {
    if (opts.mode === "suffix" && !opts.propose) this.own = new SuffixAutomaton();
  }

  /** Its drafter kind. */
  get mode(): DraftMode {
    return this.opts.mode;
  }

  /** Appends tokens the sequence has read or emitted. */
  append(tokens: readonly number[]): void {
    for (const t of tokens) {
      this.text.push(t);
      this.own?.append(t);
      if (this.own && this.pool && this.poolGeneration === this.pool.generation) {
        this.pool.automaton.walk(this.poolMatch, t);
      }
    }
  }

  /** Up to `k` draft tokens; with `force`, exactly `k` (a short draft padded with its last
   * token, or the text's). */
  propose(k: number): number[] {
    if (k <= 0) return [];
    const d = this.opts.propose?.(this.text, k).slice(0, k) ??
      (this.opts.mode === "lookup" ? lookupDraft(this.text, k) : this.suffixDraft(k));
    if (this.opts.force) {
      const pad = d.length > 0 ? d[d.length - 1] : this.text[this.text.length - 1] ?? 0;
      while (d.length < k) d.push(pad);
    }
    return d;
  }

  /** The continuation of the longer of the own-text and the pool match. */
  private suffixDraft(k: number): number[] {
    const own = this.own!.repeatedSuffix();
    const pool = this.pool;
    if (pool && (this.poolGeneration !== pool.generation || this.poolSize !== pool.automaton.size)) {
      // The pool changed since the walk began: walk again from the sequence's recent text.
      this.poolGeneration = pool.generation;
      this.poolSize = pool.automaton.size;
      this.poolMatch = { state: 0, length: 0 };
      for (const t of this.text.slice(-64)) pool.automaton.walk(this.poolMatch, t);
    }
    if (pool && this.poolMatch.length > own.length && this.poolMatch.length >= MIN_MATCH) {
      const ptext = pool.automaton.text, from = pool.automaton.endOf(this.poolMatch) + 1;
      const out: number[] = [];
      for (let i = from; i < ptext.length && out.length < k && ptext[i] >= 0; i++) out.push(ptext[i]);
      return out;
    }
    if (own.length < MIN_MATCH) return [];
    return this.text.slice(own.end + 1, Math.min(own.end + 1 + k, this.text.length));
  }
}

/**
 * The measured cost of drafted rows, shared by a scheduler's sequences: the fastest decode
 * pass seen with each number of drafted rows (rows beyond one per sequence). The minimum,
 * because a loaded machine only ever adds time to a pass (descheduling scatters one-row
 * passes by milliseconds); the relative cost is read off the most drafted rows seen.
 */
export class DraftCost {
  private readonly best = new Map<number, number>();

  /** Cost of one drafted row relative to a pass without drafts, before both are measured:
   * optimistic, so drafting is tried and measured. */
  static readonly PRIOR = 0.25;

  /** A decode pass: its seconds and its drafted rows. Prefill passes are not fed. */
  observe(seconds: number, drafted: number): void {
    const b = this.best.get(drafted);
    if (b === undefined || seconds < b) this.best.set(drafted, seconds);
  }

  /** c: seconds of one drafted row over the seconds of a pass without drafts. */
  get relative(): number {
    const base = this.best.get(0);
    const most = Math.max(0, ...this.best.keys());
    if (base === undefined || !(base > 0) || most === 0) return DraftCost.PRIOR;
    return Math.max(0, this.best.get(most)! - base) / most / base;
  }
}

/** Expected tokens emitted by a pass with k drafts at acceptance rate a (each draft token
 * accepted with probability a, given the ones before it were). */
export function expectedTokens(a: number, k: number): number {
  if (a >= 1) return k + 1;
  return (1 - Math.pow(a, k + 1)) / (1 - a);
}

/**
 * k in 0..maxK maximising expectedTokens(a, k) / (1 + c k): the drafts worth their rows at
 * acceptance a and relative row cost c (0: plain decoding pays best).
 */
export function bestDraftLength(a: number, c: number, maxK: number): number {
  let best = 0, bestRate = 1;
  for (let k = 1; k <= maxK; k++) {
    const rate = expectedTokens(a, k) / (1 + c * k);
    if (rate > bestRate * (1 + 1e-9)) {
      best = k;
      bestRate = rate;
    }
  }
  return best;
}

/** Counters of one sequence's speculation. */
export interface DraftStats {
  /** Passes that carried a draft. */
  passes: number;
  /** Draft tokens run. */
  drafted: number;
  /** Draft tokens equal to the token emitted at their position. */
  accepted: number;
  /** The cost model turned drafting off for the rest of the sequence. */
  off: boolean;
}

/** Drafted tokens, decayed, below which the acceptance estimate is mostly the prior. */
const ACCEPT_PRIOR_WEIGHT = 2;
/** The prior acceptance rate. */
const ACCEPT_PRIOR = 0.5;
/** Drafted tokens before the policy may give up on a sequence. */
const MIN_EVIDENCE = 8;
/** The acceptance rate below which drafting is off for good (with the evidence above): no
 * row cost this engine measures is that low (a drafted row at the floor still computes its
 * experts and reads the ones no other row chose). */
const OFF_BELOW = 0.08;

/** A sequence's speculation: its drafter, acceptance estimate and counters. */
export class DraftPolicy {
  /** Counters for the result. */
  readonly stats: DraftStats = { passes: 0, drafted: 0, accepted: 0, off: false };
  private acceptedDecayed = 0;
  private draftedDecayed = 0;

  /** The policy of one sequence drafting with `drafter` under `opts`. */
  constructor(readonly drafter: SequenceDrafter, private readonly opts: DraftOptions) {}

  /** The acceptance rate estimate (decayed counts with a prior). */
  get acceptance(): number {
    return (this.acceptedDecayed + ACCEPT_PRIOR * ACCEPT_PRIOR_WEIGHT) /
      (this.draftedDecayed + ACCEPT_PRIOR_WEIGHT);
  }

  /** The draft for the next pass: at most `room` tokens, as many as the cost `c` says pay. */
  next(room: number, c: number): number[] {
    const maxK = Math.min(room, this.opts.maxDraft ?? DEFAULT_MAX_DRAFT);
    if (maxK <= 0 || this.stats.off) return [];
    if (this.opts.force) return this.drafter.propose(maxK);
    if (this.stats.drafted >= MIN_EVIDENCE && this.acceptance < OFF_BELOW) {
      this.stats.off = true; // its drafts do not match: off for the rest of the sequence
      return [];
    }
    const k = bestDraftLength(this.acceptance, this.opts.rowCost ?? c, maxK);
    return k === 0 ? [] : this.drafter.propose(k);
  }

  /** After a drafted pass: `drafted` tokens run, `accepted` of them equal to the output. */
  record(drafted: number, accepted: number): void {
    const decay = 0.95;
    this.stats.passes++;
    this.stats.drafted += drafted;
    this.stats.accepted += accepted;
    this.acceptedDecayed = decay * this.acceptedDecayed + accepted;
    this.draftedDecayed = decay * this.draftedDecayed + drafted;
  }
}
