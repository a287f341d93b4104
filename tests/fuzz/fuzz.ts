/**
 * Shared settings of the property-based fuzz tests (fast-check): the seed and the number of
 * cases come from the environment, so a failure is reproducible from the printed seed.
 *
 * - `K3_FUZZ_RUNS`: cases per property (default 300: the bounded run of `npm test`;
 *   `deno task fuzz` sets 100000).
 * - `K3_FUZZ_SEED`: the seed (default: derived from the clock, printed).
 *
 * The invariant every parser property states: the input is refused with a K3Error whose
 * message is one line and whose exit code is the documented one, or it is accepted and the
 * result is sound (equal to the clean result where the mutation kept the meaning).
 *
 * @module
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { K3Error } from "../../engine/errors.ts";

/** Cases per property. */
export const RUNS = Number(Deno.env.get("K3_FUZZ_RUNS") ?? 300);

/** The seed of `name`'s run, printed so the run can be repeated. */
export function seedFor(name: string): number {
  const env = Deno.env.get("K3_FUZZ_SEED");
  const seed = env !== undefined ? Number(env) : (Date.now() ^ (Math.random() * 2 ** 31)) >>> 0;
  console.log(`fuzz ${name}: seed ${seed}, ${RUNS} runs (repeat with K3_FUZZ_SEED=${seed} K3_FUZZ_RUNS=${RUNS})`);
  return seed;
}

/** Runs a property with the shared settings; `name` labels the seed line. */
export function check<T>(name: string, arb: fc.Arbitrary<T>, prop: (v: T) => void): void {
  const seed = seedFor(name);
  fc.assert(fc.property(arb, prop), { seed, numRuns: RUNS, endOnFailure: true });
}

/** `e` is a K3Error with one of `codes` and a one-line message (else rethrows `e`). */
export function assertRefusal(e: unknown, codes: readonly number[]): void {
  if (!(e instanceof K3Error)) throw e;
  assert.ok(codes.includes(e.exitCode), `exit code ${e.exitCode}: ${e.message}`);
  assert.ok(!/[\n\r\u2028\u2029]/.test(e.message), `one line: ${JSON.stringify(e.message)}`);
}

/** Odd values a JSON field can take (types, signs, sizes, specials). */
export const weirdValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.integer(),
  fc.integer({ min: -3, max: 3 }),
  fc.constantFrom(0, -1, 1, 2 ** 31, 2 ** 32, 2 ** 53, -(2 ** 31), 1e300, 0.5, -0.5, NaN),
  fc.double(),
  fc.string({ maxLength: 8 }),
  fc.constantFrom(null, true, false, "1", "\n", "k3: forged\nline"),
  fc.array(fc.integer({ min: -2, max: 20 }), { maxLength: 6 }),
  fc.constant({}),
);

/** A JSON object with one structure-aware mutation applied at a random path. */
export function mutateJson(root: unknown, rnd: { path: number[]; op: number; value: unknown }): unknown {
  const copy = structuredClone(root);
  let node: unknown = copy;
  let parent: Record<string, unknown> | unknown[] | undefined;
  let key: string | number | undefined;
  for (const step of rnd.path) {
    if (typeof node !== "object" || node === null) break;
    const keys = Array.isArray(node) ? node.map((_, i) => i) : Object.keys(node);
    if (keys.length === 0) break;
    parent = node as Record<string, unknown>;
    key = keys[step % keys.length];
    node = (node as Record<string | number, unknown>)[key];
  }
  if (parent === undefined || key === undefined) return rnd.value;
  const p = parent as Record<string | number, unknown>;
  switch (rnd.op % 6) {
    case 0: // replace by an odd value
      p[key] = rnd.value;
      break;
    case 1: // remove
      if (Array.isArray(p)) p.splice(Number(key), 1);
      else delete p[key];
      break;
    case 2: // scale a number
      if (typeof node === "number") p[key] = node * (typeof rnd.value === "number" ? rnd.value : 32);
      else p[key] = rnd.value;
      break;
    case 3: // off by one
      if (typeof node === "number") p[key] = node + (rnd.path.length % 2 ? 1 : -1);
      else p[key] = rnd.value;
      break;
    case 4: // duplicate into a sibling
      if (Array.isArray(p)) p.push(structuredClone(node));
      else p[`${key}_dup`] = structuredClone(node);
      break;
    default: // swap with a sibling
      {
        const keys = Array.isArray(p) ? p.map((_, i) => i) : Object.keys(p);
        const other = keys[(rnd.path[0] ?? 0) % keys.length];
        const t = p[other];
        p[other] = p[key];
        p[key] = t;
      }
      break;
  }
  return copy;
}

/** Arbitrary for mutateJson's random choices. */
export const jsonMutation = fc.record({
  path: fc.array(fc.nat(), { minLength: 1, maxLength: 6 }),
  op: fc.nat(),
  value: weirdValue,
});

/** Several mutations in a row. */
export const jsonMutations = fc.array(jsonMutation, { minLength: 1, maxLength: 3 });

/** Applies every mutation of `ms` to `root`. */
export function mutateAll(root: unknown, ms: { path: number[]; op: number; value: unknown }[]): unknown {
  return ms.reduce((acc, m) => mutateJson(acc, m), root);
}
