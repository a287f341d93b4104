/**
 * Kimi K3's tokenizer: byte-level rank BPE over a tiktoken-format vocabulary, with K3's
 * pre-tokenizer, its added (special) tokens, and decoders for whole and streamed output.
 *
 * A directory holds `tiktoken.model` (one `base64(bytes) rank` per line) and, optionally,
 * `tokenizer_config.json` whose `added_tokens_decoder` maps ids to `{content, special}`.
 *
 * Token bytes live in one arena with a typed-array hash table over them (see RankTable):
 * loading builds no per-token objects, and BPE looks up byte ranges without slicing.
 * Encoded pieces are cached by their text, since real text repeats its words.
 *
 * @module
 */

import { EXIT, K3Error, usageError } from "../errors.ts";
import { k3Pattern } from "./pretokenize.ts";
import { expectDirectory } from "../paths.ts";
import { notRegular, readInput, readInputText } from "../native/files.ts";

/** The largest tiktoken.model or tokenizer_config.json read (the released ones: ~2.6 MB, ~50 kB). */
const MAX_TOKENIZER_FILE = 256 << 20;
/** The longest `base64 rank` line accepted (a token of ~3 kB). */
const MAX_RANK_LINE = 4096;

/**
 * The text an id without a token decodes to: `<|id:933|>`. A model's vocabulary can be
 * larger than what its tokenizer files name (e.g. `tokenizer_config.json` missing, so
 * the added tokens are unknown); such an id is shown, never dropped or fatal.
 */
export function unnamedIdText(id: number): string {
  return `<|id:${id}|>`;
}

/** The reference tokenizer encodes text in chunks of this many characters at most. */
const MAX_CHUNK = 400_000;
/** ... and cuts every run of more consecutive whitespace or non-whitespace characters. */
const MAX_RUN = 25_000;

/** Python's `str.isspace` for one code point (the reference's whitespace test). */
function pythonSpace(c: number): boolean {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 || c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f ||
    c === 0x3000;
}

/**
 * The pieces the released tokenizer (`tokenization_kimi.py`) BPE-encodes separately:
 * chunks of 400,000 characters, each cut so that no piece holds a run of more than 25,000
 * consecutive whitespace or non-whitespace characters (`_split_whitespaces_or_nonwhitespaces`).
 * Characters are code points, as Python counts them.
 */
export function referenceChunks(text: string): string[] {
  const points = Array.from(text);
  const out: string[] = [];
  for (let c = 0; c < points.length; c += MAX_CHUNK) {
    const chunk = points.slice(c, c + MAX_CHUNK);
    let start = 0, run = 0;
    let space = chunk.length > 0 && pythonSpace(chunk[0].codePointAt(0)!);
    for (let i = 0; i < chunk.length; i++) {
      const now = pythonSpace(chunk[i].codePointAt(0)!);
      if (now !== space) {
        run = 1;
        space = now;
      } else if (++run > MAX_RUN) {
        out.push(chunk.slice(start, i).join(""));
        start = i;
        run = 1;
      }
    }
    out.push(chunk.slice(start).join(""));
  }
  return out;
}

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /**
   * Recognise added tokens such as `<|open|>` in the text. Only for control text the
   * program writes itself; user data must be encoded with this off (the default), so
   * that it cannot inject control tokens: it is then encoded as ordinary bytes.
   */
  allowSpecial?: boolean;
}

/** An added token from `tokenizer_config.json`. */
export interface AddedToken {
  /** Token id. */
  id: number;
  /** Its text. */
  content: string;
  /** A special token (not produced from user text). */
  special: boolean;
}

const RANK_RE = /^[0-9]+$/;
/** Bound on the piece cache, so a long run over varied text cannot grow it forever. */
const CACHE_LIMIT = 1 << 16;

/**
 * Pieces longer than this many bytes are merged with a heap: the linear scan is quadratic,
 * and one piece can be a whole pasted file of `=` or spaces.
 */
const LONG_PIECE = 256;

/** Base64 alphabet value of each ASCII code, -1 for anything else. */
const B64 = new Int8Array(128).fill(-1);
for (let i = 0; i < 64; i++) {
  B64["ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".charCodeAt(i)] = i;
}
const SPACE = 0x20, LF = 0x0a, CR = 0x0d, EQ = 0x3d;

/** FNV-1a over `buf[start..end)`: cheap, and good enough for short token byte strings. */
function hashBytes(buf: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) h = Math.imul(h ^ buf[i], 0x01000193);
  return h;
}

/**
 * The BPE ranks of a vocabulary: token bytes in one arena, indexed by rank, and an
 * open-addressing hash table from bytes to rank. Typed arrays throughout: building a
 * JavaScript Map of 163,584 string keys costs several times more than everything else
 * in loading, and lookups here need no string slices.
 */
export class RankTable {
  /** Token bytes of all ranks, concatenated. */
  readonly arena: Uint8Array;
  /** Offset of each rank's bytes in {@link arena}; -1 for a rank the file skips. */
  readonly start: Int32Array;
  /** Byte length of each rank. */
  readonly length: Int32Array;
  /** Number of ranks. */
  readonly size: number;
  /** Hash slots: rank + 1, 0 when empty. Capacity is a power of two. */
  readonly #slots: Int32Array;
  readonly #mask: number;

  /** Use {@link parseTiktokenModel}. */
  constructor(
    arena: Uint8Array,
    start: Int32Array,
    length: Int32Array,
    size: number,
    slots: Int32Array,
  ) {
    this.arena = arena;
    this.start = start;
    this.length = length;
    this.size = size;
    this.#slots = slots;
    this.#mask = slots.length - 1;
  }

  /** Rank of the bytes `buf[from..to)`, or -1 if they are not a token. */
  find(buf: Uint8Array, from: number, to: number): number {
    return probe(this.#slots, this.arena, this.start, this.length, buf, from, to);
  }
}

/**
 * Looks `buf[from..to)` up in a hash table of ranks. Returns the rank, or `-1 - slot`
 * for the empty slot where it would go (so inserting needs no second probe).
 */
function probe(
  slots: Int32Array,
  arena: Uint8Array,
  start: Int32Array,
  length: Int32Array,
  buf: Uint8Array,
  from: number,
  to: number,
): number {
  const mask = slots.length - 1, len = to - from;
  for (let i = hashBytes(buf, from, to) & mask;; i = (i + 1) & mask) {
    const r = slots[i] - 1;
    if (r < 0) return -1 - i;
    if (length[r] !== len) continue;
    const s = start[r];
    let k = 0;
    while (k < len && arena[s + k] === buf[from + k]) k++;
    if (k === len) return r;
  }
}

/**
 * Parses `tiktoken.model` (bytes, or text for tests) into a {@link RankTable}. Throws
 * K3Error (exit 1) naming the 1-based line of the first malformed line, duplicate rank or
 * duplicate token bytes. Blank lines are skipped and CRLF is accepted, as in tiktoken.
 */
export function parseTiktokenModel(
  data: Uint8Array | string,
  what = "tiktoken.model",
): RankTable {
  const src = typeof data === "string" ? new TextEncoder().encode(data) : data;
  const n = src.length;
  let lines = 1;
  for (let i = 0; i < n; i++) if (src[i] === LF) lines++;
  // Base64 is 4 chars per 3 bytes, so the arena never outgrows 3/4 of the file.
  const arena = new Uint8Array(Math.ceil(n * 0.75) + 3);
  let cap = 1024;
  while (cap < lines * 2) cap *= 2; // load factor <= 1/2: short probe runs
  const slots = new Int32Array(cap);
  const start = new Int32Array(Math.max(lines, 256)).fill(-1);
  const length = new Int32Array(start.length);
  let size = 0, top = 0, used = 0, lineNo = 0, pos = 0;
  const show = (a: number, b: number) =>
    JSON.stringify(new TextDecoder("latin1").decode(src.subarray(a, Math.min(b, a + 60))));
  while (pos < n) {
    lineNo++;
    let end = src.indexOf(LF, pos);
    if (end < 0) end = n;
    const next = end + 1;
    if (end > pos && src[end - 1] === CR) end--;
    if (end === pos) {
      pos = next;
      continue;
    }
    const bad = (why: string) => new K3Error(`${what} line ${lineNo}: ${why}`, EXIT.runtime);
    if (end - pos > MAX_RANK_LINE) throw bad(`line of ${end - pos} bytes, at most ${MAX_RANK_LINE}`);
    const sp = src.indexOf(SPACE, pos);
    if (sp < 0 || sp >= end || src.subarray(sp + 1, end).includes(SPACE)) {
      throw bad(`expected "base64 rank", got ${show(pos, end)}`);
    }
    // Base64, strictly: whole groups of 4, `=` padding only at the very end.
    if (sp === pos || (sp - pos) % 4 !== 0) throw bad(`bad base64 ${show(pos, sp)}`);
    const tokenStart = used;
    for (let i = pos; i < sp; i += 4) {
      const c0 = src[i], c1 = src[i + 1], c2 = src[i + 2], c3 = src[i + 3];
      const v0 = c0 < 128 ? B64[c0] : -1, v1 = c1 < 128 ? B64[c1] : -1;
      const v2 = c2 < 128 ? B64[c2] : -1, v3 = c3 < 128 ? B64[c3] : -1;
      const last = i + 4 === sp;
      if (v0 < 0 || v1 < 0) throw bad(`bad base64 ${show(pos, sp)}`);
      arena[used++] = (v0 << 2) | (v1 >> 4);
      if (v2 >= 0) {
        arena[used++] = ((v1 & 15) << 4) | (v2 >> 2);
        if (v3 >= 0) arena[used++] = ((v2 & 3) << 6) | v3;
        else if (!(last && c3 === EQ)) throw bad(`bad base64 ${show(pos, sp)}`);
      } else if (!(last && c2 === EQ && c3 === EQ)) throw bad(`bad base64 ${show(pos, sp)}`);
    }
    // Rank: decimal digits only, small enough to index an array.
    const digits = end - sp - 1;
    let rank = digits === 0 || digits > 9 ? -1 : 0;
    for (let i = sp + 1; i < end && rank >= 0; i++) {
      const d = src[i] - 0x30;
      rank = d >= 0 && d <= 9 ? rank * 10 + d : -1;
    }
    if (rank < 0) throw bad(`rank is not a non-negative integer: ${show(sp + 1, end)}`);
    // Ranks are dense (0..n-1 over n lines), so one past the line count is already wrong:
    // refused here, before anything is sized by a rank.
    if (rank >= lines) throw bad(`rank ${rank} is beyond the ${lines} lines of the file (ranks must be 0..n-1)`);
    if (start[rank] >= 0) throw bad(`duplicate rank ${rank}`);
    const found = probe(slots, arena, start, length, arena, tokenStart, used);
    if (found >= 0) throw bad(`duplicate token bytes (also rank ${found})`);
    slots[-1 - found] = rank + 1;
    start[rank] = tokenStart;
    length[rank] = used - tokenStart;
    size++;
    if (rank >= top) top = rank + 1;
    pos = next;
  }
  if (top !== size) {
    throw new K3Error(
      `${what}: ranks are not dense: ${size} ranks but the largest is ${top - 1} (rank ${
        start.indexOf(-1)
      } is missing)`,
    );
  }
  return new RankTable(arena, start.subarray(0, top), length.subarray(0, top), size, slots);
}

/**
 * Parses the `added_tokens_decoder` of a `tokenizer_config.json`. Throws K3Error (exit 1)
 * on a malformed entry.
 */
export function parseAddedTokens(json: string, what = "tokenizer_config.json"): AddedToken[] {
  let config: any;
  try {
    config = JSON.parse(json);
  } catch (e) {
    throw new K3Error(`${what}: not JSON (${(e as Error).message})`);
  }
  const decoder = config?.added_tokens_decoder ?? {};
  if (typeof decoder !== "object" || Array.isArray(decoder)) {
    throw new K3Error(`${what}: added_tokens_decoder is not an object`);
  }
  const out: AddedToken[] = [];
  for (const [key, value] of Object.entries(decoder as Record<string, any>)) {
    const id = Number(key);
    if (!RANK_RE.test(key) || typeof value?.content !== "string" || value.content === "") {
      throw new K3Error(`${what}: bad added_tokens_decoder entry ${JSON.stringify(key)}`);
    }
    out.push({ id, content: value.content, special: value.special !== false });
  }
  return out.sort((a, b) => a.id - b.id);
}

/** Escapes `s` for use as a literal inside a `v`-flag regex. */
function escapeRegex(s: string): string {
  return s.replace(/[\\^$.*+?()[\]{}|\/]/g, (c) => `\\${c}`);
}

/**
 * Rank BPE of a long piece in O(n log n): the same merges as the linear scan (lowest rank
 * first, leftmost on ties), found with a binary heap of candidate pairs keyed by
 * (rank, start offset) and discarded lazily once a neighbour has changed.
 */
function bytePairEncodeLong(table: RankTable, byteRank: Int32Array, buf: Uint8Array): number[] {
  const n = buf.length;
  // Parts form a linked list by start offset; next[p] is the start of the part after p.
  const next = new Int32Array(n + 1);
  const prev = new Int32Array(n + 1);
  const rank = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1;
    prev[i] = i - 1;
    rank[i] = byteRank[buf[i]];
  }
  next[n] = -1;
  // Heap entries: (pair rank, left start, right start, right end) in parallel arrays.
  let hr = new Int32Array(n), hp = new Int32Array(n), hq = new Int32Array(n);
  let he = new Int32Array(n), size = 0;
  const less = (a: number, b: number) => hr[a] < hr[b] || (hr[a] === hr[b] && hp[a] < hp[b]);
  const swap = (a: number, b: number) => {
    [hr[a], hr[b]] = [hr[b], hr[a]];
    [hp[a], hp[b]] = [hp[b], hp[a]];
    [hq[a], hq[b]] = [hq[b], hq[a]];
    [he[a], he[b]] = [he[b], he[a]];
  };
  const push = (p: number) => {
    const q = next[p];
    if (q < 0 || q >= n) return;
    const e = next[q];
    const r = table.find(buf, p, e);
    if (r < 0) return;
    if (size === hr.length) {
      const grow = (a: Int32Array) => {
        const b = new Int32Array(a.length * 2);
        b.set(a);
        return b;
      };
      [hr, hp, hq, he] = [grow(hr), grow(hp), grow(hq), grow(he)];
    }
    let i = size++;
    hr[i] = r, hp[i] = p, hq[i] = q, he[i] = e;
    while (i > 0 && less(i, (i - 1) >> 1)) {
      swap(i, (i - 1) >> 1);
      i = (i - 1) >> 1;
    }
  };
  const pop = () => {
    swap(0, --size);
    for (let i = 0;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < size && less(l, m)) m = l;
      if (r < size && less(r, m)) m = r;
      if (m === i) break;
      swap(i, m);
      i = m;
    }
  };
  const alive = new Uint8Array(n).fill(1);
  for (let i = 0; i + 1 < n; i++) push(i);
  while (size > 0) {
    const r = hr[0], p = hp[0], q = hq[0], e = he[0];
    pop();
    // Stale unless both parts are still exactly as they were when the pair was pushed.
    if (!alive[p] || next[p] !== q || !alive[q] || next[q] !== e) continue;
    rank[p] = r;
    alive[q] = 0;
    next[p] = e;
    if (e < n) prev[e] = p;
    push(p);
    if (prev[p] >= 0) push(prev[p]);
  }
  const ids: number[] = [];
  for (let p = 0; p < n; p = next[p]) ids.push(rank[p]);
  return ids;
}

/** Byte-level rank BPE of K3, loaded from a tiktoken-format vocabulary. */
export class Tokenizer {
  readonly #table: RankTable;
  /** Rank of each single byte: where BPE starts. */
  readonly #byteRank = new Int32Array(256);
  readonly #vocabSize: number;
  /** Ids below this decode (as a placeholder when unnamed); see {@link forModel}. */
  #decodeLimit: number;
  readonly #added: AddedToken[];
  readonly #addedByContent = new Map<string, number>();
  readonly #addedBytes = new Map<number, Uint8Array>();
  /** Matches any added token's content; null when there are none. */
  readonly #specialRe: RegExp | null;
  readonly #pieceRe = k3Pattern();
  /** Piece (as text) -> its ids: a number for the common one-token piece. */
  readonly #cache = new Map<string, number | number[]>();
  readonly #encoder = new TextEncoder();
  // Scratch space reused by every piece: UTF-8 bytes, part starts, part and pair ranks.
  #buf = new Uint8Array(256);
  #starts = new Int32Array(256);
  #partRank = new Int32Array(256);
  #pairRank = new Int32Array(256);

  /**
   * Builds a tokenizer from parsed ranks and added tokens. Throws K3Error if an added id
   * collides with a rank, or if the ranks lack a single byte (BPE could not start).
   */
  constructor(table: RankTable, added: AddedToken[] = []) {
    this.#table = table;
    const one = new Uint8Array(1);
    for (let b = 0; b < 256; b++) {
      one[0] = b;
      const r = table.find(one, 0, 1);
      if (r < 0) throw new K3Error(`vocabulary lacks the single byte 0x${b.toString(16)}`);
      this.#byteRank[b] = r;
    }
    let size = table.start.length;
    for (const t of added) {
      if (t.id < table.start.length && table.start[t.id] >= 0) {
        throw new K3Error(`added token ${JSON.stringify(t.content)} reuses rank ${t.id}`);
      }
      this.#addedBytes.set(t.id, this.#encoder.encode(t.content));
      this.#addedByContent.set(t.content, t.id);
      if (t.id >= size) size = t.id + 1;
    }
    this.#vocabSize = size;
    this.#decodeLimit = size;
    this.#added = added;
    // Longest first, so that a token that prefixes another cannot shadow it.
    const contents = added.map((t) => t.content).sort((a, b) => b.length - a.length);
    this.#specialRe = contents.length > 0 ? new RegExp(contents.map(escapeRegex).join("|"), "gv") : null;
  }

  /**
   * Loads `tiktoken.model` and, when present, `tokenizer_config.json` from `dir`.
   * Throws K3Error (exit 1) on a missing or malformed vocabulary.
   */
  static load(dir: string): Tokenizer {
    expectDirectory(dir, "a tokenizer directory", "tiktoken.model");
    const modelPath = `${dir}/tiktoken.model`;
    const model = readInput(modelPath, { what: "the vocabulary", maxBytes: MAX_TOKENIZER_FILE });
    const table = parseTiktokenModel(model, modelPath);
    const configPath = `${dir}/tokenizer_config.json`;
    let added: AddedToken[] = [];
    // Optional (a bare rank table has no added tokens), but when present it must be a
    // regular file: a FIFO or directory there is refused, never read.
    if (notRegular(configPath) !== "no such file") {
      const configText = readInputText(configPath, { what: "tokenizer_config.json", maxBytes: MAX_TOKENIZER_FILE });
      added = parseAddedTokens(configText, configPath);
    }
    return new Tokenizer(table, added);
  }

  /** Number of ids: one past the largest rank or added id. */
  get vocabSize(): number {
    return this.#vocabSize;
  }

  /**
   * Binds the tokenizer to a model's vocabulary of `vocab` ids: from then on decoding
   * accepts every id below `vocab` (and below the tokenizer's own size), and one that no
   * rank or added token names decodes as {@link unnamedIdText}. Returns those unnamed
   * ids as inclusive `[first, last]` ranges (empty when the tokenizer covers `vocab`).
   */
  forModel(vocab: number): [number, number][] {
    this.#decodeLimit = Math.max(this.#vocabSize, vocab);
    const t = this.#table, ranges: [number, number][] = [];
    for (let id = 0; id < vocab; id++) {
      if ((id < t.start.length && t.start[id] >= 0) || this.#addedBytes.has(id)) continue;
      const last = ranges[ranges.length - 1];
      if (last && last[1] === id - 1) last[1] = id;
      else ranges.push([id, id]);
    }
    return ranges;
  }

  /** Number of BPE ranks (excluding added tokens). */
  get rankCount(): number {
    return this.#table.size;
  }

  /** The added tokens, by ascending id. */
  get addedTokens(): readonly AddedToken[] {
    return this.#added;
  }

  /** Id of the added token whose content is `content`; throws K3Error if there is none. */
  specialId(content: string): number {
    const id = this.#addedByContent.get(content);
    if (id === undefined) throw new K3Error(`vocabulary has no added token ${content}`);
    return id;
  }

  /** True when `id` is an added token (e.g. `[EOS]`, `<|open|>`). */
  isAdded(id: number): boolean {
    return this.#addedBytes.has(id);
  }

  /**
   * Encodes `text` to ids. Added tokens are recognised only with `allowSpecial`;
   * otherwise `<|open|>` in the text is ordinary bytes. Lone surrogates are encoded as
   * U+FFFD, as TextEncoder (and the WASM tiktoken) does.
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    if (!text.isWellFormed()) text = text.toWellFormed();
    if (text.length <= MAX_RUN) return this.#encodeChunk(text, options);
    const out: number[] = [];
    for (const chunk of referenceChunks(text)) {
      for (const id of this.#encodeChunk(chunk, options)) out.push(id);
    }
    return out;
  }

  /** Encodes one chunk of {@link referenceChunks}: added tokens, then ordinary text. */
  #encodeChunk(text: string, options: EncodeOptions): number[] {
    const out: number[] = [];
    const re = this.#specialRe;
    if (!options.allowSpecial || re === null) {
      this.#encodeOrdinary(text, out);
      return out;
    }
    re.lastIndex = 0;
    let start = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      if (m.index > start) this.#encodeOrdinary(text.slice(start, m.index), out);
      out.push(this.#addedByContent.get(m[0])!);
      start = m.index + m[0].length;
    }
    if (start < text.length) this.#encodeOrdinary(start === 0 ? text : text.slice(start), out);
    return out;
  }

  /** Pre-tokenizes and BPE-encodes `text` (no added tokens), appending ids to `out`. */
  #encodeOrdinary(text: string, out: number[]): void {
    const re = this.#pieceRe;
    const cache = this.#cache;
    re.lastIndex = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      const piece = m[0];
      const hit = cache.get(piece);
      if (hit !== undefined) {
        if (typeof hit === "number") out.push(hit);
        else for (let i = 0; i < hit.length; i++) out.push(hit[i]);
        continue;
      }
      const n = this.#utf8(piece);
      // A piece that is itself a token is one id, even if merges could not reach it:
      // the reference implementation takes this shortcut, so parity requires it.
      const whole = this.#table.find(this.#buf, 0, n);
      const ids = whole >= 0
        ? whole
        : n <= LONG_PIECE
        ? this.#bytePairEncode(n)
        : bytePairEncodeLong(this.#table, this.#byteRank, this.#buf.subarray(0, n));
      if (cache.size >= CACHE_LIMIT) cache.clear();
      cache.set(piece, ids);
      if (typeof ids === "number") out.push(ids);
      else for (let i = 0; i < ids.length; i++) out.push(ids[i]);
    }
  }

  /** Writes the UTF-8 bytes of `piece` to the scratch buffer; returns their count. */
  #utf8(piece: string): number {
    if (this.#buf.length < piece.length * 3) this.#grow(piece.length * 3);
    const buf = this.#buf;
    for (let i = 0; i < piece.length; i++) {
      const c = piece.charCodeAt(i);
      if (c >= 0x80) return this.#encoder.encodeInto(piece, buf).written;
      buf[i] = c; // ASCII is its own UTF-8, the common case
    }
    return piece.length;
  }

  #grow(n: number): void {
    this.#buf = new Uint8Array(n);
    this.#starts = new Int32Array(n + 1);
    this.#partRank = new Int32Array(n + 1);
    this.#pairRank = new Int32Array(n + 1);
  }

  /**
   * Rank BPE of the `n` bytes in the scratch buffer: repeatedly merge the adjacent pair
   * whose concatenation has the lowest rank (the leftmost on ties). Pieces are short, so
   * a linear scan for the minimum beats a heap.
   */
  #bytePairEncode(n: number): number[] {
    const table = this.#table, buf = this.#buf;
    const starts = this.#starts, part = this.#partRank, pair = this.#pairRank;
    const NONE = 0x7fffffff;
    // Part j is buf[starts[j]..starts[j+1]); pair j joins parts j and j+1.
    for (let i = 0; i < n; i++) {
      starts[i] = i;
      part[i] = this.#byteRank[buf[i]];
    }
    starts[n] = n;
    for (let i = 0; i + 1 < n; i++) {
      const r = table.find(buf, i, i + 2);
      pair[i] = r >= 0 ? r : NONE;
    }
    let parts = n;
    for (;;) {
      let best = NONE, at = -1;
      for (let j = 0; j + 1 < parts; j++) {
        if (pair[j] < best) {
          best = pair[j];
          at = j;
        }
      }
      if (at < 0) break;
      part[at] = best;
      part.copyWithin(at + 1, at + 2, parts);
      starts.copyWithin(at + 1, at + 2, parts + 1);
      pair.copyWithin(at, at + 1, parts - 1);
      parts--;
      if (at + 1 < parts) {
        const r = table.find(buf, starts[at], starts[at + 2]);
        pair[at] = r >= 0 ? r : NONE;
      }
      if (at > 0) {
        const r = table.find(buf, starts[at - 1], starts[at + 1]);
        pair[at - 1] = r >= 0 ? r : NONE;
      }
    }
    return Array.from(part.subarray(0, parts));
  }

  /**
   * Bytes of `id` (a view; do not modify): its token's, or {@link unnamedIdText} for an
   * id of the vocabulary without a token; usageError (exit 2) if outside the vocabulary.
   */
  #tokenBytes(id: number): Uint8Array {
    const t = this.#table;
    if (Number.isInteger(id) && id >= 0 && id < t.start.length && t.start[id] >= 0) {
      return t.arena.subarray(t.start[id], t.start[id] + t.length[id]);
    }
    const added = this.#addedBytes.get(id);
    if (added !== undefined) return added;
    if (Number.isInteger(id) && id >= 0 && id < this.#decodeLimit) return this.#encoder.encode(unnamedIdText(id));
    throw usageError(`token id ${id} is outside the vocabulary (0..${this.#decodeLimit - 1})`);
  }

  /**
   * The bytes of `ids`, concatenated (an id without a token as {@link unnamedIdText}).
   * Throws usageError for an id outside the vocabulary.
   */
  decodeBytes(ids: ArrayLike<number>): Uint8Array {
    const pieces: Uint8Array[] = new Array(ids.length);
    let total = 0;
    for (let i = 0; i < ids.length; i++) {
      pieces[i] = this.#tokenBytes(ids[i]);
      total += pieces[i].length;
    }
    const out = new Uint8Array(total);
    let off = 0;
    for (const p of pieces) {
      out.set(p, off);
      off += p.length;
    }
    return out;
  }

  /**
   * The text of `ids`. Invalid UTF-8 (a model may emit any bytes) becomes U+FFFD; an id
   * without a token is {@link unnamedIdText}. Throws usageError for an id outside the
   * vocabulary (the tokenizer's, or the model's after {@link forModel}).
   */
  decode(ids: ArrayLike<number>): string {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(this.decodeBytes(ids));
  }

  /** A decoder for ids arriving one at a time; see {@link StreamDecoder}. */
  streamDecoder(): StreamDecoder {
    return new StreamDecoder((id) => this.#tokenBytes(id));
  }
}

/**
 * Turns ids into text as they arrive, never emitting half a UTF-8 character: bytes of an
 * incomplete character are held until the rest arrives (or {@link flush} gives up on them
 * as U+FFFD).
 */
export class StreamDecoder {
  readonly #bytesOf: (id: number) => Uint8Array;
  // ignoreBOM: a U+FEFF the model writes is text, not a byte-order mark to drop.
  readonly #utf8 = new TextDecoder("utf-8", { ignoreBOM: true });

  /** Use {@link Tokenizer.streamDecoder}. */
  constructor(bytesOf: (id: number) => Uint8Array) {
    this.#bytesOf = bytesOf;
  }

  /** Text completed by `id` (often "", when it ends mid-character). */
  push(id: number): string {
    return this.#utf8.decode(this.#bytesOf(id), { stream: true });
  }

  /** Text still held back, with an unfinished character as U+FFFD; resets the decoder. */
  flush(): string {
    return this.#utf8.decode();
  }
}
