/**
 * The one JSON field reader: reads a field of a parsed JSON value at a path, checks its type
 * and range, and reports a problem naming the field (`model.layers[3].experts`) with what
 * was expected and what was there. config.json, the trunk manifest, the expert table and
 * the OpenAI request bodies are all read with it.
 *
 * What happens to a problem is the caller's: the model config collects every problem into
 * one error, the manifest and the expert table throw on the first, the server answers a
 * 400 naming the field. A reader whose `report` returns (collects) gets `undefined` for
 * the field.
 *
 * @example
 * ```ts
 * import { JsonFields, problemText } from "./json_fields.ts";
 * const problems: string[] = [];
 * const model = JsonFields.root({ layers: [{ experts: "x" }] }, {
 *   absent: "missing",
 *   report: (p) => problems.push(problemText(p)),
 * }, "model");
 * model?.array("layers")?.object(0)?.int("experts", 1, 4096);
 * if (problems[0] !== 'model.layers[0].experts: expected an integer in 1..4096, got "x"') throw new Error();
 * ```
 *
 * @module
 */

/** A key of an object field (a name) or of an array item (an index). */
export type JsonKey = string | number;

/** One field that is not what it must be. */
export interface FieldProblem {
  /** Where it is: `a.b[3].c` (the empty string: the value read itself). */
  field: string;
  /** What it must be: "an integer in 1..4096", "a boolean", "one of \"raw\", \"split\"". */
  expected: string;
  /** True when the field is absent (missing, or null where null means absent). */
  missing: boolean;
  /** What it holds (undefined when missing). */
  got: unknown;
}

/** How a reader treats absent fields and problems. */
export interface FieldOptions {
  /**
   * "missing": an absent field is a problem (a file the engine reads; null counts as a
   * value). "optional": an absent or null field reads as undefined, no problem (OpenAI
   * treats null as absent).
   */
  absent: "missing" | "optional";
  /** Called with each problem; it throws to stop at the first, or returns to go on. */
  report: (problem: FieldProblem) => void;
}

/** A numeric range; `minOpen`/`maxOpen` leave the bound out (`(0, 1]`). */
export interface NumberRange {
  /** The lowest value. */
  min: number;
  /** The highest value. */
  max: number;
  /** The lowest value itself is refused. */
  minOpen?: boolean;
  /** The highest value itself is refused. */
  maxOpen?: boolean;
}

/** A string pattern and how a message describes it. */
export interface StringPattern {
  /** What the string must match. */
  pattern: RegExp;
  /** What a message says it must be: "16 hex digits". */
  what: string;
}

/** Exactly `n` lowercase hex digits (a digest or a fingerprint). */
export function hexDigits(n: number): StringPattern {
  return { pattern: new RegExp(`^[0-9a-f]{${n}}$`), what: `${n} hex digits` };
}

/** The longest excerpt of a string value quoted in a message. */
const MAX_SHOWN = 40;

/** A value as a message shows it: JSON for scalars (long strings cut), a phrase for containers. */
export function describeValue(v: unknown): string {
  if (v === undefined) return "nothing";
  if (Array.isArray(v)) return `an array of ${v.length} item${v.length === 1 ? "" : "s"}`;
  if (typeof v === "object" && v !== null) return "an object";
  if (typeof v === "string" && v.length > MAX_SHOWN) return `${JSON.stringify(v.slice(0, MAX_SHOWN))}...`;
  return JSON.stringify(v) ?? String(v);
}

/** The problem as one phrase: `a.b: expected an integer in 1..4096, got "x"` (or `a.b is missing (...)`). */
export function problemText(p: FieldProblem): string {
  if (p.missing) return `${p.field || "the value"} is missing (expected ${p.expected})`;
  return `${p.field || "the value"}: expected ${p.expected}, got ${describeValue(p.got)}`;
}

/** The range as a message shows it: `[0, 2]`, `(0, 1000]`. */
function rangeText(r: NumberRange): string {
  return `${r.minOpen ? "(" : "["}${r.min}, ${r.max}${r.maxOpen ? ")" : "]"}`;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The fields of one JSON object or array, each read checked. */
export class JsonFields {
  private constructor(
    /** The object or array read. */
    readonly value: Record<string, unknown> | unknown[],
    /** Its path (`""` at the root). */
    readonly path: string,
    /** How absent fields and problems are handled. */
    readonly options: FieldOptions,
  ) {}

  /** Fields of `value`, which must be an object (else reported; undefined). */
  static root(value: unknown, options: FieldOptions, path = ""): JsonFields | undefined {
    if (isObject(value)) return new JsonFields(value, path, options);
    options.report({ field: path, expected: "an object", missing: value === undefined, got: value });
    return undefined;
  }

  /** The full name of field `k`: `path.k`, or `path[k]` for an index. */
  name(k: JsonKey): string {
    if (typeof k === "number") return `${this.path}[${k}]`;
    return this.path === "" ? k : `${this.path}.${k}`;
  }

  /** Field `k` as it is, unchecked. */
  get(k: JsonKey): unknown {
    return (this.value as Record<JsonKey, unknown>)[k];
  }

  /** Field `k` is present (and, for optional readers, not null: a null array item is a value). */
  has(k: JsonKey): boolean {
    const v = this.get(k);
    return v !== undefined && !(v === null && this.options.absent === "optional" && typeof k === "string");
  }

  /** Items of an array (0 for an object). */
  get length(): number {
    return Array.isArray(this.value) ? this.value.length : 0;
  }

  /** The problem of field `k` not being `expected` (for a caller's own checks). */
  problemOf(k: JsonKey, expected: string): FieldProblem {
    return { field: this.name(k), expected, missing: !this.has(k), got: this.get(k) };
  }

  /** Reports field `k` as not `expected`. */
  problem(k: JsonKey, expected: string): undefined {
    this.options.report(this.problemOf(k, expected));
    return undefined;
  }

  /** Field `k` when `ok` accepts it; else reported (absent optional fields: undefined, unreported). */
  #read<T>(k: JsonKey, expected: string, ok: (v: unknown) => boolean): T | undefined {
    if (!this.has(k)) return this.options.absent === "optional" ? undefined : this.problem(k, expected);
    const v = this.get(k);
    return ok(v) ? v as T : this.problem(k, expected);
  }

  /** An integer in min..max (safe integers when unbounded). */
  int(k: JsonKey, min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER): number | undefined {
    const low = min !== Number.MIN_SAFE_INTEGER, high = max !== Number.MAX_SAFE_INTEGER;
    const expected = low && high
      ? `an integer in ${min}..${max}`
      : low
      ? `an integer >= ${min}`
      : high
      ? `an integer <= ${max}`
      : "an integer";
    return this.#read(k, expected, (v) => Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max);
  }

  /** A finite number, inside `range` when given. */
  number(k: JsonKey, range?: NumberRange): number | undefined {
    const inside = (v: number) =>
      !range ||
      ((range.minOpen ? v > range.min : v >= range.min) && (range.maxOpen ? v < range.max : v <= range.max));
    const expected = range ? `a number in ${rangeText(range)}` : "a number";
    return this.#read(k, expected, (v) => typeof v === "number" && Number.isFinite(v) && inside(v));
  }

  /** true or false. */
  boolean(k: JsonKey): boolean | undefined {
    return this.#read(k, "a boolean", (v) => typeof v === "boolean");
  }

  /** A string; matching `pattern` (described as `what`) when given. */
  string(k: JsonKey, pattern?: StringPattern): string | undefined {
    return this.#read(
      k,
      pattern?.what ?? "a string",
      (v) => typeof v === "string" && (!pattern || pattern.pattern.test(v)),
    );
  }

  /** One of `values` (compared with ===). */
  oneOf<T>(k: JsonKey, values: readonly T[]): T | undefined {
    const expected = values.length === 1
      ? JSON.stringify(values[0])
      : `one of ${values.map((v) => JSON.stringify(v)).join(", ")}`;
    return this.#read(k, expected, (v) => values.includes(v as T));
  }

  /** An object: its fields. */
  object(k: JsonKey): JsonFields | undefined {
    const v = this.#read<Record<string, unknown>>(k, "an object", isObject);
    return v === undefined ? undefined : new JsonFields(v, this.name(k), this.options);
  }

  /** An array, of `length` items or at most `maxLength` when given: its items. */
  array(k: JsonKey, size: { length?: number; maxLength?: number } = {}): JsonFields | undefined {
    const expected = size.length !== undefined
      ? `an array of ${size.length} items`
      : size.maxLength !== undefined
      ? `an array of at most ${size.maxLength} items`
      : "an array";
    const v = this.#read<unknown[]>(
      k,
      expected,
      (v) =>
        Array.isArray(v) && (size.length === undefined || v.length === size.length) &&
        (size.maxLength === undefined || v.length <= size.maxLength),
    );
    return v === undefined ? undefined : new JsonFields(v, this.name(k), this.options);
  }
}
