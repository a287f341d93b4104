/**
 * Constrained decoding on the tiny tokenizer: the schema subset and its refusals, every
 * valid value accepted (completeness), every finished walk of allowed tokens valid per an
 * independent validator, ajv (soundness), the forced tool-call form, and the lazy pick
 * equal to the whole mask's.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { Ajv } from "ajv";
import { z } from "zod";
import { forcedCalls, TINY } from "../helpers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { compileSchema, compileToolParameters, SchemaError } from "../../engine/generate/grammar/schema.ts";
import { type GrammarSpec, startState, TOOL_MARKUP } from "../../engine/generate/grammar/forms.ts";
import { TokenConstraint, TokenSymbols, tokenSymbols } from "../../engine/generate/grammar/mask.ts";
import { DONE, type State } from "../../engine/generate/grammar/automaton.ts";
import { argmax, makeSampler } from "../../engine/generate/sampling.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { chatGrammar } from "../../cli/structured.ts";

const tok = Tokenizer.load(TINY);
const V = 1024;
const symbols = tokenSymbols(tok, V);
const EOS = tok.specialId("[EOS]");
const END_MSG = tok.specialId("<|end_of_msg|>");
const ajv = new Ajv({ strict: false });
addFormats(ajv);
const RUNS = Number(Deno.env.get("K3_FUZZ_RUNS") ?? 40);
const TEXT = Array.from({ length: V }, (_, id) => tok.decode([id]));
const CLOSER = TEXT.map((t) => /["\]},:]|^<\|/.test(t) && !/^\s+$/.test(t));
const SPACE = TEXT.map((t) => /^\s+$/.test(t));

type Schema = Record<string, unknown>;

/**
 * The formats' meanings for ajv, written apart from the grammar's patterns: calendar dates
 * through Date, addresses through URL, email as zod checks it.
 */
function addFormats(v: Ajv): void {
  const date = (s: string) => {
    const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
    if (!m) return false;
    // setUTCFullYear, not Date.UTC: Date.UTC reads the years 0-99 as 1900-1999.
    const d = new Date(0);
    d.setUTCFullYear(Number(m[1]), Number(m[2]) - 1, Number(m[3]));
    return d.getUTCFullYear() === Number(m[1]) && d.getUTCMonth() === Number(m[2]) - 1 &&
      d.getUTCDate() === Number(m[3]);
  };
  const time = (s: string, offset: boolean) => {
    const m = /^(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-](\d{2}):(\d{2}))?$/.exec(s);
    if (!m || (offset && m[5] === undefined)) return false;
    return Number(m[1]) < 24 && Number(m[2]) < 60 && Number(m[3]) < 60 && Number(m[6] ?? 0) < 24 &&
      Number(m[7] ?? 0) < 60;
  };
  v.addFormat("date", date);
  v.addFormat("time", (s: string) => time(s, false));
  v.addFormat("date-time", (s: string) => {
    const [d, t, ...rest] = s.split("T");
    return rest.length === 0 && t !== undefined && date(d) && time(t, true);
  });
  v.addFormat(
    "email",
    /^(?!\.)(?!.*\.\.)([A-Za-z0-9_'+\-\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$/,
  );
  v.addFormat("uuid", /^[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$/i);
  v.addFormat("ipv4", (s: string) => {
    const parts = s.split(".");
    return parts.length === 4 && parts.every((p) => /^(0|[1-9]\d{0,2})$/.test(p) && Number(p) <= 255);
  });
  v.addFormat("ipv6", (s: string) => {
    if (!/^[0-9a-fA-F:]+$/.test(s)) return false;
    try {
      new URL(`http://[${s}]/`);
      return true;
    } catch {
      return false;
    }
  });
  v.addFormat("uri", (s: string) => {
    const m = /^([A-Za-z][A-Za-z0-9+.-]*):(.+)$/.exec(s);
    return m !== null && !/[\s"<>\\^`{|}]/.test(m[2]) && !/%(?![0-9A-Fa-f]{2})/.test(m[2]);
  });
}

/** Integers with bounds (inclusive, exclusive, zod's safe-integer bounds) and a step; always satisfiable. */
const integerRangeArb: fc.Arbitrary<Schema> = fc.oneof(
  fc.constant({ type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 }),
  fc.constant({ type: "integer", exclusiveMinimum: 0, maximum: 9007199254740991 }),
  fc.record({
    lo: fc.integer({ min: -1200, max: 1200 }),
    width: fc.constantFrom(0, 1, 9, 99, 1000, 123456),
    exclusive: fc.boolean(),
    step: fc.constantFrom(undefined, 1, 2, 3, 7, 10),
    open: fc.constantFrom("none", "low", "high"),
  }).map(({ lo, width, exclusive, step, open }) => {
    const hi = lo + width + (exclusive ? 2 : 0);
    const s: Schema = { type: "integer" };
    if (open !== "low") s[exclusive ? "exclusiveMinimum" : "minimum"] = lo;
    if (open !== "high") s[exclusive ? "exclusiveMaximum" : "maximum"] = hi;
    if (step !== undefined) s.multipleOf = step;
    return s;
  }).filter((s) => integerChoices(s).length > 0),
);

/** Numbers with bounds, fractional ones among them. */
const numberRangeArb: fc.Arbitrary<Schema> = fc.record({
  lo: fc.constantFrom(-10.5, -1, 0, 0.5, 1, 3.25, 0.1),
  width: fc.constantFrom(0.001, 0.5, 1, 100),
  exclusive: fc.boolean(),
}).map(({ lo, width, exclusive }) =>
  exclusive
    ? { type: "number", exclusiveMinimum: lo, exclusiveMaximum: lo + width }
    : { type: "number", minimum: lo, maximum: lo + width }
);

/** The integers a bounded integer schema allows within 2000 of its lower end (or of 0). */
function integerChoices(s: Schema): number[] {
  const lo = typeof s.minimum === "number"
    ? s.minimum
    : typeof s.exclusiveMinimum === "number"
    ? s.exclusiveMinimum + 1
    : -1000;
  const hi = typeof s.maximum === "number"
    ? s.maximum
    : typeof s.exclusiveMaximum === "number"
    ? s.exclusiveMaximum - 1
    : lo + 2000;
  const out = [];
  for (let v = lo; v <= Math.min(hi, lo + 2000); v++) if (v % ((s.multipleOf as number) ?? 1) === 0) out.push(v);
  return out;
}

/** Strings with a pattern and/or a format; `examples` (an annotation) lists values they allow. */
const PATTERNED: Schema[] = [
  { type: "string", pattern: "^[a-z]+\\d{2}$", examples: ["ab12", "z00"] },
  { type: "string", pattern: "^(?:ab|c)*$", maxLength: 5, examples: ["", "abc", "cab", "ccccc"] },
  { type: "string", pattern: "x", examples: ["x", "axb", "éx😀"] },
  { type: "string", pattern: "^\\w{2,4}-\\d$", examples: ["ab-1", "a_c9-0"] },
  { type: "string", pattern: '^[^"\\\\]{1,3}$', examples: ["a", "é中", "\n\t"] },
  { type: "string", pattern: '^.?"$', examples: ['"', 'a"'] },
  { type: "string", pattern: "^(?!ab)[a-c]{2}$", minLength: 2, examples: ["aa", "ba", "cc"] },
  { type: "string", format: "date-time", examples: ["2024-02-29T12:00:00Z", "1999-12-31T23:59:59.123+05:30"] },
  { type: "string", format: "date", examples: ["2023-12-31", "2000-02-29"] },
  { type: "string", format: "time", examples: ["23:59:59.5", "00:00:00Z"] },
  { type: "string", format: "email", examples: ["a.b@ex-ample.com", "x+y@a.io"] },
  { type: "string", format: "uuid", examples: ["123e4567-e89b-12d3-a456-426614174000"] },
  { type: "string", format: "ipv4", examples: ["192.168.0.1", "0.0.0.0"] },
  { type: "string", format: "ipv6", examples: ["::1", "2001:db8::ff00:42:8329"] },
  { type: "string", format: "uri", examples: ["https://example.com/a?b=c#d", "urn:isbn:0451450523"] },
];

/** Random schemas of the subset, nested to `depth`. */
function schemaArb(depth: number): fc.Arbitrary<Schema> {
  const prim = fc.oneof(
    fc.integer({ min: -50, max: 50 }),
    fc.constantFrom("a", "b c", 'q"t', "é", "\\"),
    fc.boolean(),
    fc.constant(null),
  );
  const leaves: fc.Arbitrary<Schema>[] = [
    fc.record({ min: fc.nat(3), extra: fc.nat(6) }).map(({ min, extra }) => ({
      type: "string",
      minLength: min,
      maxLength: min + extra,
    })),
    fc.constant({ type: "integer" }),
    fc.constant({ type: "number" }),
    fc.constant({ type: "boolean" }),
    fc.constant({ type: ["string", "null"], maxLength: 4 }),
    fc.uniqueArray(prim, { minLength: 1, maxLength: 4, selector: (v) => JSON.stringify(v) }).map((e) => ({ enum: e })),
    prim.map((c) => ({ const: c })),
    integerRangeArb,
    numberRangeArb,
    fc.constantFrom(...PATTERNED),
    fc.constant({ type: "object", properties: {}, additionalProperties: false }),
  ];
  if (depth === 0) return fc.oneof(...leaves);
  const sub = schemaArb(depth - 1);
  const names = fc.uniqueArray(fc.constantFrom("a", "b", "name", "é k", 'q"k', "x\\y"), { minLength: 1, maxLength: 3 });
  const obj = fc.tuple(
    names,
    fc.array(sub, { minLength: 3, maxLength: 3 }),
    fc.array(fc.boolean(), { minLength: 3, maxLength: 3 }),
    fc.boolean(),
  )
    .map(([keys, subs, req, ap]) => ({
      type: "object",
      properties: Object.fromEntries(keys.map((k, i) => [k, subs[i]])),
      required: keys.filter((_, i) => req[i]),
      additionalProperties: ap,
    }));
  const arr = fc.tuple(sub, fc.nat(2), fc.nat(3)).map(([items, min, extra]) => ({
    type: "array",
    items,
    minItems: min,
    maxItems: min + extra,
  }));
  const any = fc.tuple(sub, sub).map(([a, b]) => ({ anyOf: [a, b] }));
  const record = sub.map((value) => ({
    type: "object",
    propertyNames: { type: "string" },
    additionalProperties: value,
  }));
  return fc.oneof(...leaves, obj, arr, any, record);
}

/** A random value `schema` allows (for the subset above). */
function sampleValue(schema: Schema, r: () => number): unknown {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
  if (schema.enum) return pick(schema.enum as unknown[]);
  if ("const" in schema) return schema.const;
  if (schema.anyOf) return sampleValue(pick(schema.anyOf as Schema[]), r);
  if (schema.examples) return pick(schema.examples as unknown[]);
  const type = Array.isArray(schema.type) ? pick(schema.type as string[]) : schema.type;
  switch (type) {
    case "string": {
      const min = (schema.minLength as number) ?? 0, max = (schema.maxLength as number) ?? min + 5;
      const n = min + Math.floor(r() * (max - min + 1));
      return Array.from({ length: n }, () => pick(["a", "Z", " ", '"', "\\", "\n", "é", "😀", "\u0001", "中"])).join(
        "",
      );
    }
    case "integer":
      if (Object.keys(schema).length > 1) return pick(integerChoices(schema));
      return Math.floor(r() * 2000) - 1000;
    case "number": {
      if (Object.keys(schema).length === 1) return pick([0, -1.5, 3.25e10, 1e-7, 42]);
      const lo = (schema.minimum ?? schema.exclusiveMinimum) as number;
      const hi = (schema.maximum ?? schema.exclusiveMaximum) as number;
      return Number((lo + (hi - lo) * (0.1 + 0.8 * r())).toFixed(6));
    }
    case "boolean":
      return r() < 0.5;
    case "null":
      return null;
    case "object": {
      const out: Record<string, unknown> = {};
      if (schema.propertyNames) {
        for (const k of ["k", "é z"]) if (r() < 0.6) out[k] = sampleValue(schema.additionalProperties as Schema, r);
        return out;
      }
      const req = new Set(schema.required as string[]);
      for (const [k, s] of Object.entries(schema.properties as Record<string, Schema>)) {
        if (req.has(k) || r() < 0.5) out[k] = sampleValue(s, r);
      }
      if (schema.additionalProperties && r() < 0.5) out["extra key"] = [1, { z: "w" }];
      return out;
    }
    case "array": {
      const min = schema.minItems as number, max = schema.maxItems as number;
      const n = min + Math.floor(r() * (max - min + 1));
      return Array.from({ length: n }, () => sampleValue(schema.items as Schema, r));
    }
  }
  throw new Error(`sampleValue: ${JSON.stringify(schema)}`);
}

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

/** True when the ids (then an end id) take `start` to the end of the grammar. */
function acceptsIds(start: State, ids: number[]): boolean {
  let s = start;
  for (const id of ids) {
    s = symbols.step(s, id);
    if (s.length === 0) return false;
  }
  return s.some((x) => x === DONE);
}

/** Walks allowed tokens at random, preferring ones that close things, until an end id; null when it runs long. */
function walk(start: State, r: () => number, ends: number[], steps = 800): number[] | null {
  const allowed = new Uint8Array(V);
  const ids: number[] = [];
  let s = start;
  for (let i = 0; i < steps; i++) {
    const n = symbols.mask(s, allowed);
    assert.ok(n > 0, `the grammar allows no token after ${JSON.stringify(tok.decode(ids))}`);
    const all = [...allowed.keys()].filter((k) => allowed[k] === 1);
    const end = all.find((id) => ends.includes(id));
    const closers = all.filter((id) => CLOSER[id]);
    const notWs = all.filter((id) => !SPACE[id]);
    const u = r();
    const id = end !== undefined && u < 0.5
      ? end
      : closers.length > 0 && u < 0.8
      ? closers[Math.floor(r() * closers.length)]
      : (notWs.length > 0 && u < 0.95 ? notWs : all)[
        Math.floor(r() * (notWs.length > 0 && u < 0.95 ? notWs : all).length)
      ];
    ids.push(id);
    s = symbols.step(s, id);
    if (ends.includes(id)) {
      assert.ok(s.some((x) => x === DONE));
      return ids;
    }
  }
  return null;
}

Deno.test("schema subset: refusals name the keyword; unsatisfiable schemas are refused", () => {
  const refuses = (schema: unknown, path: RegExp, message: RegExp) => {
    assert.throws(
      () => compileSchema(schema),
      (e: unknown) => e instanceof SchemaError && path.test(e.path) && message.test(e.message),
    );
  };
  refuses({ type: "string", pattern: "^(a)\\1$" }, /^pattern$/, /escape \\1/);
  refuses({ type: "string", pattern: "a(?<=b)" }, /^pattern$/, /lookbehind/);
  refuses({ type: "string", pattern: "a(?!b)" }, /^pattern$/, /lookahead/);
  refuses({ type: "string", pattern: "([a" }, /^pattern$/, /not a valid ECMAScript/);
  refuses(
    { properties: { a: { type: "string", format: "hostname" } } },
    /^properties\.a\.format$/,
    /format "hostname" is not supported/,
  );
  refuses({ type: "object", minProperties: 1 }, /^minProperties$/, /not supported/);
  refuses({ type: "array", uniqueItems: true }, /^uniqueItems$/, /not supported/);
  refuses({ type: "number", multipleOf: 0.01 }, /^multipleOf$/, /positive integer/);
  refuses({ type: "integer", minimum: 3, maximum: 2 }, /^$/, /no integer/);
  refuses({ type: "integer", minimum: 1, maximum: 4, multipleOf: 5 }, /^$/, /no integer/);
  refuses({ type: "integer", minimum: 1e17 }, /^$/, /at most 16 digits/);
  refuses({ type: "object", propertyNames: { pattern: "^a" } }, /^propertyNames$/, /"type": "string"/);
  refuses({ oneOf: [{ type: "string" }, { type: "number" }] }, /^oneOf$/, /discriminator/);
  refuses({ allOf: [{ type: "string" }, { maxLength: 2 }] }, /^allOf$/, /one schema/);
  refuses({ type: "array", items: [{ type: "string" }] }, /^items$/, /tuples/);
  refuses({ type: "string", minLength: 3, maxLength: 2 }, /^minLength$/, /above/);
  refuses({ type: "object", required: ["x"], additionalProperties: false }, /^required$/, /not in properties/);
  refuses({ type: "string", enum: [1, 2] }, /^enum$/, /no listed value/);
  refuses({ $ref: "#/$defs/missing" }, /^\$ref$/, /names no schema/);
  refuses({ $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" }, /\$ref/, /refers to itself/);
  refuses({ anyOf: [{ type: "string" }], type: "string" }, /^type$/, /beside anyOf/);
  refuses(false, /^$/, /allows no value/);
  // Annotations and keys of other vocabularies pass; a recursive schema through an object compiles.
  compileSchema({
    title: "t",
    description: "d",
    $schema: "x",
    strict: true,
    "x-order": 1,
    type: "object",
    properties: { n: { $ref: "#" } },
  });
  assert.throws(() => compileToolParameters({ type: "array" }), /must be an object/);
});

Deno.test("response_format: a keyword outside the subset is a 400 naming it; json_object and json_schema parse", () => {
  const msg = [{ role: "user", content: "hi" }];
  const rf = (schema: unknown) => ({
    messages: msg,
    response_format: { type: "json_schema", json_schema: { name: "x", schema } },
  });
  assert.throws(
    () => parseChatRequest(rf({ type: "object", properties: { a: { type: "string", pattern: "\\bx" } } })),
    (e: { status: number; param: string; message: string }) =>
      e.status === 400 && e.param === "response_format.json_schema.schema.properties.a.pattern" &&
      /'response_format\.json_schema\.schema\.properties\.a\.pattern': a word boundary/.test(e.message),
  );
  assert.throws(
    () => parseChatRequest({ messages: msg, response_format: { type: "yaml" } }),
    /must be text, json_object or json_schema/,
  );
  assert.equal(parseChatRequest({ messages: msg, response_format: { type: "text" } }).responseFormat, undefined);
  assert.equal(
    parseChatRequest({ messages: msg, response_format: { type: "json_object" } }).responseFormat?.type,
    "json_object",
  );
  const r = parseChatRequest(rf({ type: "object", properties: { a: { type: "string" } } }));
  assert.equal(chatGrammar(r)?.kind, "value");
});

Deno.test("completeness: every value a random schema allows, serialized and tokenized, is accepted", () => {
  fc.assert(
    fc.property(schemaArb(2), fc.integer({ min: 1, max: 2 ** 31 }), fc.boolean(), (schema, seed, pretty) => {
      const r = rng(seed);
      const value = sampleValue(schema, r);
      assert.ok(ajv.validate(schema, value), `generator made an invalid value ${JSON.stringify(value)}`);
      const text = JSON.stringify(value, null, pretty ? 2 : undefined);
      const start = startState({ kind: "value", value: compileSchema(schema) }, tok, [EOS]);
      assert.ok(acceptsIds(start, [...tok.encode(text), EOS]), `refused ${text} for ${JSON.stringify(schema)}`);
    }),
    { numRuns: RUNS * 4 },
  );
});

Deno.test("soundness: every finished random walk of allowed tokens is JSON the schema allows (ajv)", () => {
  let finished = 0, total = 0;
  fc.assert(
    fc.property(schemaArb(2), fc.integer({ min: 1, max: 2 ** 31 }), (schema, seed) => {
      total++;
      const start = startState({ kind: "value", value: compileSchema(schema) }, tok, [EOS]);
      const ids = walk(start, rng(seed), [EOS]);
      if (ids === null) return;
      finished++;
      const text = tok.decode(ids.slice(0, -1));
      const value = JSON.parse(text);
      assert.ok(ajv.validate(schema, value), `${text} fails ${JSON.stringify(schema)}: ${ajv.errorsText()}`);
    }),
    { numRuns: RUNS * 2 },
  );
  assert.ok(finished >= total * 0.8, `only ${finished} of ${total} walks finished`);
});

Deno.test("soundness: a stepped integer without a maximum stays where float64 readers see a multiple", () => {
  // fast-check found it: this walk wrote 9405404251955369, a multiple of 7 that a float64
  // reader rounds to one that is not.
  const schema = { type: "integer", minimum: 0, multipleOf: 7 };
  for (const seed of [1736404519, 1, 2, 3, 4, 5]) {
    const ids = walk(startState({ kind: "value", value: compileSchema(schema) }, tok, [EOS]), rng(seed), [EOS]);
    if (ids === null) continue;
    const text = tok.decode(ids.slice(0, -1));
    assert.ok(Number.isSafeInteger(JSON.parse(text)), text);
    assert.ok(ajv.validate(schema, JSON.parse(text)), text);
  }
});

Deno.test("forced tool calls: a walk yields calls of allowed names whose arguments validate; parallel false allows one", () => {
  const objSchema = schemaArb(1).map((s) => ({
    type: "object",
    properties: { p: s, q: { type: "integer" } },
    required: ["p"],
    additionalProperties: false,
  }));
  let finished = 0;
  fc.assert(
    fc.property(
      objSchema,
      objSchema,
      fc.boolean(),
      fc.boolean(),
      fc.boolean(),
      fc.integer({ min: 1, max: 2 ** 31 }),
      (s1, s2, named, parallel, thinking, seed) => {
        const body = {
          messages: [{ role: "user", content: "call" }],
          chat_template_kwargs: { thinking },
        };
        const r = {
          ...parseChatRequest(body),
          tools: [{ name: 'get "w"<x>', parameters: s1 }, { name: "other", parameters: s2 }],
          toolChoice: named ? { name: "other" } : "required" as const,
          parallelToolCalls: parallel,
        };
        // A top-level string argument is written raw; its pattern or format holds on the raw text.
        const spec = chatGrammar(r) as GrammarSpec;
        const start = startState(spec, tok, [END_MSG, EOS]);
        const ids = walk(start, rng(seed), [END_MSG, EOS], 1500);
        if (ids === null) return;
        finished++;
        const text = tok.decode(ids);
        const calls = forcedCalls(text);
        // A named choice is exactly one call; "required" one or more (one without parallel calls).
        assert.ok(calls.length >= 1 && ((parallel && !named) || calls.length === 1), text);
        calls.forEach((c, i) => {
          assert.equal(c.index, i + 1);
          const decl = r.tools.find((t) => t.name === c.name);
          assert.ok(decl && (!named || c.name === "other"), `call of ${c.name}`);
          assert.ok(ajv.validate(decl.parameters, c.args), `${JSON.stringify(c.args)}: ${ajv.errorsText()}`);
        });
        if (!thinking) assert.ok(text.startsWith(TOOL_MARKUP.closeResponse + TOOL_MARKUP.openTools), text);
      },
    ),
    { numRuns: RUNS },
  );
  assert.ok(finished > RUNS / 2, `only ${finished} walks finished`);
});

Deno.test("lazy pick: the same token as the whole mask's pick, greedy or sampled; greedy keeps the unconstrained token whenever allowed", () => {
  const schema = {
    type: "object",
    properties: { a: { type: "string", maxLength: 3 }, b: { type: "array", items: { type: "integer" } } },
    required: ["a"],
  };
  const spec: GrammarSpec = { kind: "value", value: compileSchema(schema) };
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 2 ** 31 }), fc.boolean(), (seed, sampled) => {
      const r = rng(seed);
      const lazy = new TokenConstraint(symbols, startState(spec, tok, [EOS]));
      const chooseLazy = sampled ? makeSampler({ temperature: 1, topP: 1, topK: 0, minP: 0, seed }) : argmax;
      const twin = sampled ? makeSampler({ temperature: 1, topP: 1, topK: 0, minP: 0, seed }) : argmax;
      for (let step = 0; step < 40 && !lazy.finished; step++) {
        const logits = Float32Array.from({ length: V }, () => (r() - 0.5) * 8);
        const plain = argmax(logits);
        const allowedPlain = symbols.step(lazy.state, plain).length > 0;
        const full = new TokenConstraint(symbols, lazy.state, true);
        const t = lazy.pick(logits.slice(), chooseLazy);
        // One draw for both: a twin sampler on the whole mask draws the same token.
        assert.equal(full.pick(logits.slice(), twin), t, `step ${step}`);
        if (!sampled && allowedPlain) assert.equal(t, plain);
        if (t === EOS) break;
      }
    }),
    { numRuns: RUNS },
  );
});

Deno.test("whole mask inside a long string: the mask kept by state number equals a fresh walk", () => {
  const schema = {
    type: "object",
    properties: { text: { type: "string", minLength: 3 }, more: { type: "array", items: { type: "string" } } },
    required: ["text"],
  };
  const spec: GrammarSpec = { kind: "value", value: compileSchema(schema) };
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 2 ** 31 }), (seed) => {
      const r = rng(seed);
      const c = new TokenConstraint(symbols, startState(spec, tok, [EOS]), true);
      const fresh = new Uint8Array(V);
      for (let step = 0; step < 60 && !c.finished; step++) {
        const logits = Float32Array.from({ length: V }, () => (r() - 0.5) * 8);
        const before = c.state;
        const masked = logits.slice();
        c.pick(masked, makeSampler({ temperature: 1, topP: 1, topK: 0, minP: 0, seed: seed + step }));
        symbols.mask(before, fresh);
        for (let id = 0; id < V; id++) assert.equal(masked[id] !== -Infinity, fresh[id] === 1, `step ${step} id ${id}`);
      }
    }),
    { numRuns: RUNS / 2 },
  );
});

/** The allowed set of `state` token by token: each token's bytes stepped on their own, no walk, no table, no cache. */
function perTokenMask(syms: TokenSymbols, state: State): Uint8Array {
  const out = new Uint8Array(syms.size);
  for (let id = 0; id < syms.size; id++) out[id] = syms.step(state, id).length > 0 ? 1 : 0;
  return out;
}

/**
 * Random walks under a maskAll constraint (its state table and mask cache kept across the
 * walk); at every step the mask it applies must equal the per-token one.
 */
function masksMatchPerToken(syms: TokenSymbols, spec: GrammarSpec, ends: number[], seed: number, steps: number): void {
  const r = rng(seed);
  const c = new TokenConstraint(syms, startState(spec, tok, ends), true);
  for (let step = 0; step < steps && !c.finished; step++) {
    const want = perTokenMask(syms, c.state);
    const logits = Float32Array.from({ length: syms.size }, () => (r() - 0.5) * 8);
    const masked = logits.slice();
    const t = c.pick(masked, makeSampler({ temperature: 1, topP: 1, topK: 0, minP: 0, seed: seed + step }));
    for (let id = 0; id < syms.size; id++) {
      assert.equal(masked[id] !== -Infinity, want[id] === 1, `step ${step} id ${id}`);
    }
    if (ends.includes(t)) break;
  }
}

Deno.test("whole mask: the table walk and the mask cache equal a per-token check on every state of random walks", () => {
  fc.assert(
    fc.property(
      fc.oneof(schemaArb(2), fc.constant({}), fc.constant({ type: "object", additionalProperties: true })),
      fc.integer({ min: 1, max: 2 ** 31 }),
      (schema, seed) => masksMatchPerToken(symbols, { kind: "value", value: compileSchema(schema) }, [EOS], seed, 50),
    ),
    { numRuns: RUNS },
  );
});

Deno.test("whole mask: a forced call's arguments (strings raw, patterns and formats walked) equal a per-token check", () => {
  const args = fc.constantFrom(...PATTERNED).map((p) => ({
    type: "object",
    properties: { p, q: { type: "integer", minimum: 0, maximum: 99 } },
    required: ["p"],
    additionalProperties: false,
  }));
  fc.assert(
    fc.property(args, fc.integer({ min: 1, max: 2 ** 31 }), (schema, seed) => {
      const spec: GrammarSpec = {
        kind: "tools",
        tools: [{ name: "f", args: compileToolParameters(schema) }],
        parallel: false,
        reply: "response",
      };
      // The tiny tokenizer spells the call's markup in many tokens: the arguments start ~60 steps in.
      masksMatchPerToken(symbols, spec, [END_MSG, EOS], seed, 200);
    }),
    { numRuns: RUNS },
  );
});

Deno.test("whole mask: tokens that close a free key and name another (three quotes or more) are checked exactly", () => {
  // A vocabulary of single bytes plus fragments a free-key object could take in one token:
  // closing a key, a value, and a second key that may repeat the first.
  const enc = new TextEncoder();
  const frags = [
    '":1,"a"',
    '":1,"ab"',
    'a":0,"a":',
    'b":"x","b"',
    '","a":',
    '"a":"a","a"',
    '{"a":1,"a"',
    '{"ab',
    '":{"a":',
    '""',
    '","',
    '":"',
    "ab",
    "ba",
  ];
  const tokens: (Uint8Array | null)[] = [];
  for (let b = 0x20; b < 0x7f; b++) tokens.push(Uint8Array.of(b));
  for (const f of frags) tokens.push(enc.encode(f));
  tokens.push(null); // the end id
  const end = tokens.length - 1;
  const syms = new TokenSymbols(tokens);
  assert.ok(syms.quoted.length >= 6, "the fragments with three quotes are marked");
  fc.assert(
    fc.property(
      fc.constantFrom<Schema>(
        {},
        { type: "object", additionalProperties: true },
        { type: "object", properties: { a: { type: "integer" }, ab: { type: "string" } }, additionalProperties: true },
      ),
      fc.integer({ min: 1, max: 2 ** 31 }),
      (schema, seed) => masksMatchPerToken(syms, { kind: "value", value: compileSchema(schema) }, [end], seed, 40),
    ),
    { numRuns: RUNS * 2 },
  );
});

Deno.test("empty objects: an object with no keys allowed never opens a key, also nested and optional (the mask never runs dry)", () => {
  const empty = { type: "object", properties: {}, additionalProperties: false };
  const quote = tok.encode('"');
  for (
    const schema of [
      empty,
      {
        type: "object",
        properties: { a: empty, b: { anyOf: [empty, { type: "null" }] } },
        required: ["a"],
        additionalProperties: false,
      },
      { type: "array", items: empty, maxItems: 2 },
    ]
  ) {
    // Greedy on logits that favour a quote above all: the old automaton took `{"` and then
    // allowed no token at all.
    const c = new TokenConstraint(symbols, startState({ kind: "value", value: compileSchema(schema) }, tok, [EOS]));
    const ids: number[] = [];
    for (let step = 0; step < 200 && !c.finished; step++) {
      const logits = Float32Array.from({ length: V }, (_, id) => (SPACE[id] ? -10 : -id / V));
      for (const q of quote) logits[q] = 10;
      logits[EOS] = 5;
      const t = c.pick(logits, argmax);
      ids.push(t);
      if (t === EOS) break;
    }
    const value = JSON.parse(tok.decode(ids.slice(0, -1)));
    assert.ok(ajv.validate(schema, value), JSON.stringify(value));
  }
  // The tool with no arguments, forced.
  const r = {
    ...parseChatRequest({ messages: [{ role: "user", content: "time?" }] }),
    tools: [{ name: "get_time", parameters: empty }],
    toolChoice: { name: "get_time" },
    parallelToolCalls: false,
  };
  const ids = walk(startState(chatGrammar(r) as GrammarSpec, tok, [END_MSG, EOS]), rng(7), [END_MSG, EOS], 1500);
  assert.ok(ids !== null);
  assert.deepEqual(forcedCalls(tok.decode(ids)).map((c) => c.args), [{}]);
});

Deno.test("zod 4 schemas: every kind of field compiles, and every finished walk passes zod and ajv", () => {
  const S = z.object({
    int: z.number().int(),
    pos: z.number().int().positive(),
    bounded: z.number().min(0.5).max(10),
    open: z.number().gt(1).lt(2),
    step: z.number().multipleOf(5).max(100),
    email: z.string().email(),
    uuid: z.string().uuid(),
    when: z.string().datetime(),
    day: z.iso.date(),
    at: z.iso.time(),
    ip4: z.ipv4(),
    ip6: z.ipv6(),
    url: z.url(),
    code: z.string().regex(/^[A-Z]{2}-\d{3}$/),
    short: z.string().min(1).max(4),
    maybe: z.string().optional(),
    nullable: z.number().nullable(),
    choice: z.enum(["a", "b"]),
    three: z.literal(3),
    rec: z.record(z.string(), z.number().int().min(0).max(9)),
    grid: z.array(z.array(z.boolean()).max(2)).max(2),
    either: z.union([z.string().max(3), z.number()]),
    none: z.object({}),
    nested: z.object({ empty: z.object({}).optional() }),
  });
  // ajv here reads draft 7: the draft 2020-12 marker zod writes is dropped for it.
  const { $schema: _, ...schema } = z.toJSONSchema(S);
  const start = startState({ kind: "value", value: compileSchema(schema) }, tok, [EOS]);
  let finished = 0;
  for (let seed = 1; seed <= 6; seed++) {
    const ids = walk(start, rng(seed), [EOS], 6000);
    if (ids === null) continue;
    finished++;
    const value = JSON.parse(tok.decode(ids.slice(0, -1)));
    const parsed = S.safeParse(value);
    assert.ok(parsed.success, `${JSON.stringify(value)}: ${JSON.stringify(parsed.error?.issues)}`);
    assert.ok(ajv.validate(schema, value), ajv.errorsText());
  }
  assert.ok(finished >= 3, `only ${finished} walks finished`);
});

Deno.test("pydantic v2 schema (tests/fixtures/pydantic_order.py): compiles, accepts what pydantic writes, masks exact", () => {
  const schema = JSON.parse(Deno.readTextFileSync(new URL("../fixtures/pydantic_order.schema.json", import.meta.url)));
  const spec: GrammarSpec = { kind: "value", value: compileSchema(schema) };
  // Order(...).model_dump_json() of a full order.
  const dumped =
    '{"id":"123e4567-e89b-12d3-a456-426614174000","created":"2024-02-29T12:00:00Z","day":"2023-12-31","at":"23:59:59",' +
    '"email":"a@b","site":"https://example.com/x?y=1","color":"red","items":[{"name":"pen","price":1.5,"qty":2,' +
    '"tags":["a"]}],"meta":{"k":1},"note":null,"pet":{"kind":"cat","lives":9},"either":"x","code":"ABC",' +
    '"ip":"10.0.0.1","ip6":"::1","ratio":0.25,"lit":2,"empty":{"z":[1]}}';
  assert.ok(ajv.validate(schema, JSON.parse(dumped)), ajv.errorsText());
  for (const text of [dumped, JSON.stringify(JSON.parse(dumped), null, 2)]) {
    assert.ok(acceptsIds(startState(spec, tok, [EOS]), [...tok.encode(text), EOS]), text);
  }
  for (const bad of [dumped.replace('"lives":9', '"lives":10'), dumped.replace('"ratio":0.25', '"ratio":1')]) {
    assert.ok(!acceptsIds(startState(spec, tok, [EOS]), [...tok.encode(bad), EOS]), bad);
  }
  for (const seed of [1, 2]) masksMatchPerToken(symbols, spec, [EOS], seed, 60);
});
