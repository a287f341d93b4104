/**
 * The token mask: which tokens of the vocabulary the automaton allows next, and the
 * per-sequence constraint the scheduler applies before its sampler picks.
 *
 * Every token's symbols are computed once per vocabulary ({@link TokenSymbols}): a BPE
 * rank is its bytes, an added token is one special symbol, an id no token names is never
 * allowed. For the whole mask the byte tokens are kept in byte order with each one's
 * common prefix with the previous (a byte trie, flattened), so the walk steps each shared
 * prefix once and skips every token under a refused prefix without stepping it. Each step
 * goes through the constraint's state table (table.ts): states that step alike share a
 * number and remember where each byte took them, so after the first few hundred steps a
 * step is a lookup, and a whole mask costs about one pass over the flattened trie. Masks
 * are also kept by state number (least recently used out, {@link MASK_CACHE_BYTES}), so a
 * state met again (each character of a long string, each item of an array) costs a copy.
 *
 * Picking ({@link TokenConstraint.pick}) follows one rule: the token is the sampler's
 * draw from the masked distribution (refused tokens weigh 0), one draw per token, so a
 * seeded request picks the same tokens whether or not its caller reads the logits (log
 * probabilities) or verifies drafts. Greedy (the argmax) is lazy, which gives the same
 * token: the refused argmax gets -Infinity and the argmax is taken again, up to
 * {@link LAZY_TRIES} times, then the whole mask is applied; the result is always the
 * argmax of the masked logits. Sampling always applies the whole mask first: drawing from
 * the logits as they are and re-drawing when refused would consume the generator
 * differently from a masked draw, and a caller that turns on log probabilities (which
 * need the masked logits) would get another answer. With `maskAll` (a caller that reads
 * the logits as a distribution) the whole mask is applied before a greedy pick too.
 *
 * @module
 */

import { K3Error } from "../../errors.ts";
import type { Tokenizer } from "../../text/tokenizer.ts";
import { unnamedIdText } from "../../text/tokenizer.ts";
import type { TokenFilter } from "../scheduler.ts";
import { argmax } from "../sampling.ts";
import { SPECIAL_BASE, type State, stepState } from "./automaton.ts";
import { DEAD, StateTable } from "./table.ts";

/** Refused greedy picks before the whole mask is computed. */
export const LAZY_TRIES = 8;

/** Bytes of whole masks one constraint keeps for states it may meet again (25 on a 163,840-id vocabulary). */
export const MASK_CACHE_BYTES = 4 << 20;

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
  /** Byte tokens with three quote bytes or more: the whole mask checks these one by one when it uses a table (see Obj.signature). */
  readonly quoted: Int32Array;

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
    this.quoted = Int32Array.from(byteIds.filter((id) => {
      let quotes = 0;
      for (let k = s[id]; k < s[id] + l[id]; k++) if (a[k] === 0x22) quotes++;
      return quotes >= 3;
    }));
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

  /**
   * Sets `allowed[id]` to 1 for every token the automaton allows from `state`, 0 for the
   * rest; returns how many. With a `table` (table.ts) each byte step is a lookup once its
   * state has taken that byte; without one every step runs the automaton. Either way each
   * token is allowed exactly when {@link step} gives a live state.
   */
  mask(state: State, allowed: Uint8Array, table?: StateTable): number {
    allowed.fill(0);
    let count = 0;
    for (const id of this.specials) {
      if (stepState(state, this.special[id]).length > 0) (allowed[id] = 1, count++);
    }
    const { order, lcp, arena, start, length } = this;
    // At depth d (the first d bytes of the current token read): the state's number in the
    // table (ids[d] >= 0), or the state itself (ids[d] = -1: no table, or the table full).
    const states: State[] = [state];
    const ids: number[] = [table ? table.id(state) : -1];
    const rows = table?.rows;
    let valid = 0; // depths 0..valid belong to the current token's prefix
    for (let i = 0; i < order.length; i++) {
      const id = order[i], len = length[id], at = start[id];
      let d = Math.min(lcp[i], valid);
      let dead = false;
      while (d < len) {
        const b = arena[at + d], from = ids[d];
        let to = -1;
        if (from >= 0) {
          const row = rows![from], known = row === undefined ? 0 : row[b];
          to = known !== 0 ? known - 1 : table!.step(from, b);
        }
        if (to === DEAD) {
          dead = true;
          break;
        }
        if (to < 0) {
          const next = stepState(from >= 0 ? table!.state(from) : states[d], b);
          if (next.length === 0) {
            dead = true;
            break;
          }
          states[d + 1] = next;
        }
        ids[++d] = to;
      }
      if (dead) {
        // Every following token sharing the refused prefix (d + 1 bytes) is refused too.
        while (i + 1 < order.length && lcp[i + 1] > d) i++;
      } else (allowed[id] = 1, count++);
      valid = d;
    }
    return table ? count + this.recheckQuoted(state, allowed) : count;
  }

  /**
   * Sets the bits of the {@link quoted} tokens from `state` itself; returns the change in the
   * allowed count. A mask from the table, or cached under a state's number, is exact for
   * every other token (see Obj.signature).
   */
  recheckQuoted(state: State, allowed: Uint8Array): number {
    let change = 0;
    for (const id of this.quoted) {
      const ok = this.step(state, id).length > 0 ? 1 : 0;
      change += ok - allowed[id];
      allowed[id] = ok;
    }
    return change;
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
  #compact: Float32Array;
  /** Numbered states (made on the first whole mask: a greedy run rarely needs one). */
  #table?: StateTable;
  /** Whole masks by state number, least recently used first, within {@link MASK_CACHE_BYTES}. */
  #masks = new Map<number, { allowed: Uint8Array; count: number }>();

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
    // The allowed set is a function of the state's number (states that step alike share
    // one), so a state met again (every character of a long string, the same key of every
    // item of an array) reuses its mask.
    let table = this.#table;
    if (table === undefined) this.#table = table = new StateTable();
    else if (table.size >= table.maxStates) (table.clear(), this.#masks.clear());
    const sid = table.id(this.#state);
    const hit = sid >= 0 ? this.#masks.get(sid) : undefined;
    if (hit) {
      this.#masks.delete(sid), this.#masks.set(sid, hit);
      this.#allowed.set(hit.allowed);
      return hit.count + this.symbols.recheckQuoted(this.#state, this.#allowed);
    }
    const count = this.symbols.mask(this.#state, this.#allowed, table);
    if (sid >= 0) {
      const keep = Math.max(1, Math.floor(MASK_CACHE_BYTES / this.#allowed.length));
      while (this.#masks.size >= keep) this.#masks.delete(this.#masks.keys().next().value!);
      this.#masks.set(sid, { allowed: this.#allowed.slice(), count });
    }
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

  /** Advances past `token`, chosen outside the constraint (a reasoning budget's forced
   * markup); throws when the grammar refuses it. */
  advance(token: number): void {
    const next = this.symbols.step(this.#state, token);
    if (next.length === 0) throw new Error(`internal: forced token ${token} is refused by the grammar`);
    this.#state = next;
  }

  /** See {@link TokenFilter.pick}. Throws K3Error when the grammar allows no token at all. */
  pick(logits: Float32Array, choose: (logits: Float32Array) => number): number {
    if (!this.maskAll && choose === argmax) {
      for (let i = 0; i < LAZY_TRIES; i++) {
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
