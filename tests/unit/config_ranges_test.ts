/**
 * Config hyperparameter ranges (engine/model/config.ts): every float field of config.json
 * is finite and inside the range its math needs, or the config is refused with exit 2 and
 * one line naming the field; the cases a seeded fuzz once found accepted (a negative
 * routed scaling or SiTU cap, a cap of 2^31) are refused; any value inside the ranges is
 * accepted as read.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { parseConfig } from "../../engine/model/config.ts";
import { K3Error } from "../../engine/errors.ts";
import { TINY } from "../helpers.ts";

const clean = JSON.parse(Deno.readTextFileSync(`${TINY}/config.json`));

/** The float fields: where they sit, the range accepted (lo, hi], the parsed value. */
const FIELDS = [
  { path: ["text_config", "rms_norm_eps"], lo: 0, hi: 1, hiOpen: true, read: (c: Cfg) => c.rmsNormEps },
  {
    path: ["text_config", "linear_attn_config", "gate_lower_bound"],
    lo: -1000,
    hi: 0,
    hiOpen: false,
    read: (c: Cfg) => c.kda.gateLowerBound,
  },
  {
    path: ["text_config", "routed_scaling_factor"],
    lo: 0,
    hi: 1000,
    hiOpen: false,
    read: (c: Cfg) => c.moe.routedScaling,
  },
  { path: ["text_config", "activation_situ_beta"], lo: 0, hi: 1000, hiOpen: false, read: (c: Cfg) => c.situBeta },
  {
    path: ["text_config", "activation_situ_linear_beta"],
    lo: 0,
    hi: 1000,
    hiOpen: false,
    read: (c: Cfg) => c.situLinearBeta,
  },
];
type Cfg = ReturnType<typeof parseConfig>;

/** The clean config with the field at `path` set to `v`. */
function withField(path: string[], v: unknown): unknown {
  const c = structuredClone(clean);
  let o = c;
  for (const k of path.slice(0, -1)) o = o[k];
  o[path.at(-1)!] = v;
  return c;
}

/** True when `v` is inside the field's range. */
const inside = (f: typeof FIELDS[number], v: number) => v > f.lo && (f.hiOpen ? v < f.hi : v <= f.hi);

function refused(cfg: unknown, field: string): void {
  assert.throws(() => parseConfig(cfg), (e: unknown) => {
    assert.ok(e instanceof K3Error, String(e));
    assert.equal(e.exitCode, 2);
    assert.doesNotMatch(e.message, /\n/);
    assert.match(e.message, new RegExp(field));
    return true;
  });
}

Deno.test("config ranges: the values the fuzz found accepted are refused with exit 2 naming the field", () => {
  refused(withField(["text_config", "routed_scaling_factor"], -1), "routed_scaling_factor");
  refused(withField(["text_config", "activation_situ_linear_beta"], -1), "activation_situ_linear_beta");
  refused(withField(["text_config", "activation_situ_beta"], 2147483648), "activation_situ_beta");
  refused(withField(["text_config", "activation_situ_beta"], 0), "activation_situ_beta");
  refused(withField(["text_config", "linear_attn_config", "gate_lower_bound"], 5), "gate_lower_bound");
  refused(withField(["text_config", "rms_norm_eps"], 0), "rms_norm_eps");
});

Deno.test("config ranges (property): any double is accepted as read inside the range, refused outside", () => {
  const special = fc.constantFrom(0, -0, 1, -1, 1000, 1000.0000001, -1000, 2 ** 31, Number.MIN_VALUE, 1e-300);
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: FIELDS.length - 1 }),
      fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), special),
      (i, v) => {
        const f = FIELDS[i];
        const name = f.path.at(-1)!;
        if (inside(f, v)) assert.equal(f.read(parseConfig(withField(f.path, v))), v);
        else refused(withField(f.path, v), name);
      },
    ),
    { seed: 21, numRuns: 2000 },
  );
  // Not numbers at all: named too.
  for (const f of FIELDS) for (const v of ["1", null, [], {}, true]) refused(withField(f.path, v), f.path.at(-1)!);
});
