/**
 * JSON numbers as the released encoder writes them. The chat encoder is Python: a tool
 * declaration's `1.0` stays a float and is written `1.0`, `1e-7` is written `1e-07`, and an
 * integer keeps every digit. JavaScript parses all three to doubles and writes `1`, `1e-7`
 * and a rounded integer. So request bodies are parsed with {@link parseJson}, which notes
 * the literal text of every number beside the object that holds it, and the renderer writes
 * a number with {@link pythonNumber}: Python's `repr` of the value its literal gave Python.
 *
 * @example
 * ```ts
 * import { parseJson, pythonNumber } from "./json_numbers.ts";
 * const v = parseJson('{"min":1.0,"eps":1e-7,"n":12345678901234567890}') as Record<string, number>;
 * console.assert(pythonNumber(v, "min", v.min) === "1.0");
 * console.assert(pythonNumber(v, "eps", v.eps) === "1e-07");
 * console.assert(pythonNumber(v, "n", v.n) === "12345678901234567890");
 * ```
 *
 * @module
 */

/** The literal text of each number, by the object or array holding it and its key there. */
const literals = new WeakMap<object, Map<string, string>>();

/** `JSON.parse`, noting each number's literal text (the values are JSON.parse's own). */
export function parseJson(text: string): unknown {
  return JSON.parse(text, function (this: object, key: string, value: unknown, context?: { source?: string }) {
    if (typeof value === "number" && context?.source !== undefined) {
      let m = literals.get(this);
      if (!m) literals.set(this, m = new Map());
      m.set(key, context.source);
    }
    return value;
  });
}

/**
 * A number as Python's `json.dumps` writes the value its JSON literal parses to there:
 * an integer literal exactly, a literal with a fraction or an exponent as Python's float
 * `repr`. A number not parsed by {@link parseJson} is taken as an integer when it is one.
 */
export function pythonNumber(holder: object, key: string, value: number): string {
  const literal = literals.get(holder)?.get(key);
  if (literal === undefined) return Number.isSafeInteger(value) ? String(value) : pythonFloat(value);
  return /^-?\d+$/.test(literal) ? BigInt(literal).toString() : pythonFloat(value);
}

/** Python's `repr(float)`: the shortest digits that round-trip (as JavaScript's), written
 * positionally for decimal exponents -4 to 15 (always with a fraction), else as
 * `d.ddde+XX` with at least two exponent digits. */
export function pythonFloat(x: number): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mantissa, exponent] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", ""), e = Number(exponent);
  if (e < -4 || e >= 16) {
    const frac = digits.length > 1 ? "." + digits.slice(1) : "";
    return `${sign}${digits[0]}${frac}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
  if (digits.length <= e + 1) return `${sign}${digits}${"0".repeat(e + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`;
}
