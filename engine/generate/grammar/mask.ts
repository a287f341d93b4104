/**
 * The token mask: which tokens of the vocabulary the automaton allows next, and the
 * per-sequence constraint the scheduler applies before its sampler picks.
 *
 * Every token's symbols are computed once per vocabulary ({@link TokenSymbols}): a BPE
 * rank is its bytes, an added token is one special symbol, an id no token names is never
 * allowed. For the whole mask the byte tokens are kept in byte order with each one's
 * common prefix with the previous, so the walk steps each shared prefix once and skips
 * every token under a refused prefix without stepping it.
 *
 * Picking ({@link TokenConstraint.pick}) is lazy: the sampler picks from the logits as
 * they are, and only a token the automaton refuses costs more. Greedy (the argmax): the
 * refused token gets -Infinity and the argmax is taken again, up to {@link LAZY_TRIES}
 * times, then the whole mask is applied; the result is always the argmax of the masked
 * logits. Sampling: one draw from the logits as they are; a refused draw is followed by
 * the whole mask and a second draw (re-drawing means re-sorting the whole vocabulary, which
 * costs more than the mask). For plain temperature sampling that is exactly sampling from
 * the masked distribution: p(t) + R p(t) / (1 - R) = p(t) / (1 - R), R the refused mass;
 * top-k, top-p and min-p apply to the logits each draw sees. Either way a token the
 * unconstrained run would pick is picked whenever the grammar allows it. With `maskAll`
 * (a caller that reads the logits as a distribution, such as log probabilities) the whole
 * mask is applied before the first pick.
 *
 * @module
 */

import { K3Error } from "../../errors.ts";
import type { Tokenizer } from "../../text/tokenizer.ts";
import { unnamedIdText } from "../../text/tokenizer.ts";
import type { TokenFilter } from "../scheduler.ts";
import { argmax } from "../sampling.ts";
import { SPECIAL_BASE, type Stack, type State, stepState, Str } from "./automaton.ts";

/** Refused greedy picks before the whole mask is computed. */
export const LAZY_TRIES = 8;

/** Every token's symbols, and the byte tokens in byte order for the whole-mask walk. */
export class TokenSymbols {
  /** Bytes of all byte tokens, concatenated. */
  readonly arena: Uint8Array;
  /** Offset of each id's bytes in {@link arena} (byte tokens). */
  readonly start: Int32Array;
  /** Byte length of each id; 0 for a special or unnamed id. */
  readonly length: Int32Array;
  /** The special symbol of each id (`SPECIAL_BASE + id`), -1 for a byte token, -2 for an id no token names. */
  readonly special: Int32Array;
  /** Byte tokens in byte order. */
  readonly order: Int32Array;
  /** Common prefix of `order[i]` with `order[i - 1]`, in bytes. */
  readonly lcp: Int32Array;
  /** Ids that are special tokens. */
  readonly specials: Int32Array;

  /** From each id's bytes (null: a special token; undefined: no token). */
  constructor(tokens: readonly (Uint8Array | null | undefined)[]) {
    const n = tokens.length;
    let total = 0;
    for (const t of tokens) if (t) total += t.length;
    this.arena = new Uint8Array(total);
    this.start = new Int32Array(n);
    this.length = new Int32Array(n);
    this.special = new Int32Array(n);
    const byteIds: number[] = [], specials: number[] = [];
    let at = 0;
    for (let id = 0; id < n; id++) {
      const t = tokens[id];
      if (t === null) {
        this.special[id] = SPECIAL_BASE + id;
        specials.push(id);
      } else if (t === undefined || t.length === 0) this.special[id] = -2;
      else {
        this.special[id] = -1;
        this.start[id] = at;
        this.length[id] = t.length;
        this.arena.set(t, at);
        at += t.length;
        byteIds.push(id);
      }
    }
    const a = this.arena, s = this.start, l = this.length;
    const cmp = (x: number, y: number) => {
      const m = Math.min(l[x], l[y]);
      for (let k = 0; k < m; k++) if (a[s[x] + k] !== a[s[y] + k]) return a[s[x] + k] - a[s[y] + k];
      return l[x] - l[y] || x - y;
    };
    byteIds.sort(cmp);
    this.order = Int32Array.from(byteIds);
    this.lcp = new Int32Array(byteIds.length);
    for (let i = 1; i < byteIds.length; i++) {
      const x = byteIds[i - 1], y = byteIds[i];
      const m = Math.min(l[x], l[y]);
      let k = 0;
      while (k < m && a[s[x] + k] === a[s[y] + k]) k++;
      this.lcp[i] = k;
    }
    this.specials = Int32Array.from(specials);
  }

  /** Ids in the vocabulary. */
  get size(): number {
    return this.length.length;
  }

  /** The state after token `id`, empty when the automaton refuses it. */
  step(state: State, id: number): State {
    if (id < 0 || id >= this.size) return [];
    const sp = this.special[id];
    if (sp >= 0) return stepState(state, sp);
    if (sp === -2) return [];
    let s = state;
    const a = this.arena, end = this.start[id] + this.length[id];
    for (let i = this.start[id]; i < end && s.length > 0; i++) s = stepState(s, a[i]);
    return s;
  }

  /** Sets `allowed[id]` to 1 for every token the automaton allows from `state`, 0 for the rest; returns how many. */
  mask(state: State, allowed: Uint8Array): number {
    allowed.fill(0);
    let count = 0;
    for (const id of this.specials) {
      if (stepState(state, this.special[id]).length > 0) (allowed[id] = 1, count++);
    }
    const { order, lcp, arena, start, length } = this;
    // states[d]: the state after the first d bytes of the current token.
    const states: State[] = [state];
    let valid = 0; // states[0..valid] belong to the current token's prefix
    for (let i = 0; i < order.length; i++) {
      const id = order[i], len = length[id], at = start[id];
      let d = Math.min(lcp[i], valid);
      let dead = false;
      while (d < len) {
        const next = stepState(states[d], arena[at + d]);
        if (next.length === 0) {
          dead = true;
          break;
        }
        states[++d] = next;
      }
      if (dead) {
        // Every following token sharing the refused prefix (d + 1 bytes) is refused too.
        while (i + 1 < order.length && lcp[i + 1] > d) i++;
      } else (allowed[id] = 1, count++);
      valid = d;
    }
    return count;
  }
}

const cache = new WeakMap<Tokenizer, Map<number, TokenSymbols>>();

/** The symbols of a tokenizer's tokens for a model of `vocab` ids (computed once per pair). */
export function tokenSymbols(tok: Tokenizer, vocab: number): TokenSymbols {
  let byVocab = cache.get(tok);
  if (!byVocab) cache.set(tok, byVocab = new Map());
  let t = byVocab.get(vocab);
  if (!t) {
    const tokens: (Uint8Array | null | undefined)[] = new Array(vocab);
    const dec = new TextDecoder();
    for (let id = 0; id < vocab; id++) {
      if (id >= tok.vocabSize) continue;
      if (tok.isAdded(id)) {
        tokens[id] = null;
        continue;
      }
      const bytes = tok.decodeBytes([id]);
      // A hole in the ranks decodes as its placeholder: it names no token.
      if (dec.decode(bytes) !== unnamedIdText(id)) tokens[id] = bytes.slice();
    }
    byVocab.set(vocab, t = new TokenSymbols(tokens));
  }
  return t;
}

/** One sequence's constraint: the automaton's state, stepped by every token picked. */
export class TokenConstraint implements TokenFilter {
  #state: State;
  #allowed: Uint8Array;
  #ids: Int32Array;
  /** The last whole mask computed inside a string (see #mask). */
  #stringMask?: { below: Stack | null; key: string; allowed: Uint8Array; count: number };
  #compact: Float32Array;

  /** From `start`, over `symbols`; `maskAll`: apply the whole mask before every pick. */
  constructor(readonly symbols: TokenSymbols, start: State, readonly maskAll = false) {
    this.#state = start;
    this.#allowed = new Uint8Array(symbols.size);
    this.#ids = new Int32Array(symbols.size);
    this.#compact = new Float32Array(symbols.size);
  }

  /** The current state (for tests and the bench). */
  get state(): State {
    return this.#state;
  }

  /** True when no token can follow: the grammar has ended. */
  get finished(): boolean {
    return this.#state.length === 0;
  }

  /** The whole mask of the current state into the scratch mask; returns the allowed count. */
  #mask(): number {
    // Inside a string of unbounded length the mask repeats from one character to the next:
    // it depends only on the string frame's sub-state and the (immutable, shared) stack
    // below it, and on the character count only through reaching minLength.
    const st = this.#state;
    const top = st.length === 1 ? st[0].top : undefined;
    if (!(top instanceof Str) || top.max !== Infinity) return this.symbols.mask(st, this.#allowed);
    const key = `${Math.min(top.n, top.min)} ${top.min} ${top.esc} ${top.cont} ${top.lo} ${top.hi} ${top.surrogate}`;
    const c = this.#stringMask;
    if (c && c.below === st[0].below && c.key === key) {
      this.#allowed.set(c.allowed);
      return c.count;
    }
    const count = this.symbols.mask(st, this.#allowed);
    this.#stringMask = { below: st[0].below, key, allowed: this.#allowed.slice(), count };
    return count;
  }

  /** Applies the whole mask to `logits` (-Infinity for every refused token); returns the allowed count. */
  applyMask(logits: Float32Array): number {
    const n = this.#mask();
    const allowed = this.#allowed, V = Math.min(logits.length, allowed.length);
    for (let i = 0; i < V; i++) if (allowed[i] === 0) logits[i] = -Infinity;
    for (let i = V; i < logits.length; i++) logits[i] = -Infinity;
    return n;
  }

  /** See {@link TokenFilter.pick}. Throws K3Error when the grammar allows no token at all. */
  pick(logits: Float32Array, choose: (logits: Float32Array) => number): number {
    if (!this.maskAll) {
      const tries = choose === argmax ? LAZY_TRIES : 1;
      for (let i = 0; i < tries; i++) {
        const t = choose(logits);
        const next = this.symbols.step(this.#state, t);
        if (next.length > 0) {
          this.#state = next;
          return t;
        }
        logits[t] = -Infinity;
      }
    }
    if (this.applyMask(logits) === 0) {
      throw new K3Error("structured output: the grammar allows no token here (the schema cannot be completed)");
    }
    // The sampler sees only the allowed tokens, in id order: the same order, weights and
    // draw as on the masked vocabulary (refused tokens weigh 0), without sorting those.
    const allowed = this.#allowed, ids = this.#ids, V = Math.min(logits.length, allowed.length);
    let n = 0;
    for (let i = 0; i < V; i++) if (allowed[i] === 1) ids[n++] = i;
    const compact = this.#compact.subarray(0, n);
    for (let j = 0; j < n; j++) compact[j] = logits[ids[j]];
    const t = ids[choose(compact)];
    const next = this.symbols.step(this.#state, t);
    if (next.length === 0) throw new Error(`internal: the sampler picked token ${t}, which the mask refused`);
    this.#state = next;
    return t;
  }
}
