/**
 * Numbers with bounds: JSON Schema's `minimum`, `maximum`, `exclusiveMinimum`,
 * `exclusiveMaximum` and `multipleOf`, enforced digit by digit.
 *
 * A bounded number is written in plain decimal (no exponent): at most
 * {@link MAX_DIGITS} integer digits and, for a `number`, at most {@link FRACTION_DIGITS}
 * fraction digits. Its value is then an exact integer count of units (10^-scale), and the
 * bounds are exact integers of units too ({@link numberRange}), so every test is BigInt
 * arithmetic. A digit is allowed only when some completion of the digits read so far lies
 * within the bounds and is a multiple of the step: every live state can still finish (the
 * mask never runs dry inside a number).
 *
 * Floats: a bound is a float64 `x`; the grammar compares against the decimal `String(x)`
 * (which parses back to `x`), rounded inward to the unit. A written decimal `d` at or above
 * it parses to a float at or above `x` (rounding to nearest is monotone), so the value JSON
 * readers see satisfies the bound. An exclusive bound is the inclusive bound at the next
 * float inward. A `multipleOf` that is not an integer cannot be matched by a float test
 * (`0.07 % 0.01` is not 0), so it is refused; an integer `multipleOf` keeps its values within
 * +-(2^53 - 1), where every integer is a float64 and a multiple stays one when read.
 *
 * @module
 */

import { type Frame, type GNode, identity, MAX_DIGITS, push, type Stack, stepStack } from "./automaton.ts";

/** Fraction digits of a bounded `number` at most (the unit is 10^-FRACTION_DIGITS). */
export const FRACTION_DIGITS = 16;

/** The allowed values of a bounded number, in units of 10^-scale. */
export interface NumRange {
  /** Fraction digits allowed: 0 (integers) or {@link FRACTION_DIGITS}. */
  readonly scale: number;
  /** Every value is a multiple of this many units (1n: no step). */
  readonly step: bigint;
  /** Allowed magnitudes of non-negative values (inclusive), or null: none. */
  readonly positive: readonly [bigint, bigint] | null;
  /** Allowed magnitudes of values written with a minus sign, or null: none. */
  readonly negative: readonly [bigint, bigint] | null;
}

/**
 * The range of values in `[lo, hi]` units (null: unbounded) that are multiples of `step`
 * and can be written in at most {@link MAX_DIGITS} integer digits; null when there is none.
 */
export function numberRange(lo: bigint | null, hi: bigint | null, scale: number, step: bigint): NumRange | null {
  const cap = 10n ** BigInt(MAX_DIGITS + scale) - 1n;
  const clip = (a: bigint, b: bigint): readonly [bigint, bigint] | null => {
    if (b > cap) b = cap;
    return a <= b && multipleWithin(a, b, step) ? [a, b] : null;
  };
  const positive = hi !== null && hi < 0n ? null : clip(lo === null || lo < 0n ? 0n : lo, hi ?? cap);
  const negative = lo !== null && lo > 0n ? null : clip(hi === null || hi > 0n ? 0n : -hi, lo === null ? cap : -lo);
  if (positive === null && negative === null) return null;
  return { scale, step, positive, negative };
}

/** True when `[a, b]` (a >= 0) holds a multiple of `step`. */
function multipleWithin(a: bigint, b: bigint, step: bigint): boolean {
  if (a > b) return false;
  return ((a + step - 1n) / step) * step <= b;
}

/** The grammar node of a bounded number. */
export function rangedNumber(range: NumRange): GNode {
  return {
    k: "ext",
    type: "number",
    start(sym, below, out) {
      if (sym === MINUS) {
        if (range.negative !== null) out.push(push(new Ranged(range, true, R_SIGN, 0n, 0, 0n, 0), below));
      } else if (range.positive !== null) new Ranged(range, false, R_SIGN, 0n, 0, 0n, 0).step(sym, below, out);
    },
  };
}

const MINUS = 0x2d, DOT = 0x2e, ZERO = 0x30, NINE = 0x39;
const R_SIGN = 0, R_INT = 1, R_DOT = 2, R_FRAC = 3;

/** How an interval of magnitudes lies against the allowed ones: inside, outside, or across a bound. */
type Fit = "i" | "o" | "p";

/**
 * A bounded number after its sign: `int` (`digits` digits) read, then in the fraction
 * `frac` (`fracDigits` digits). Allowed only while some completion is in range.
 */
export class Ranged implements Frame {
  /** The magnitude read so far, in `phase`. */
  constructor(
    readonly range: NumRange,
    readonly negative: boolean,
    readonly phase: number,
    readonly int: bigint,
    readonly digits: number,
    readonly frac: bigint,
    readonly fracDigits: number,
  ) {}

  get #bounds(): readonly [bigint, bigint] {
    return (this.negative ? this.range.negative : this.range.positive)!;
  }

  /** The magnitudes each way of going on reaches, in units (one interval per integer length). */
  #intervals(): [bigint, bigint][] {
    const unit = 10n ** BigInt(this.range.scale);
    if (this.phase === R_SIGN) return [[0n, 10n ** BigInt(MAX_DIGITS) * unit - 1n]];
    if (this.phase === R_INT) {
      const out: [bigint, bigint][] = [];
      const longest = this.int === 0n ? 0 : MAX_DIGITS - this.digits;
      for (let k = 0; k <= longest; k++) {
        const p = 10n ** BigInt(k);
        out.push([this.int * p * unit, (this.int + 1n) * p * unit - 1n]);
      }
      return out;
    }
    const p = 10n ** BigInt(this.range.scale - this.fracDigits);
    const w = this.int * 10n ** BigInt(this.fracDigits) + this.frac;
    return [[w * p, (w + 1n) * p - 1n]];
  }

  #fit([x, y]: [bigint, bigint]): Fit {
    const [a, b] = this.#bounds;
    if (x >= a && y <= b) return "i";
    return y < a || x > b ? "o" : "p";
  }

  /** True when some completion is allowed. */
  alive(): boolean {
    const [a, b] = this.#bounds, step = this.range.step;
    return this.#intervals().some(([x, y]) => multipleWithin(x > a ? x : a, y < b ? y : b, step));
  }

  /** True when the number may end here. */
  #canEnd(): boolean {
    if (this.phase === R_SIGN || this.phase === R_DOT) return false;
    const [a, b] = this.#bounds;
    const v = this.#intervals()[0][0];
    return v >= a && v <= b && v % this.range.step === 0n;
  }

  #go(phase: number, int: bigint, digits: number, frac: bigint, fracDigits: number, below: Stack | null, out: Stack[]) {
    const next = new Ranged(this.range, this.negative, phase, int, digits, frac, fracDigits);
    if (next.alive()) out.push(push(next, below));
  }

  /** See {@link Frame.step}. */
  step(sym: number, below: Stack | null, out: Stack[]): void {
    const digit = sym >= ZERO && sym <= NINE ? BigInt(sym - ZERO) : -1n;
    switch (this.phase) {
      case R_SIGN:
        if (digit >= 0n) this.#go(R_INT, digit, 1, 0n, 0, below, out);
        return;
      case R_INT:
        if (digit >= 0n) {
          if (this.int !== 0n && this.digits < MAX_DIGITS) {
            this.#go(R_INT, this.int * 10n + digit, this.digits + 1, 0n, 0, below, out);
          }
        } else if (sym === DOT && this.range.scale > 0) this.#go(R_DOT, this.int, this.digits, 0n, 0, below, out);
        else if (this.#canEnd()) stepStack(below, sym, out);
        return;
      case R_DOT:
      case R_FRAC:
        if (digit >= 0n) {
          if (this.fracDigits < this.range.scale) {
            this.#go(R_FRAC, this.int, this.digits, this.frac * 10n + digit, this.fracDigits + 1, below, out);
          }
        } else if (this.#canEnd()) stepStack(below, sym, out);
        return;
    }
  }

  /**
   * See {@link Frame.signature}. Two frames step alike when every interval fits the bounds
   * the same way and, with a step, their values leave the same remainder; only a frame with
   * an interval across a bound is told apart by its digits (few: those near a bound).
   */
  signature(): string {
    const fits = this.#intervals().map((iv) => this.#fit(iv)).join("");
    const exact = fits.includes("p") ? `,${this.int},${this.frac}` : "";
    const rest = this.range.step === 1n ? "" : `,${this.#intervals()[0][0] % this.range.step}`;
    return `R${identity(this.range)},${
      this.negative ? 1 : 0
    },${this.phase},${this.digits},${this.fracDigits},${fits}${exact}${rest}`;
  }
}

/** `x` (a finite float64) in units of 10^-scale, rounded up (`up`) or down to a whole unit. */
export function toUnits(x: number, scale: number, up: boolean): bigint {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:e([+-]\d+))?$/.exec(String(x));
  if (!m) throw new Error(`internal: cannot read the number ${x}`);
  const fraction = m[3] ?? "";
  let digits = BigInt(m[2] + fraction);
  if (m[1] === "-") digits = -digits;
  const e = Number(m[4] ?? 0) - fraction.length + scale;
  if (e >= 0) return digits * 10n ** BigInt(e);
  const d = 10n ** BigInt(-e);
  const q = digits / d, r = digits % d; // truncated toward zero
  if (r === 0n) return q;
  return up ? (r > 0n ? q + 1n : q) : (r < 0n ? q - 1n : q);
}

/** The float64 next to `x` toward +Infinity (`up`) or -Infinity. */
export function nextFloat(x: number, up: boolean): number {
  if (x === 0) return up ? Number.MIN_VALUE : -Number.MIN_VALUE;
  const f = new Float64Array([x]);
  const bits = new BigInt64Array(f.buffer);
  bits[0] += (x > 0) === up ? 1n : -1n;
  return f[0];
}
