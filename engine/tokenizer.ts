/**
 * Kimi K3's tokenizer: byte-level rank BPE over a tiktoken-format vocabulary, with K3's
 * pre-tokenizer, its added (special) tokens, and decoders for whole and streamed output.
 *
 * A directory holds `tiktoken.model` (one `base64(bytes) rank` per line) and, optionally,
 * `tokenizer_config.json` whose `added_tokens_decoder` maps ids to `{content, special}`.
 *
 * Token bytes are kept as "byte strings" (one char per byte): a Map keyed by them is the
 * cheapest exact lookup JavaScript offers, and ASCII text is already its own byte string.
 *
 * @module
 */

import { EXIT, K3Error, usageError } from "./errors.ts";
import { k3Pattern } from "./pretokenize.ts";
import { byteStringToBytes, utf8ByteString } from "./utf8.ts";

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
  id: number;
  content: string;
  special: boolean;
}

const BASE64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const RANK_RE = /^[0-9]+$/;
/** Bound on the piece cache, so a long run over varied text cannot grow it forever. */
const CACHE_LIMIT = 1 << 16;

/**
 * Parses `tiktoken.model` text into a Map from token byte string to rank. Throws K3Error
 * (exit 1) naming the 1-based line of a malformed line, a duplicate rank or duplicate
 * token bytes. Blank lines are skipped, as tiktoken does.
 */
export function parseTiktokenModel(text: string, what = "tiktoken.model"): Map<string, number> {
  const ranks = new Map<string, number>();
  let seenRank = new Uint8Array(1 << 18); // a bitmap beats a Set<number> here
  let lineNo = 0;
  let pos = 0;
  while (pos < text.length) {
    let end = text.indexOf("\n", pos);
    if (end < 0) end = text.length;
    lineNo++;
    let line = text.slice(pos, end);
    pos = end + 1;
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line.length === 0) continue;
    const bad = (why: string) => new K3Error(`${what} line ${lineNo}: ${why}`, EXIT.runtime);
    const sp = line.indexOf(" ");
    if (sp < 0 || line.indexOf(" ", sp + 1) >= 0) {
      throw bad(`expected "base64 rank", got ${JSON.stringify(line.slice(0, 60))}`);
    }
    const b64 = line.slice(0, sp);
    const rankText = line.slice(sp + 1);
    if (b64.length === 0 || !BASE64_RE.test(b64)) {
      throw bad(`bad base64 ${JSON.stringify(b64.slice(0, 60))}`);
    }
    if (!RANK_RE.test(rankText) || rankText.length > 9) {
      throw bad(`rank is not a non-negative integer: ${JSON.stringify(rankText.slice(0, 60))}`);
    }
    const rank = Number(rankText);
    if (rank >= seenRank.length) {
      const grown = new Uint8Array(Math.max(rank + 1, seenRank.length * 2));
      grown.set(seenRank);
      seenRank = grown;
    }
    if (seenRank[rank]) throw bad(`duplicate rank ${rank}`);
    seenRank[rank] = 1;
    const bytes = atob(b64); // a byte string already: exactly the Map key we want
    const before = ranks.size;
    ranks.set(bytes, rank);
    if (ranks.size === before) throw bad(`duplicate token bytes`);
  }
  return ranks;
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

/** Byte-level rank BPE of K3, loaded from a tiktoken-format vocabulary. */
export class Tokenizer {
  /** Token byte string -> rank, for the BPE ranks only (not the added tokens). */
  readonly #ranks: Map<string, number>;
  /** Id -> token byte string, for ranks and added tokens; undefined marks a hole. */
  readonly #bytesOf: (string | undefined)[];
  readonly #added: AddedToken[];
  readonly #addedByContent = new Map<string, number>();
  /** Matches any added token's content; null when there are none. */
  readonly #specialRe: RegExp | null;
  readonly #pieceRe = k3Pattern();
  /** Piece (as text) -> its ids: a number for the common one-token piece. */
  #cache = new Map<string, number | number[]>();

  /**
   * Builds a tokenizer from parsed ranks and added tokens. Throws K3Error if an added id
   * collides with a rank, or if the ranks lack a single byte (BPE could not start).
   */
  constructor(ranks: Map<string, number>, added: AddedToken[] = []) {
    this.#ranks = ranks;
    let size = 0;
    for (const r of ranks.values()) if (r >= size) size = r + 1;
    for (const t of added) if (t.id >= size) size = t.id + 1;
    const bytesOf = new Array<string | undefined>(size).fill(undefined);
    for (const [bytes, r] of ranks) bytesOf[r] = bytes;
    for (const t of added) {
      if (bytesOf[t.id] !== undefined) {
        throw new K3Error(`added token ${JSON.stringify(t.content)} reuses id ${t.id}`);
      }
      bytesOf[t.id] = utf8ByteString(t.content);
      this.#addedByContent.set(t.content, t.id);
    }
    for (let b = 0; b < 256; b++) {
      if (!ranks.has(String.fromCharCode(b))) {
        throw new K3Error(`vocabulary lacks the single byte 0x${b.toString(16)}`);
      }
    }
    this.#bytesOf = bytesOf;
    this.#added = added;
    // Longest first, so that a token that prefixes another cannot shadow it.
    const contents = added.map((t) => t.content).sort((a, b) => b.length - a.length);
    this.#specialRe = contents.length > 0
      ? new RegExp(contents.map(escapeRegex).join("|"), "gv")
      : null;
  }

  /**
   * Loads `tiktoken.model` and, when present, `tokenizer_config.json` from `dir`.
   * Throws K3Error (exit 1) on a missing or malformed vocabulary.
   */
  static load(dir: string): Tokenizer {
    const modelPath = `${dir}/tiktoken.model`;
    let modelText: string;
    try {
      // latin1: any byte maps to a char, so a stray non-ASCII byte is reported by line.
      modelText = new TextDecoder("latin1").decode(Deno.readFileSync(modelPath));
    } catch (e) {
      throw new K3Error(`cannot read ${modelPath}: ${(e as Error).message}`);
    }
    const ranks = parseTiktokenModel(modelText, modelPath);
    const configPath = `${dir}/tokenizer_config.json`;
    let added: AddedToken[] = [];
    let configText: string | undefined;
    try {
      configText = Deno.readTextFileSync(configPath);
    } catch {
      configText = undefined; // optional: a bare rank table has no added tokens
    }
    if (configText !== undefined) added = parseAddedTokens(configText, configPath);
    return new Tokenizer(ranks, added);
  }

  /** Number of ids: one past the largest rank or added id. */
  get vocabSize(): number {
    return this.#bytesOf.length;
  }

  /** Number of BPE ranks (excluding added tokens). */
  get rankCount(): number {
    return this.#ranks.size;
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
    return this.#added.some((t) => t.id === id);
  }

  /**
   * Encodes `text` to ids. Added tokens are recognised only with `allowSpecial`;
   * otherwise `<|open|>` in the text is ordinary bytes. Lone surrogates are encoded as
   * U+FFFD, as TextEncoder (and the WASM tiktoken) does.
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    if (!text.isWellFormed()) text = text.toWellFormed();
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
      const bytes = utf8ByteString(piece);
      // A piece that is itself a token is one id, even if merges could not reach it:
      // the reference implementation takes this shortcut, so parity requires it.
      const whole = this.#ranks.get(bytes);
      const ids = whole !== undefined ? whole : this.#bytePairEncode(bytes);
      if (cache.size >= CACHE_LIMIT) cache.clear();
      cache.set(piece, ids);
      if (typeof ids === "number") out.push(ids);
      else for (let i = 0; i < ids.length; i++) out.push(ids[i]);
    }
  }

  /**
   * Rank BPE of one piece: repeatedly merge the adjacent pair whose concatenation has
   * the lowest rank (the leftmost on ties). Pieces are short, so a linear scan for the
   * minimum beats a heap.
   */
  #bytePairEncode(bytes: string): number[] {
    const ranks = this.#ranks;
    const n = bytes.length;
    // starts[j] is where part j begins; pair j joins parts j and j+1.
    const starts: number[] = new Array(n + 1);
    for (let i = 0; i <= n; i++) starts[i] = i;
    const pair: number[] = new Array(n - 1);
    for (let i = 0; i < n - 1; i++) pair[i] = ranks.get(bytes.slice(i, i + 2)) ?? Infinity;
    const rankOf = (j: number) => ranks.get(bytes.slice(starts[j], starts[j + 2])) ?? Infinity;
    for (;;) {
      let best = Infinity;
      let at = -1;
      for (let j = 0; j < pair.length; j++) {
        if (pair[j] < best) {
          best = pair[j];
          at = j;
        }
      }
      if (at < 0) break;
      starts.splice(at + 1, 1);
      pair.splice(at, 1);
      if (at < pair.length) pair[at] = rankOf(at);
      if (at > 0) pair[at - 1] = rankOf(at - 1);
    }
    const ids: number[] = new Array(starts.length - 1);
    for (let j = 0; j < ids.length; j++) {
      ids[j] = ranks.get(bytes.slice(starts[j], starts[j + 1]))!;
    }
    return ids;
  }

  /** Byte string of `id`; throws usageError (exit 2) for an id outside the vocabulary. */
  #tokenBytes(id: number): string {
    const s = Number.isInteger(id) ? this.#bytesOf[id] : undefined;
    if (s === undefined) {
      throw usageError(`token id ${id} is outside the vocabulary (0..${this.vocabSize - 1})`);
    }
    return s;
  }

  /** The bytes of `ids`, concatenated. Throws usageError for an id outside the vocabulary. */
  decodeBytes(ids: ArrayLike<number>): Uint8Array {
    let out = "";
    for (let i = 0; i < ids.length; i++) out += this.#tokenBytes(ids[i]);
    return byteStringToBytes(out);
  }

  /**
   * The text of `ids`. Invalid UTF-8 (a model may emit any bytes) becomes U+FFFD.
   * Throws usageError for an id outside the vocabulary.
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
  readonly #bytesOf: (id: number) => string;
  // ignoreBOM: a U+FEFF the model writes is text, not a byte-order mark to drop.
  #utf8 = new TextDecoder("utf-8", { ignoreBOM: true });

  /** Use {@link Tokenizer.streamDecoder}. */
  constructor(bytesOf: (id: number) => string) {
    this.#bytesOf = bytesOf;
  }

  /** Text completed by `id` (often "", when it ends mid-character). */
  push(id: number): string {
    return this.#utf8.decode(byteStringToBytes(this.#bytesOf(id)), { stream: true });
  }

  /** Text still held back, with an unfinished character as U+FFFD; resets the decoder. */
  flush(): string {
    return this.#utf8.decode();
  }
}
