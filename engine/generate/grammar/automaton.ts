/**
 * The automaton constrained decoding walks: a nondeterministic pushdown machine over
 * symbols, where a symbol is a byte (0-255) or a special token (`SPECIAL_BASE + id`: an
 * added token such as `<|open|>` is one symbol, never the bytes of its text).
 *
 * A state is a list of threads (one per live alternative of an `anyOf`, a type list or an
 * `enum`); a thread is a persistent stack of immutable frames, so stepping a candidate
 * token's bytes shares everything below the top and a rejected candidate costs nothing to
 * undo. A frame's `step` pushes the stacks that follow it on one symbol; a frame that may
 * end here (a number's digits, optional whitespace) also lets the frame below try the
 * symbol. The machine has no other state, so the tokens it allows are a pure function of
 * the symbols it has read.
 *
 * Grammar nodes ({@link GNode}) describe JSON values (JSON Schema compiles to them, see
 * schema.ts); literals, free text and choices build the chat forms around them (forms.ts).
 *
 * @module
 */

/** Symbols from here up are special tokens: `SPECIAL_BASE + token id`. */
export const SPECIAL_BASE = 256;

/** A JSON value the grammar accepts. `tight`: whitespace between its tokens (and before
 * it) is at most one space per gap, as in the canonical `json.dumps` text the model was
 * trained on (the forced tool-call arguments); otherwise up to {@link MAX_WS} bytes. */
export type GNode =
  & (
    | { readonly k: "obj"; props: readonly ObjProp[]; additional: GNode | null }
    | { readonly k: "arr"; items: GNode; min: number; max: number }
    | { readonly k: "str"; min: number; max: number }
    | { readonly k: "num"; integer: boolean }
    | { readonly k: "lit"; syms: readonly number[] }
    | { readonly k: "alt"; of: GNode[] }
    | { readonly k: "ref"; target: GNode | null; name: string }
    | {
      /** A value another module reads (bounded numbers, patterned strings): `start` steps its first symbol like {@link startValue}. */
      readonly k: "ext";
      /** The JSON type of the value (a tool call writes a string raw, any other as JSON). */
      readonly type: "number" | "string";
      readonly start: (sym: number, below: Stack | null, out: Stack[]) => void;
      /** A string's frame written raw (a tool call's top-level string argument), ended by the
       * special symbol `until`; undefined: no string can be written. */
      readonly raw?: (until: number) => Frame | undefined;
    }
  )
  & { readonly tight?: boolean };

/** One declared property of an object node. */
export interface ObjProp {
  /** The property name. */
  readonly name: string;
  /** Its key as it appears between the quotes: JSON-escaped, UTF-8, one char per byte. */
  readonly key: string;
  /** The value's grammar. */
  readonly value: GNode;
  /** Whether the object must hold it. */
  readonly required: boolean;
}

/** Consecutive whitespace bytes allowed between JSON tokens (a bound, so a model cannot idle forever). */
export const MAX_WS = 32;
/** Digits of a number's integer or fraction part at most (a bound, as for whitespace). */
export const MAX_DIGITS = 16;
/** Exponent digits at most (keeps every number finite as a float64). */
export const MAX_EXP_DIGITS = 2;
/** Nesting depth of frames at most (bounds `[[[[...` of an any-JSON value). */
export const MAX_DEPTH = 64;

/** A persistent stack of frames; null is the empty stack (nothing more is allowed). */
export interface Stack {
  /** The top frame. */
  readonly top: Frame;
  /** The rest. */
  readonly below: Stack | null;
  /** Frames in the stack. */
  readonly depth: number;
}

/** A state of the machine: its live threads (empty: dead). */
export type State = readonly Stack[];

/** One frame of a thread. */
export interface Frame {
  /** Pushes to `out` every stack that follows reading `sym` with this frame on `below`. */
  step(sym: number, below: Stack | null, out: Stack[]): void;
  /**
   * A text equal for two frames only when they step alike on every symbol (with the same
   * stack below): their class and every field `step` reads, objects by identity. Two
   * frames that differ only where `step` cannot tell (a string's length between its
   * bounds) share a signature; that is what lets the state table (table.ts) merge them.
   * One exception, a free object key's bytes, is described at {@link Obj.signature}.
   */
  signature(): string;
}

const identities = new WeakMap<object, number>();
let nextIdentity = 1;

/** A number naming `o` for as long as it lives (frame keys name grammar nodes by it). */
export function identity(o: object): number {
  let id = identities.get(o);
  if (id === undefined) identities.set(o, id = nextIdentity++);
  return id;
}

/** A stack with `top` pushed on `below` (dropped when too deep: a bound, never a wrong accept). */
export function push(top: Frame, below: Stack | null): Stack {
  return { top, below, depth: (below?.depth ?? 0) + 1 };
}

/** Steps one thread by `sym` into `out`. */
export function stepStack(s: Stack | null, sym: number, out: Stack[]): void {
  if (s !== null) s.top.step(sym, s.below, out);
}

/** The state after `sym` (empty when no thread takes it). */
export function stepState(state: State, sym: number): Stack[] {
  const out: Stack[] = [];
  for (const s of state) stepStack(s, sym, out);
  return out;
}

/** Pushes `s` unless it is too deep. */
export function emit(s: Stack, out: Stack[]): void {
  if (s.depth <= MAX_DEPTH) out.push(s);
}

const QUOTE = 0x22, BACKSLASH = 0x5c, COMMA = 0x2c, COLON = 0x3a;
const LBRACE = 0x7b, RBRACE = 0x7d, LBRACKET = 0x5b, RBRACKET = 0x5d;
const MINUS = 0x2d, PLUS = 0x2b, DOT = 0x2e, ZERO = 0x30, NINE = 0x39;

function isWs(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}
/** Whether whitespace `sym` may follow `ws` whitespace bytes in a gap of `node`. */
function wsRoom(node: GNode, ws: number, sym: number): boolean {
  return node.tight ? ws < 1 && sym === 0x20 : ws < MAX_WS;
}
function isDigit(b: number): boolean {
  return b >= ZERO && b <= NINE;
}
function isHex(b: number): boolean {
  return isDigit(b) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66);
}

/** Exactly `syms` from position `i` on. */
export class Lit implements Frame {
  /** Matches `syms[i..]`. */
  constructor(readonly syms: readonly number[], readonly i = 0) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym !== this.syms[this.i]) return;
    if (this.i + 1 === this.syms.length) {
      if (below !== null) out.push(below);
      else out.push(DONE);
    } else out.push(push(new Lit(this.syms, this.i + 1), below));
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `L${identity(this.syms)},${this.i}`;
  }
}

/** The stack a thread has after its last symbol: it allows nothing more. */
export const DONE: Stack = { top: { step() {}, signature: () => "D" }, below: null, depth: 1 };

/** Optional whitespace (at most {@link MAX_WS} bytes); may end anywhere. */
export class Ws implements Frame {
  /** `n` whitespace bytes read so far. */
  constructor(readonly n = 0) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (isWs(sym) && this.n < MAX_WS) out.push(push(new Ws(this.n + 1), below));
    stepStack(below, sym, out);
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `W${this.n}`;
  }
}

/** Free text: any byte, until the special symbol `until` (consumed). Other special tokens are refused. */
export class FreeText implements Frame {
  /** Ends at `until`. */
  constructor(readonly until: number) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym < SPECIAL_BASE) out.push(push(this, below));
    else if (sym === this.until) out.push(below ?? DONE);
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `F${this.until}`;
  }
}

/** One of several continuations, each a function building its stack on what lies below. */
export class Choice implements Frame {
  /** Tries every stack `alternatives(below)` gives. */
  constructor(readonly alternatives: (below: Stack | null) => Stack[]) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    for (const s of this.alternatives(below)) stepStack(s, sym, out);
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `C${identity(this.alternatives)}`;
  }
}

/** A JSON value of `node`, after optional whitespace. */
export class Value implements Frame {
  /** `ws` whitespace bytes read before the value so far. */
  constructor(readonly node: GNode, readonly ws = 0) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (isWs(sym)) {
      if (wsRoom(this.node, this.ws, sym)) out.push(push(new Value(this.node, this.ws + 1), below));
      return;
    }
    startValue(this.node, sym, below, out, 0);
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `V${identity(this.node)},${this.ws}`;
  }
}

/** Starts a value of `node` on its first (non-whitespace) symbol. */
export function startValue(node: GNode, sym: number, below: Stack | null, out: Stack[], hops: number): void {
  switch (node.k) {
    case "obj":
      if (sym === LBRACE) emit(push(new Obj(node, O_FIRST, "", [], -1, 0, "", 0), below), out);
      return;
    case "arr":
      if (sym === LBRACKET) emit(push(new Arr(node, A_FIRST, 0, 0), below), out);
      return;
    case "str":
      if (sym === QUOTE) emit(push(new Str(node.min, node.max, 0, 0, 0, 0, 0, false), below), out);
      return;
    case "num":
      if (sym === MINUS) out.push(push(new Num(node.integer, N_MINUS, 0), below));
      else if (sym === ZERO) out.push(push(new Num(node.integer, N_ZERO, 1), below));
      else if (isDigit(sym)) out.push(push(new Num(node.integer, N_INT, 1), below));
      return;
    case "lit":
      new Lit(node.syms).step(sym, below, out);
      return;
    case "alt":
      for (const n of node.of) startValue(n, sym, below, out, hops + 1);
      return;
    case "ext":
      node.start(sym, below, out);
      return;
    case "ref":
      // A reference cycle that reads nothing is refused when the schema is compiled; the
      // bound is a second line of defence.
      if (node.target !== null && hops < 64) startValue(node.target, sym, below, out, hops + 1);
      return;
  }
}

const N_MINUS = 0, N_ZERO = 1, N_INT = 2, N_DOT = 3, N_FRAC = 4, N_E = 5, N_ESIGN = 6, N_EXP = 7;

/** A JSON number (an integer: no fraction, no exponent), digits bounded by {@link MAX_DIGITS}. */
export class Num implements Frame {
  /** In `phase` with `n` digits in the current part. */
  constructor(readonly integer: boolean, readonly phase: number, readonly n: number) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    const p = this.phase, int = this.integer;
    const to = (phase: number, n: number) => out.push(push(new Num(int, phase, n), below));
    switch (p) {
      case N_MINUS:
        if (sym === ZERO) to(N_ZERO, 1);
        else if (isDigit(sym)) to(N_INT, 1);
        return;
      case N_ZERO:
      case N_INT:
        if (p === N_INT && isDigit(sym) && this.n < MAX_DIGITS) to(N_INT, this.n + 1);
        else if (!int && sym === DOT) to(N_DOT, 0);
        else if (!int && (sym === 0x65 || sym === 0x45)) to(N_E, 0);
        else stepStack(below, sym, out);
        return;
      case N_DOT:
        if (isDigit(sym)) to(N_FRAC, 1);
        return;
      case N_FRAC:
        if (isDigit(sym) && this.n < MAX_DIGITS) to(N_FRAC, this.n + 1);
        else if (sym === 0x65 || sym === 0x45) to(N_E, 0);
        else stepStack(below, sym, out);
        return;
      case N_E:
        if (sym === PLUS || sym === MINUS) to(N_ESIGN, 0);
        else if (isDigit(sym)) to(N_EXP, 1);
        return;
      case N_ESIGN:
        if (isDigit(sym)) to(N_EXP, 1);
        return;
      case N_EXP:
        if (isDigit(sym) && this.n < MAX_EXP_DIGITS) to(N_EXP, this.n + 1);
        else stepStack(below, sym, out);
        return;
    }
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `N${this.integer ? 1 : 0},${this.phase},${this.n}`;
  }
}

/**
 * The bytes of a JSON string body (after the opening quote): valid UTF-8, escapes, no
 * control bytes. Returns the next UTF-8/escape sub-state (`char`: `b` starts a character),
 * or null when `b` is refused. Shared by string values and free object keys.
 */
function strByte(
  b: number,
  esc: number,
  cont: number,
  lo: number,
  hi: number,
  surrogate: boolean,
  escapes: boolean,
): { esc: number; cont: number; lo: number; hi: number; surrogate: boolean; char: boolean } | null {
  if (cont > 0) {
    if (b < lo || b > hi) return null;
    return { esc: 0, cont: cont - 1, lo: 0x80, hi: 0xbf, surrogate: false, char: false };
  }
  if (esc === 1) {
    if (b === 0x75) return { esc: 5, cont: 0, lo: 0, hi: 0, surrogate: false, char: false };
    if ('"\\/bfnrt'.includes(String.fromCharCode(b))) {
      return { esc: 0, cont: 0, lo: 0, hi: 0, surrogate: false, char: false };
    }
    return null;
  }
  if (esc >= 2) {
    // \uXXXX, esc = hex digits left + 1. A surrogate (D800-DFFF) is refused: characters
    // beyond the BMP come as UTF-8, so every escape is one character for minLength/maxLength.
    if (!isHex(b)) return null;
    if (esc === 4 && surrogate && !(b >= ZERO && b <= 0x37)) return null;
    return {
      esc: esc === 2 ? 0 : esc - 1,
      cont: 0,
      lo: 0,
      hi: 0,
      surrogate: esc === 5 && (b === 0x64 || b === 0x44),
      char: false,
    };
  }
  if (b === BACKSLASH) return escapes ? { esc: 1, cont: 0, lo: 0, hi: 0, surrogate: false, char: true } : null;
  if (b < 0x20 || b === QUOTE) return null;
  if (b < 0x80) return { esc: 0, cont: 0, lo: 0, hi: 0, surrogate: false, char: true };
  if (b >= 0xc2 && b <= 0xdf) return { esc: 0, cont: 1, lo: 0x80, hi: 0xbf, surrogate: false, char: true };
  if (b === 0xe0) return { esc: 0, cont: 2, lo: 0xa0, hi: 0xbf, surrogate: false, char: true };
  if (b === 0xed) return { esc: 0, cont: 2, lo: 0x80, hi: 0x9f, surrogate: false, char: true };
  if (b >= 0xe1 && b <= 0xef) return { esc: 0, cont: 2, lo: 0x80, hi: 0xbf, surrogate: false, char: true };
  if (b === 0xf0) return { esc: 0, cont: 3, lo: 0x90, hi: 0xbf, surrogate: false, char: true };
  if (b >= 0xf1 && b <= 0xf3) return { esc: 0, cont: 3, lo: 0x80, hi: 0xbf, surrogate: false, char: true };
  if (b === 0xf4) return { esc: 0, cont: 3, lo: 0x80, hi: 0x8f, surrogate: false, char: true };
  return null;
}

/** A JSON string value with `min`..`max` characters (code points), after its opening quote. */
export class Str implements Frame {
  /** `n` characters read; the UTF-8 and escape sub-state of strByte. */
  constructor(
    readonly min: number,
    readonly max: number,
    readonly n: number,
    readonly esc: number,
    readonly cont: number,
    readonly lo: number,
    readonly hi: number,
    readonly surrogate: boolean,
  ) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym >= SPECIAL_BASE) return;
    if (sym === QUOTE && this.esc === 0 && this.cont === 0) {
      if (this.n >= this.min) out.push(below ?? DONE);
      return;
    }
    const r = strByte(sym, this.esc, this.cont, this.lo, this.hi, this.surrogate, true);
    if (r === null) return;
    const n = this.n + (r.char ? 1 : 0);
    if (n > this.max) return;
    out.push(push(new Str(this.min, this.max, n, r.esc, r.cont, r.lo, r.hi, r.surrogate), below));
  }
  /** See {@link Frame.signature}: the length only as `step` reads it (reached min? room left to max?). */
  signature(): string {
    const { min, max, n } = this;
    return `S${Math.min(n, min)},${min},${max - n},${this.esc},${this.cont},${this.lo},${this.hi},${
      this.surrogate ? 1 : 0
    }`;
  }
}

/**
 * A string written raw (not JSON-quoted), as a tool call's string argument is: `min`..`max`
 * characters of valid UTF-8 (quotes, backslashes and newlines are plain text), ended by
 * the special symbol `until` (consumed). Other special tokens are refused.
 */
export class RawStr implements Frame {
  /** `n` characters read; `cont`, `lo`, `hi`: the UTF-8 continuation sub-state of strByte. */
  constructor(
    readonly until: number,
    readonly min: number,
    readonly max: number,
    readonly n = 0,
    readonly cont = 0,
    readonly lo = 0,
    readonly hi = 0,
  ) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym === this.until) {
      if (this.cont === 0 && this.n >= this.min) out.push(below ?? DONE);
      return;
    }
    if (sym >= SPECIAL_BASE) return;
    // ASCII is any text here; other bytes go through the JSON string's UTF-8 check.
    const r = sym < 0x80 && this.cont === 0
      ? { cont: 0, lo: 0, hi: 0, char: true }
      : strByte(sym, 0, this.cont, this.lo, this.hi, false, false);
    if (r === null) return;
    const n = this.n + (r.char ? 1 : 0);
    if (n > this.max) return;
    out.push(push(new RawStr(this.until, this.min, this.max, n, r.cont, r.lo, r.hi), below));
  }
  /** See {@link Frame.signature}: the length only as `step` reads it. */
  signature(): string {
    const { min, max, n } = this;
    return `R${this.until},${Math.min(n, min)},${min},${max - n},${this.cont},${this.lo},${this.hi}`;
  }
}

const O_FIRST = 0, O_KEY = 1, O_IN_KEY = 2, O_COLON = 3, O_VALUE = 4, O_AFTER = 5;

/**
 * A JSON object of an obj node, after its `{`. Declared keys are matched against their
 * canonical (JSON.stringify) spelling, each at most once, in any order; `}` only once every
 * required key is there. Other keys (when `additional` allows them) are strings without
 * escapes (so a key's bytes are its one spelling) that no declared key and no earlier key
 * equals.
 */
export class Obj implements Frame {
  /** `seen`: '1' at each declared index already present; `free`: the other keys present;
   * `current`: the declared index of the key being read or valued (-1: a free key); `key`:
   * its bytes so far (one char per byte). */
  constructor(
    readonly node: Extract<GNode, { k: "obj" }>,
    readonly phase: number,
    readonly seen: string,
    readonly free: readonly string[],
    readonly current: number,
    readonly ws: number,
    readonly key: string,
    readonly cont: number,
  ) {}

  #with(phase: number, ws: number, key = this.key, current = this.current, cont = this.cont): Obj {
    return new Obj(this.node, phase, this.seen, this.free, current, ws, key, cont);
  }

  #isSeen(i: number): boolean {
    return this.seen.charCodeAt(i) === 0x31;
  }

  #allRequired(): boolean {
    return this.node.props.every((p, i) => !p.required || this.#isSeen(i));
  }

  #moreKeys(): boolean {
    return this.node.additional !== null || this.node.props.some((_, i) => !this.#isSeen(i));
  }

  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym >= SPECIAL_BASE) return;
    const ws = isWs(sym);
    const again = () => {
      if (wsRoom(this.node, this.ws, sym)) out.push(push(this.#with(this.phase, this.ws + 1), below));
    };
    switch (this.phase) {
      case O_FIRST:
      case O_KEY:
        if (ws) return again();
        // A key only when one can still be written: `{"` of an object with no keys left would
        // be a dead end (the mask would then allow no token at all).
        if (sym === QUOTE && this.#moreKeys()) out.push(push(this.#with(O_IN_KEY, 0, "", -1, 0), below));
        else if (sym === RBRACE && this.phase === O_FIRST && this.#allRequired()) out.push(below ?? DONE);
        return;
      case O_IN_KEY:
        return this.#keyByte(sym, below, out);
      case O_COLON:
        if (ws) return again();
        if (sym === COLON) out.push(push(this.#with(O_VALUE, 0), below));
        return;
      case O_VALUE: {
        if (ws) return again();
        const node = this.current >= 0 ? this.node.props[this.current].value : this.node.additional!;
        let seen = this.seen, free = this.free;
        if (this.current >= 0) {
          seen = seen.padEnd(this.node.props.length, "0");
          seen = seen.slice(0, this.current) + "1" + seen.slice(this.current + 1);
        } else free = [...free, this.key];
        const after = new Obj(this.node, O_AFTER, seen, free, -1, 0, "", 0);
        startValue(node, sym, push(after, below), out, 0);
        return;
      }
      case O_AFTER:
        if (ws) return again();
        if (sym === COMMA && this.#moreKeys()) out.push(push(this.#with(O_KEY, 0), below));
        else if (sym === RBRACE && this.#allRequired()) out.push(below ?? DONE);
        return;
    }
  }

  #keyByte(sym: number, below: Stack | null, out: Stack[]): void {
    const props = this.node.props;
    if (sym === QUOTE && (this.cont === 0 || this.cont === -1) && !/(^|[^\\])(\\\\)*\\$/.test(this.key)) {
      const i = props.findIndex((p) => p.key === this.key);
      if (i >= 0) {
        if (!this.#isSeen(i)) out.push(push(this.#with(O_COLON, 0, this.key, i), below));
      } else if (this.node.additional !== null && this.cont === 0 && !this.free.includes(this.key)) {
        out.push(push(this.#with(O_COLON, 0, this.key, -1), below));
      }
      return;
    }
    const key = this.key + String.fromCharCode(sym);
    const declared = props.some((p, i) => !this.#isSeen(i) && p.key.startsWith(key));
    // cont -1: the key has left the escape-free spelling of free keys (a declared key with
    // an escape), so only declared keys can still match.
    if (this.node.additional === null || this.cont === -1) {
      if (declared) out.push(push(this.#with(O_IN_KEY, 0, key, -1, this.cont), below));
      return;
    }
    // A free key: its bytes must be a valid escape-free string body. `cont` packs the
    // UTF-8 continuation bytes left and the allowed range of the next one.
    const left = this.cont & 3, lo = (this.cont >> 2) & 0xff, hi = (this.cont >> 10) & 0xff;
    const r = strByte(sym, 0, left, lo, hi, false, false);
    if (r !== null) out.push(push(this.#with(O_IN_KEY, 0, key, -1, r.cont | (r.lo << 2) | (r.hi << 10)), below));
    else if (declared) out.push(push(this.#with(O_IN_KEY, 0, key, -1, -1), below));
  }
  /**
   * See {@link Frame.signature}. The one exception to "step alike": a free key's bytes,
   * once no declared key (seen or not) and no earlier key starts with them, are written as `*`. Such keys accept
   * the same bytes up to and including their closing quote (they can no longer be a
   * duplicate); only what follows differs, the key joining the keys seen. A token that
   * could close such a key and then compare another key against it has at least three
   * quote bytes, and the whole mask checks those tokens without the table (mask.ts).
   */
  signature(): string {
    const free = this.phase === O_IN_KEY && this.cont >= 0 && this.node.additional !== null &&
      !this.node.props.some((p) => p.key.startsWith(this.key)) &&
      !this.free.some((f) => f.startsWith(this.key));
    const key = free ? "*" : JSON.stringify(this.key);
    return `O${identity(this.node)},${this.phase},${this.seen},${
      JSON.stringify(this.free)
    },${this.current},${this.ws},${key},${this.cont}`;
  }
}

const A_FIRST = 0, A_AFTER = 1, A_NEXT = 2;

/** A JSON array of an arr node, after its `[`: `min`..`max` items. */
export class Arr implements Frame {
  /** In `phase` with `count` items read. */
  constructor(
    readonly node: Extract<GNode, { k: "arr" }>,
    readonly phase: number,
    readonly count: number,
    readonly ws: number,
  ) {}
  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (sym >= SPECIAL_BASE) return;
    const { node, phase, count } = this;
    if (isWs(sym)) {
      if (wsRoom(node, this.ws, sym)) out.push(push(new Arr(node, phase, count, this.ws + 1), below));
      return;
    }
    if (phase === A_AFTER) {
      if (sym === COMMA && count < node.max) out.push(push(new Arr(node, A_NEXT, count, 0), below));
      else if (sym === RBRACKET && count >= node.min) out.push(below ?? DONE);
      return;
    }
    if (phase === A_FIRST && sym === RBRACKET) {
      if (node.min === 0) out.push(below ?? DONE);
      return;
    }
    if (phase === A_FIRST && node.max === 0) return;
    startValue(node.items, sym, push(new Arr(node, A_AFTER, count + 1, 0), below), out, 0);
  }
  /** See {@link Frame.signature}: the count only as `step` reads it (reached min? room left to max?). */
  signature(): string {
    const { node, count } = this;
    return `A${identity(node)},${this.phase},${Math.min(count, node.min)},${node.max - count},${this.ws}`;
  }
}

/** The end: optional whitespace, then one of the end symbols (stop ids); nothing after. */
export class End implements Frame {
  /** Ends on any of `ends`. */
  constructor(readonly ends: readonly number[], readonly ws = 0, readonly allowWs = true) {}
  /** See {@link Frame.step}. */
  step(sym: number, _below: Stack | null, out: Stack[]): void {
    if (this.ends.includes(sym)) out.push(DONE);
    else if (this.allowWs && isWs(sym) && this.ws < MAX_WS) {
      out.push(push(new End(this.ends, this.ws + 1, true), null));
    }
  }
  /** See {@link Frame.signature}. */
  signature(): string {
    return `E${identity(this.ends)},${this.ws},${this.allowWs ? 1 : 0}`;
  }
}

/** Builds a stack from frames listed first-to-read first. */
export function sequence(frames: readonly Frame[], below: Stack | null = null): Stack | null {
  let s = below;
  for (let i = frames.length - 1; i >= 0; i--) s = push(frames[i], s);
  return s;
}

/** The state after reading all of `syms` (empty as soon as one is refused). */
export function accepts(state: State, syms: Iterable<number>): State {
  let s: State = state;
  for (const x of syms) {
    s = stepState(s, x);
    if (s.length === 0) break;
  }
  return s;
}
