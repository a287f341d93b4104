/**
 * Strings with a `pattern` or a `format`: a regular expression (the ECMAScript subset
 * schema authors write) compiled to a deterministic automaton over code points, which a
 * JSON string frame steps character by character.
 *
 * The subset: literals and escapes (`\d \w \s`, their negations, `\n \t \r \f \v \0`,
 * `\xHH`, `\uHHHH`, `\u{H...}`, escaped punctuation), classes `[...]` and `[^...]` with
 * ranges, `.`, groups `(...)` and `(?:...)`, alternation, the quantifiers `* + ? {n}
 * {n,} {n,m}` (lazy or not: the same language), `^` and `$`, and lookaheads `(?=...)` /
 * `(?!...)` right after a leading `^` (zod's email pattern). As ajv tests it
 * (`new RegExp(pattern, "u").test(s)`), an unanchored pattern matches anywhere in the
 * string. Backreferences, word boundaries, lookbehinds, property escapes and other
 * lookaheads are refused ({@link PatternError}).
 *
 * The `format`s date-time, date, time, email, uuid, ipv4, ipv6 and uri are patterns of
 * their own ({@link FORMATS}), each allowing only valid values (a subset of what the format
 * admits: an email of the common shape, a uri with a scheme); a string with both a pattern
 * and a format must match both (the automata's product).
 *
 * The automaton is pruned to states that can still accept, and with `minLength` or
 * `maxLength` a character is allowed only when an accepted length is still reachable
 * (lengths reachable from each state, see {@link Dfa.canFinish}): every live state of the
 * string frame can finish.
 *
 * @module
 */

import { DONE, emit, type Frame, type GNode, identity, push, SPECIAL_BASE, type Stack } from "./automaton.ts";

/** A pattern outside the subset, or too large. */
export class PatternError extends Error {
  /** `message`: what is wrong, without the schema path (the caller adds it). */
  constructor(message: string) {
    super(message);
    this.name = "PatternError";
  }
}

/** The formats enforced, each as a pattern of the subset. */
export const FORMATS: Readonly<Record<string, string>> = (() => {
  const date = "(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|" +
    "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8])))";
  const hms = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?";
  const offset = "(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
  const hex = "[0-9a-fA-F]";
  const label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  const octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]\\d|\\d)";
  const h16 = `${hex}{1,4}`;
  return {
    "date-time": `^${date}T${hms}${offset}$`,
    date: `^${date}$`,
    time: `^${hms}${offset}?$`,
    email: `^[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@(?:${label}\\.)+[A-Za-z]{2,63}$`,
    uuid: `^${hex}{8}-${hex}{4}-${hex}{4}-${hex}{4}-${hex}{12}$`,
    ipv4: `^(?:${octet}\\.){3}${octet}$`,
    ipv6: `^(?:(?:${h16}:){7}${h16}|(?:${h16}:){1,7}:|(?:${h16}:){1,6}:${h16}|(?:${h16}:){1,5}(?::${h16}){1,2}|` +
      `(?:${h16}:){1,4}(?::${h16}){1,3}|(?:${h16}:){1,3}(?::${h16}){1,4}|(?:${h16}:){1,2}(?::${h16}){1,5}|` +
      `${h16}:(?::${h16}){1,6}|:(?:(?::${h16}){1,7}|:))$`,
    uri: "^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~!$&'()*+,;=:@/?#-]|%[0-9A-Fa-f]{2})+$",
  };
})();

/** Deterministic states of a pattern at most. */
export const MAX_PATTERN_STATES = 4096;
const MAX_NFA_NODES = 50_000;
const MAX_CODE_POINT = 0x10ffff;

// ---------------------------------------------------------------------------------------
// Parsing

type Ast =
  | { t: "set"; ranges: [number, number][] }
  | { t: "cat"; items: Ast[] }
  | { t: "alt"; items: Ast[] }
  | { t: "rep"; item: Ast; min: number; max: number }
  | { t: "bol" }
  | { t: "eol" }
  | { t: "look"; negative: boolean; item: Ast };

const DIGITS: [number, number][] = [[0x30, 0x39]];
const WORD: [number, number][] = [[0x30, 0x39], [0x41, 0x5a], [0x5f, 0x5f], [0x61, 0x7a]];
const SPACE: [number, number][] = [
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
];
const LINE_ENDS: [number, number][] = [[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]];

/** The ranges not in `ranges` (sorted, merged). */
function complement(ranges: [number, number][]): [number, number][] {
  const out: [number, number][] = [];
  let next = 0;
  for (const [lo, hi] of normalize(ranges)) {
    if (lo > next) out.push([next, lo - 1]);
    next = Math.max(next, hi + 1);
  }
  if (next <= MAX_CODE_POINT) out.push([next, MAX_CODE_POINT]);
  return out;
}

function normalize(ranges: [number, number][]): [number, number][] {
  const sorted = [...ranges].sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  for (const [lo, hi] of sorted) {
    const last = out[out.length - 1];
    if (last && lo <= last[1] + 1) last[1] = Math.max(last[1], hi);
    else out.push([lo, hi]);
  }
  return out;
}

class Parser {
  i = 0;
  constructor(readonly src: string) {}

  fail(what: string): never {
    throw new PatternError(`${what} (at offset ${this.i}) is not supported in a pattern`);
  }

  parse(): Ast {
    const ast = this.alternation();
    if (this.i < this.src.length) this.fail(`an unmatched ${JSON.stringify(this.src[this.i])}`);
    return ast;
  }

  alternation(): Ast {
    const items = [this.sequence()];
    while (this.src[this.i] === "|") {
      this.i++;
      items.push(this.sequence());
    }
    return items.length === 1 ? items[0] : { t: "alt", items };
  }

  sequence(): Ast {
    const items: Ast[] = [];
    while (this.i < this.src.length && this.src[this.i] !== "|" && this.src[this.i] !== ")") {
      items.push(this.quantified());
    }
    return { t: "cat", items };
  }

  quantified(): Ast {
    const atom = this.atom();
    for (;;) {
      const c = this.src[this.i];
      let min: number, max: number;
      if (c === "*") [min, max] = [0, Infinity];
      else if (c === "+") [min, max] = [1, Infinity];
      else if (c === "?") [min, max] = [0, 1];
      else if (c === "{") {
        const m = /^\{(\d+)(,(\d*))?\}/.exec(this.src.slice(this.i));
        if (!m) this.fail("a '{' that starts no quantifier");
        min = Number(m[1]);
        max = m[2] === undefined ? min : m[3] === "" ? Infinity : Number(m[3]);
        if (max < min) this.fail("a quantifier {n,m} with m < n");
        this.i += m[0].length - 1;
      } else return atom;
      this.i++;
      if (this.src[this.i] === "?") this.i++; // lazy: the same language
      if (atom.t === "bol" || atom.t === "eol" || atom.t === "look") this.fail("a quantified assertion");
      return this.wrapRep(atom, min, max);
    }
  }

  wrapRep(item: Ast, min: number, max: number): Ast {
    const ast: Ast = { t: "rep", item, min, max };
    const c = this.src[this.i];
    if (c === "*" || c === "+" || c === "?" || c === "{") this.fail("a quantifier after a quantifier");
    return ast;
  }

  atom(): Ast {
    const c = this.src[this.i];
    if (c === "(") {
      this.i++;
      let look: boolean | null = null;
      if (this.src.startsWith("?:", this.i)) this.i += 2;
      else if (this.src.startsWith("?=", this.i)) (this.i += 2, look = false);
      else if (this.src.startsWith("?!", this.i)) (this.i += 2, look = true);
      else if (this.src[this.i] === "?") this.fail("a lookbehind or named group");
      const item = this.alternation();
      if (this.src[this.i] !== ")") this.fail("an unclosed group");
      this.i++;
      return look === null ? item : { t: "look", negative: look, item };
    }
    if (c === "^") return (this.i++, { t: "bol" });
    if (c === "$") return (this.i++, { t: "eol" });
    if (c === ".") return (this.i++, { t: "set", ranges: complement(LINE_ENDS) });
    if (c === "[") return this.cls();
    if (c === "*" || c === "+" || c === "?" || c === "{" || c === "}" || c === "]" || c === ")") {
      this.fail(`a bare ${JSON.stringify(c)}`);
    }
    if (c === "\\") {
      const set = this.escape(false);
      return { t: "set", ranges: set };
    }
    const cp = this.src.codePointAt(this.i)!;
    this.i += cp > 0xffff ? 2 : 1;
    return { t: "set", ranges: [[cp, cp]] };
  }

  /** After a backslash (at `this.i`): the characters it stands for. */
  escape(inClass: boolean): [number, number][] {
    this.i++;
    const c = this.src[this.i++];
    if (c === undefined) this.fail("a trailing backslash");
    const one = (cp: number): [number, number][] => [[cp, cp]];
    switch (c) {
      case "d":
        return DIGITS;
      case "D":
        return complement(DIGITS);
      case "w":
        return WORD;
      case "W":
        return complement(WORD);
      case "s":
        return SPACE;
      case "S":
        return complement(SPACE);
      case "n":
        return one(0x0a);
      case "r":
        return one(0x0d);
      case "t":
        return one(0x09);
      case "f":
        return one(0x0c);
      case "v":
        return one(0x0b);
      case "0":
        if (/[0-9]/.test(this.src[this.i] ?? "")) this.fail("an octal escape");
        return one(0);
      case "x": {
        const m = /^[0-9a-fA-F]{2}/.exec(this.src.slice(this.i));
        if (!m) this.fail("a malformed \\x escape");
        this.i += 2;
        return one(parseInt(m[0], 16));
      }
      case "u": {
        const m = /^(?:([0-9a-fA-F]{4})|\{([0-9a-fA-F]{1,6})\})/.exec(this.src.slice(this.i));
        if (!m) this.fail("a malformed \\u escape");
        this.i += m[0].length;
        const cp = parseInt(m[1] ?? m[2], 16);
        if (cp > MAX_CODE_POINT) this.fail("a code point above U+10FFFF");
        return one(cp);
      }
      case "b":
        if (inClass) return one(0x08);
        return this.fail("a word boundary \\b");
      case "-":
        return one(0x2d);
    }
    if (/[A-Za-z0-9]/.test(c)) this.fail(`the escape \\${c}`);
    const cp = this.src.codePointAt(this.i - 1)!;
    if (cp > 0xffff) this.i++;
    return one(cp);
  }

  cls(): Ast {
    this.i++;
    const negate = this.src[this.i] === "^";
    if (negate) this.i++;
    const ranges: [number, number][] = [];
    const single = (): [number, number][] => {
      if (this.src[this.i] === "\\") return this.escape(true);
      const cp = this.src.codePointAt(this.i);
      if (cp === undefined) this.fail("an unclosed class");
      this.i += cp > 0xffff ? 2 : 1;
      return [[cp, cp]];
    };
    while (this.src[this.i] !== "]") {
      if (this.i >= this.src.length) this.fail("an unclosed class");
      const from = single();
      if (this.src[this.i] === "-" && this.src[this.i + 1] !== "]" && this.i + 1 < this.src.length) {
        this.i++;
        const to = single();
        if (from.length !== 1 || to.length !== 1 || from[0][0] !== from[0][1] || to[0][0] !== to[0][1]) {
          this.fail("a class range with a class escape at one end");
        }
        if (to[0][0] < from[0][0]) this.fail("a class range out of order");
        ranges.push([from[0][0], to[0][0]]);
      } else ranges.push(...from);
    }
    this.i++;
    return { t: "set", ranges: negate ? complement(ranges) : normalize(ranges) };
  }
}

// ---------------------------------------------------------------------------------------
// Automata over classes of code points

/** The code points cut into classes that every set of the patterns either holds or misses. */
export class Alphabet {
  /** Class `c` is code points starts[c]..starts[c + 1] - 1. */
  readonly starts: number[];

  /** Cut so that every one of `sets` (code point ranges) is a union of classes. */
  constructor(sets: [number, number][][]) {
    const cuts = new Set<number>([0, 0xd800, 0xe000, MAX_CODE_POINT + 1]);
    for (const set of sets) for (const [lo, hi] of set) (cuts.add(lo), cuts.add(hi + 1));
    this.starts = [...cuts].sort((a, b) => a - b);
  }

  /** Classes. */
  get size(): number {
    return this.starts.length - 1;
  }

  /** The first class holding a code point >= cp. */
  classAt(cp: number): number {
    let lo = 0, hi = this.size - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.starts[mid] <= cp) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** The classes inside `ranges` (surrogates excluded: a JSON string cannot hold one alone). */
  classes(ranges: [number, number][]): number[] {
    const out: number[] = [];
    for (const [lo, hi] of ranges) {
      for (let c = this.classAt(lo); c < this.size && this.starts[c] <= hi; c++) {
        if (this.starts[c] !== 0xd800) out.push(c);
      }
    }
    return out;
  }
}

/** A nondeterministic automaton (Thompson), with ^ and $ as edges taken only at the string's start or end. */
class Nfa {
  readonly eps: { to: number; kind: "" | "^" | "$" }[][] = [];
  readonly moves: { classes: number[]; to: number }[][] = [];

  constructor(readonly alphabet: Alphabet) {}

  node(): number {
    if (this.eps.length >= MAX_NFA_NODES) throw new PatternError("the pattern is too large");
    this.eps.push([]);
    this.moves.push([]);
    return this.eps.length - 1;
  }

  /** Adds `ast` from node `from`; returns its end node. */
  build(ast: Ast, from: number): number {
    switch (ast.t) {
      case "set": {
        const to = this.node();
        this.moves[from].push({ classes: this.alphabet.classes(ast.ranges), to });
        return to;
      }
      case "cat":
        return ast.items.reduce((at, item) => this.build(item, at), from);
      case "alt": {
        const to = this.node();
        for (const item of ast.items) {
          const start = this.node();
          this.eps[from].push({ to: start, kind: "" });
          this.eps[this.build(item, start)].push({ to, kind: "" });
        }
        return to;
      }
      case "rep": {
        let at = from;
        for (let k = 0; k < ast.min; k++) at = this.build(ast.item, at);
        if (ast.max === Infinity) {
          const loop = this.node();
          this.eps[at].push({ to: loop, kind: "" });
          this.eps[this.build(ast.item, loop)].push({ to: loop, kind: "" });
          return loop;
        }
        const to = this.node();
        this.eps[at].push({ to, kind: "" });
        for (let k = ast.min; k < ast.max; k++) {
          at = this.build(ast.item, at);
          this.eps[at].push({ to, kind: "" });
        }
        return to;
      }
      case "bol":
      case "eol": {
        const to = this.node();
        this.eps[from].push({ to, kind: ast.t === "bol" ? "^" : "$" });
        return to;
      }
      case "look":
        throw new PatternError("a lookahead is supported only at the start of the pattern, after ^");
    }
  }

  closure(nodes: Iterable<number>, atStart: boolean, atEnd: boolean): Set<number> {
    const seen = new Set(nodes);
    const todo = [...seen];
    while (todo.length > 0) {
      for (const { to, kind } of this.eps[todo.pop()!]) {
        if (seen.has(to) || (kind === "^" && !atStart) || (kind === "$" && !atEnd)) continue;
        seen.add(to);
        todo.push(to);
      }
    }
    return seen;
  }
}

/** A complete deterministic automaton over an alphabet's classes (state 0: the start). */
export interface Table {
  /** Per state, per class: the next state. */
  next: Int32Array[];
  /** Whether each state accepts. */
  accept: boolean[];
}

/** The table of `ast` under search semantics (a match anywhere, unless anchored). */
function determinize(ast: Ast, alphabet: Alphabet): Table {
  const nfa = new Nfa(alphabet);
  const start = nfa.node(), matchStart = nfa.node();
  const all = Array.from({ length: alphabet.size }, (_, c) => c).filter((c) => alphabet.starts[c] !== 0xd800);
  nfa.moves[start].push({ classes: all, to: start }); // anything before the match
  nfa.eps[start].push({ to: matchStart, kind: "" });
  const end = nfa.build(ast, matchStart);
  nfa.moves[end].push({ classes: all, to: end }); // anything after it
  const key = (s: Set<number>) => [...s].sort((a, b) => a - b).join(",");
  const states: Set<number>[] = [], ids = new Map<string, number>();
  const table: Table = { next: [], accept: [] };
  const add = (s: Set<number>): number => {
    // The start is its own state: it alone passed the ^ edges (its acceptance differs).
    const k = states.length === 0 ? "start" : key(s);
    let id = ids.get(k);
    if (id === undefined) {
      if (states.length >= MAX_PATTERN_STATES) throw new PatternError("the pattern makes too many states");
      ids.set(k, id = states.length);
      states.push(s);
      table.next.push(new Int32Array(alphabet.size));
      table.accept.push(nfa.closure(s, id === 0, true).has(end));
    }
    return id;
  };
  add(nfa.closure([start], true, false));
  for (let q = 0; q < states.length; q++) {
    // The start state's closure passed ^ edges; a move leaves the start, so only its own
    // nodes step (the ^ targets reached from them step as well: they are in the set).
    const byClass: Set<number>[] = Array.from({ length: alphabet.size }, () => new Set());
    for (const n of states[q]) for (const m of nfa.moves[n]) for (const c of m.classes) byClass[c].add(m.to);
    for (let c = 0; c < alphabet.size; c++) table.next[q][c] = add(nfa.closure(byClass[c], false, false));
  }
  return table;
}

/** The product of tables (each taken as is, or complemented), as one table. */
function product(parts: { table: Table; negate: boolean }[], size: number): Table {
  const ids = new Map<string, number>(), tuples: number[][] = [];
  const out: Table = { next: [], accept: [] };
  const add = (t: number[]): number => {
    const k = t.join(",");
    let id = ids.get(k);
    if (id === undefined) {
      if (tuples.length >= MAX_PATTERN_STATES) throw new PatternError("the pattern and format make too many states");
      ids.set(k, id = tuples.length);
      tuples.push(t);
      out.next.push(new Int32Array(size));
      out.accept.push(parts.every((p, i) => p.table.accept[t[i]] !== p.negate));
    }
    return id;
  };
  add(parts.map(() => 0));
  for (let q = 0; q < tuples.length; q++) {
    for (let c = 0; c < size; c++) out.next[q][c] = add(tuples[q].map((s, i) => parts[i].table.next[s][c]));
  }
  return out;
}

/** A pattern (and format) as a pruned automaton, with the string lengths each state can still finish in. */
export class Dfa {
  /** Per state, per class: the next state, -1 when no accepted string goes that way. */
  readonly next: Int32Array[];
  /** Whether each state accepts. */
  readonly accept: boolean[];
  /** Per state: bit l set when some accepted string is reached in exactly l more characters (l <= {@link horizon}). */
  readonly finishes: Uint8Array[];
  /** Lengths tracked: a string that can finish in some length >= l can finish in one <= l + states. */
  readonly horizon: number;

  /** Prunes `table` over `alphabet` and tabulates its finishing lengths for strings of `minLength..maxLength`. */
  constructor(readonly alphabet: Alphabet, table: Table, readonly minLength: number, readonly maxLength: number) {
    const n = table.next.length;
    // Co-reachable states: those from which an accepting state is reachable.
    const live = table.accept.slice();
    for (let changed = true; changed;) {
      changed = false;
      for (let q = 0; q < n; q++) {
        if (!live[q] && table.next[q].some((t) => live[t])) live[q] = changed = true;
      }
    }
    this.next = table.next.map((row) => row.map((t) => live[t] ? t : -1));
    this.accept = table.accept;
    this.horizon = Math.min(maxLength, minLength + n);
    if (n * (this.horizon + 1) > 20_000_000) throw new PatternError("the pattern with these lengths is too large");
    this.finishes = Array.from({ length: n }, () => new Uint8Array(this.horizon + 1));
    for (let q = 0; q < n; q++) this.finishes[q][0] = table.accept[q] ? 1 : 0;
    for (let l = 1; l <= this.horizon; l++) {
      for (let q = 0; q < n; q++) {
        if (!live[q]) continue;
        const row = this.next[q];
        for (let c = 0; c < row.length; c++) {
          if (row[c] >= 0 && this.finishes[row[c]][l - 1]) {
            this.finishes[q][l] = 1;
            break;
          }
        }
      }
    }
  }

  /** True when from state `q`, with `n` characters read, the string can end within its lengths. */
  canFinish(q: number, n: number): boolean {
    if (n > this.maxLength) return false;
    const from = Math.max(0, this.minLength - n);
    const to = Math.min(this.maxLength - n, from + this.horizon, this.horizon);
    const f = this.finishes[q];
    for (let l = from; l <= to; l++) if (f[l]) return true;
    return false;
  }

  /** A state reached by a code point in `lo..hi` (with `n + 1` characters then read) that can finish; -1 if none. */
  anyNext(q: number, lo: number, hi: number, n: number): number {
    const a = this.alphabet;
    if (hi > MAX_CODE_POINT) hi = MAX_CODE_POINT;
    if (lo > hi) return -1;
    for (let c = a.classAt(lo); c < a.size && a.starts[c] <= hi; c++) {
      const t = this.next[q][c];
      if (t >= 0 && this.canFinish(t, n + 1)) return t;
    }
    return -1;
  }

  /** The state after code point `cp`, or -1. */
  step(q: number, cp: number, n: number): number {
    const t = this.next[q][this.alphabet.classAt(cp)];
    return t >= 0 && this.canFinish(t, n + 1) ? t : -1;
  }
}

/** Automata compiled lately, by their inputs: a client sends the same schema request after request. */
const compiled = new Map<string, Dfa>();
/** Automata kept at most. */
const COMPILED_KEPT = 64;

/** Compiles `pattern` and/or `format` with string lengths `min..max` (throws PatternError). */
export function compilePattern(pattern: string | undefined, format: string | undefined, min: number, max: number): Dfa {
  const key = JSON.stringify([pattern, format, min, max === Infinity ? null : max]);
  let dfa = compiled.get(key);
  if (dfa === undefined) {
    dfa = compileAnew(pattern, format, min, max);
    if (compiled.size >= COMPILED_KEPT) compiled.delete(compiled.keys().next().value!);
  } else compiled.delete(key);
  compiled.set(key, dfa);
  return dfa;
}

function compileAnew(pattern: string | undefined, format: string | undefined, min: number, max: number): Dfa {
  const asts: { ast: Ast; negate: boolean }[] = [];
  const take = (src: string) => {
    try {
      new RegExp(src, "u");
    } catch {
      throw new PatternError("it is not a valid ECMAScript regular expression");
    }
    const ast = new Parser(src).parse();
    // ^(?=X)(?!Y)REST: REST's language, within X..., outside Y...
    if (ast.t === "cat" && ast.items[0]?.t === "bol") {
      let k = 1;
      while (ast.items[k]?.t === "look") {
        const look = ast.items[k] as Extract<Ast, { t: "look" }>;
        asts.push({ ast: { t: "cat", items: [{ t: "bol" }, look.item] }, negate: look.negative });
        k++;
      }
      asts.push({ ast: { t: "cat", items: [ast.items[0], ...ast.items.slice(k)] }, negate: false });
    } else asts.push({ ast, negate: false });
  };
  if (pattern !== undefined) take(pattern);
  if (format !== undefined) take(FORMATS[format]);
  const sets: [number, number][][] = [];
  const collect = (a: Ast) => {
    if (a.t === "set") sets.push(a.ranges);
    else if (a.t === "cat" || a.t === "alt") a.items.forEach(collect);
    else if (a.t === "rep" || a.t === "look") collect(a.item);
  };
  asts.forEach((a) => collect(a.ast));
  const alphabet = new Alphabet(sets);
  const tables = asts.map(({ ast, negate }) => ({ table: determinize(ast, alphabet), negate }));
  const table = tables.length === 1 && !tables[0].negate ? tables[0].table : product(tables, alphabet.size);
  return new Dfa(alphabet, table, min, max);
}

/** The grammar node of a string that `dfa` constrains, as a JSON string or written raw. */
export function patternString(dfa: Dfa): GNode {
  return {
    k: "ext",
    type: "string",
    start(sym, below, out) {
      if (sym === QUOTE && dfa.canFinish(0, 0)) emit(push(new PatternStr(dfa, 0, 0, IDLE, 0, 0), below), out);
    },
    raw: (until) => dfa.canFinish(0, 0) ? new PatternStr(dfa, 0, 0, IDLE, 0, 0, until) : undefined,
  };
}

const QUOTE = 0x22, BACKSLASH = 0x5c;
// What the frame is in the middle of: nothing, an escape after its backslash, \u with
// `left` hex digits to come, or a UTF-8 character of UTF8 + its length in bytes (`left`
// continuation bytes to come).
const IDLE = 0, ESCAPE = 1, HEX = 2, UTF8 = 10;
/** The lowest code point of a UTF-8 character of each length (lower is an overlong form). */
const UTF8_LOWEST = [0, 0, 0x80, 0x800, 0x10000];
const SIMPLE_ESCAPES: Record<number, number> = {
  0x22: 0x22,
  0x5c: 0x5c,
  0x2f: 0x2f,
  0x62: 0x08,
  0x66: 0x0c,
  0x6e: 0x0a,
  0x72: 0x0d,
  0x74: 0x09,
};

function hexValue(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  if (b >= 0x41 && b <= 0x46) return b - 0x37;
  if (b >= 0x61 && b <= 0x66) return b - 0x57;
  return -1;
}

/**
 * A JSON string body (after its opening quote) whose characters `dfa` walks: state `q`
 * after `n` characters, in the middle of a character (`mode`) with the bits read so far
 * (`bits`) and `left` bytes or hex digits to come. With `until`, the string is written raw
 * instead (a tool call's top-level string argument, as RawStr): every byte is text (quotes,
 * backslashes and newlines too, no escapes) and the special symbol `until` ends it.
 */
export class PatternStr implements Frame {
  /** See the class comment. */
  constructor(
    readonly dfa: Dfa,
    readonly q: number,
    readonly n: number,
    readonly mode: number,
    readonly bits: number,
    readonly left: number,
    readonly until?: number,
  ) {}

  /** The code points a partial character can still become. */
  #span(bits: number, left: number, lowest: number): [number, number] {
    const shift = this.mode === HEX ? 4 * left : 6 * left;
    return [Math.max(bits * 2 ** shift, lowest), (bits + 1) * 2 ** shift - 1];
  }

  #partial(
    mode: number,
    bits: number,
    left: number,
    lowest: number,
    highest: number,
    below: Stack | null,
    out: Stack[],
  ) {
    const next = new PatternStr(this.dfa, this.q, this.n, mode, bits, left, this.until);
    const [lo, hi] = next.#span(bits, left, lowest);
    if (this.dfa.anyNext(this.q, lo, Math.min(hi, highest), this.n) >= 0) out.push(push(next, below));
  }

  #char(cp: number, below: Stack | null, out: Stack[]) {
    const t = this.dfa.step(this.q, cp, this.n);
    if (t >= 0) out.push(push(new PatternStr(this.dfa, t, this.n + 1, IDLE, 0, 0, this.until), below));
  }

  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    const raw = this.until !== undefined;
    if (raw && sym === this.until) {
      if (this.mode === IDLE && this.dfa.accept[this.q] && this.n >= this.dfa.minLength) out.push(below ?? DONE);
      return;
    }
    if (sym >= SPECIAL_BASE) return;
    switch (this.mode) {
      case IDLE:
        if (raw && sym < 0x80) this.#char(sym, below, out);
        else if (sym === QUOTE) {
          if (this.dfa.accept[this.q] && this.n >= this.dfa.minLength) out.push(below ?? DONE);
        } else if (sym === BACKSLASH) {
          const anyEscape = Object.values(SIMPLE_ESCAPES).some((cp) => this.dfa.step(this.q, cp, this.n) >= 0) ||
            this.dfa.anyNext(this.q, 0, 0xffff, this.n) >= 0;
          if (anyEscape) out.push(push(new PatternStr(this.dfa, this.q, this.n, ESCAPE, 0, 0, this.until), below));
        } else if (sym >= 0x20 && sym < 0x80) this.#char(sym, below, out);
        else if (sym >= 0xc2 && sym <= 0xdf) this.#partial(UTF8 + 2, sym & 0x1f, 1, 0x80, 0x7ff, below, out);
        else if (sym >= 0xe0 && sym <= 0xef) this.#partial(UTF8 + 3, sym & 0x0f, 2, 0x800, 0xffff, below, out);
        else if (sym >= 0xf0 && sym <= 0xf4) this.#partial(UTF8 + 4, sym & 0x07, 3, 0x10000, 0x10ffff, below, out);
        return;
      case ESCAPE:
        if (sym === 0x75) this.#partial(HEX, 0, 4, 0, 0xffff, below, out);
        else if (SIMPLE_ESCAPES[sym] !== undefined) this.#char(SIMPLE_ESCAPES[sym], below, out);
        return;
      case HEX: {
        const h = hexValue(sym);
        if (h < 0) return;
        const bits = this.bits * 16 + h;
        if (this.left === 1) {
          if (bits < 0xd800 || bits > 0xdfff) this.#char(bits, below, out);
        } else this.#partial(HEX, bits, this.left - 1, 0, 0xffff, below, out);
        return;
      }
      default: {
        // A UTF-8 continuation byte.
        if (sym < 0x80 || sym > 0xbf) return;
        const bits = this.bits * 64 + (sym & 0x3f), lowest = UTF8_LOWEST[this.mode - UTF8];
        if (this.left === 1) {
          if (bits >= lowest && (bits < 0xd800 || bits > 0xdfff)) this.#char(bits, below, out);
        } else this.#partial(this.mode, bits, this.left - 1, lowest, 0x10ffff, below, out);
        return;
      }
    }
  }

  /** See {@link Frame.signature}: the length only as `canFinish` reads it. */
  signature(): string {
    const d = this.dfa;
    return `P${identity(d)},${this.q},${Math.min(this.n, d.minLength)},${
      Math.min(d.maxLength - this.n, d.horizon + 1)
    },${this.mode},${this.bits},${this.left},${this.until ?? ""}`;
  }
}
