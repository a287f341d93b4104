/**
 * Constrained decoding on the tiny tokenizer: the schema subset and its refusals, every
 * valid value accepted (completeness), every finished walk of allowed tokens valid per an
 * independent validator, ajv (soundness), the forced tool-call form, and the lazy pick
 * equal to the whole mask's.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { Ajv } from "ajv";
import { TINY } from "../helpers.ts";
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
const RUNS = Number(Deno.env.get("K3_FUZZ_RUNS") ?? 40);
const TEXT = Array.from({ length: V }, (_, id) => tok.decode([id]));
const CLOSER = TEXT.map((t) => /["\]},:]|^<\|/.test(t) && !/^\s+$/.test(t));
const SPACE = TEXT.map((t) => /^\s+$/.test(t));

type Schema = Record<string, unknown>;

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
  return fc.oneof(...leaves, obj, arr, any);
}

/** A random value `schema` allows (for the subset above). */
function sampleValue(schema: Schema, r: () => number): unknown {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
  if (schema.enum) return pick(schema.enum as unknown[]);
  if ("const" in schema) return schema.const;
  if (schema.anyOf) return sampleValue(pick(schema.anyOf as Schema[]), r);
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
      return Math.floor(r() * 2000) - 1000;
    case "number":
      return pick([0, -1.5, 3.25e10, 1e-7, 42]);
    case "boolean":
      return r() < 0.5;
    case "null":
      return null;
    case "object": {
      const out: Record<string, unknown> = {};
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
  refuses({ type: "string", pattern: "^a" }, /^pattern$/, /"pattern" is refused/);
  refuses(
    { properties: { a: { type: "string", format: "uri" } } },
    /^properties\.a\.format$/,
    /"format" is not supported/,
  );
  refuses({ type: "object", minProperties: 1 }, /^minProperties$/, /not supported/);
  refuses({ type: "integer", minimum: 0 }, /^minimum$/, /not supported/);
  refuses({ type: "object", additionalProperties: { type: "string" } }, /^additionalProperties$/, /true or false/);
  refuses({ type: "array", items: [{ type: "string" }] }, /^items$/, /tuples/);
  refuses({ type: "string", minLength: 3, maxLength: 2 }, /^minLength$/, /above/);
  refuses({ type: "object", required: ["x"], additionalProperties: false }, /^required$/, /not in properties/);
  refuses({ type: "string", enum: [1, 2] }, /^enum$/, /no listed value/);
  refuses({ $ref: "#/$defs/missing" }, /^\$ref$/, /names no schema/);
  refuses({ $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" }, /\$ref/, /refers to itself/);
  refuses({ anyOf: [{ type: "string" }], type: "string" }, /^type$/, /beside anyOf/);
  refuses(false, /^$/, /allows no value/);
  // Annotations pass; a recursive schema through an object compiles.
  compileSchema({ title: "t", description: "d", $schema: "x", type: "object", properties: { n: { $ref: "#" } } });
  assert.throws(() => compileToolParameters({ type: "array" }), /must be an object/);
});

Deno.test("response_format: a keyword outside the subset is a 400 naming it; json_object and json_schema parse", () => {
  const msg = [{ role: "user", content: "hi" }];
  const rf = (schema: unknown) => ({
    messages: msg,
    response_format: { type: "json_schema", json_schema: { name: "x", schema } },
  });
  assert.throws(
    () => parseChatRequest(rf({ type: "object", properties: { a: { type: "string", pattern: "x" } } })),
    (e: { status: number; param: string; message: string }) =>
      e.status === 400 && e.param === "response_format.json_schema.schema.properties.a.pattern" &&
      /'response_format\.json_schema\.schema\.properties\.a\.pattern': the keyword "pattern" is refused/.test(
        e.message,
      ),
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

/** Parses the forced tools channel of a reply (markup from TOOL_MARKUP) into calls. */
function parseCalls(text: string): { name: string; index: number; args: unknown }[] {
  const start = text.indexOf(TOOL_MARKUP.openTools);
  assert.ok(start >= 0, `no tools channel in ${text}`);
  const body = text.slice(start + TOOL_MARKUP.openTools.length);
  assert.match(body, /<\|close\|>tools<\|sep\|><\|close\|>message<\|sep\|>(<\|end_of_msg\|>|\[EOS\])$/);
  const calls = [];
  const re =
    /<\|open\|>call tool="([^"]*)" index="(\d+)"<\|sep\|><\|open\|>json type="object"<\|sep\|>([\s\S]*?)<\|close\|>json<\|sep\|><\|close\|>call<\|sep\|>/g;
  for (const m of body.matchAll(re)) {
    const name = m[1].replace(
      /&quot;|&#39;|&lt;|&gt;|&amp;/g,
      (e) => ({ "&quot;": '"', "&#39;": "'", "&lt;": "<", "&gt;": ">", "&amp;": "&" })[e]!,
    );
    calls.push({ name, index: Number(m[2]), args: JSON.parse(m[3]) });
  }
  return calls;
}

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
        const spec = chatGrammar(r) as GrammarSpec;
        const start = startState(spec, tok, [END_MSG, EOS]);
        const ids = walk(start, rng(seed), [END_MSG, EOS], 1500);
        if (ids === null) return;
        finished++;
        const text = tok.decode(ids);
        const calls = parseCalls(text);
        assert.ok(calls.length >= 1 && (parallel || calls.length === 1), text);
        calls.forEach((c, i) => {
          assert.equal(c.index, i);
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
