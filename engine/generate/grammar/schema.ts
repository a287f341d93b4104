/**
 * JSON Schema to a grammar node: the subset constrained decoding enforces exactly.
 *
 * Enforced: `type` (a name or a list of names), `properties`, `required`,
 * `additionalProperties` (true, false or a schema), `propertyNames` (only as
 * `{"type": "string"}`, what zod writes for records), `enum`, `const`, `items` (one schema
 * for every item), `minItems`/`maxItems`, `anyOf`, `oneOf` (with a discriminator that
 * makes its branches disjoint), `allOf` of one schema, `$ref` to `#`, `#/$defs/NAME` or
 * `#/definitions/NAME`, string `minLength`/`maxLength` (in code points, as JSON Schema
 * counts), `pattern` and `format` (patterns.ts), and `minimum`, `maximum`,
 * `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf` (numbers.ts). The other JSON Schema
 * keywords ({@link REFUSED}) are refused with a {@link SchemaError} naming the path: a
 * grammar that quietly ignored a keyword would promise output it does not deliver. Keys
 * that are no keyword of the subset or of that list (annotations such as `title`, and
 * keys of other vocabularies such as `"strict"`, `discriminator` or `x-...`) are ignored.
 *
 * As JSON Schema defines it, a keyword constrains only values of its own type: a schema
 * without `type` allows every type, each with the keywords that apply to it.
 *
 * @module
 */

import { accepts, DONE, End, type GNode, MAX_DIGITS, type ObjProp, push, type State, Value } from "./automaton.ts";
import { FRACTION_DIGITS, nextFloat, numberRange, rangedNumber, toUnits } from "./numbers.ts";
import { compilePattern, FORMATS, PatternError, patternString } from "./patterns.ts";

/** A schema outside the subset, or one no value satisfies. */
export class SchemaError extends Error {
  /** `path`: where in the schema, as dotted keys (e.g. `properties.name.pattern`). */
  constructor(message: string, readonly path: string) {
    super(message);
    this.name = "SchemaError";
  }
}

const ENFORCED = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "propertyNames",
  "enum",
  "const",
  "items",
  "minItems",
  "maxItems",
  "anyOf",
  "oneOf",
  "allOf",
  "$ref",
  "$defs",
  "definitions",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "multipleOf",
]);
/** JSON Schema keywords outside the subset: refused, since ignoring one would promise output not delivered. */
export const REFUSED: ReadonlySet<string> = new Set([
  "not",
  "if",
  "then",
  "else",
  "dependentRequired",
  "dependentSchemas",
  "dependencies",
  "minProperties",
  "maxProperties",
  "patternProperties",
  "unevaluatedProperties",
  "unevaluatedItems",
  "uniqueItems",
  "contains",
  "minContains",
  "maxContains",
  "prefixItems",
  "additionalItems",
  "contentSchema",
  "$anchor",
  "$dynamicRef",
  "$dynamicAnchor",
  "$recursiveRef",
  "$recursiveAnchor",
  "$vocabulary",
]);
/** Keys read beside `$ref`, `anyOf`, `oneOf` and `allOf` without being keywords of their own. */
const BESIDE_ANY = new Set(["$defs", "definitions"]);
const TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"] as const;
type TypeName = typeof TYPES[number];

const utf8 = new TextEncoder();

/** The symbols (UTF-8 bytes) of a JSON text. */
export function jsonSyms(text: string): number[] {
  return [...utf8.encode(text)];
}

/** A key's canonical spelling between its quotes, one char per UTF-8 byte. */
function keySpelling(name: string): string {
  return String.fromCharCode(...utf8.encode(JSON.stringify(name).slice(1, -1)));
}

const TRUE: GNode = { k: "lit", syms: jsonSyms("true") };
const FALSE: GNode = { k: "lit", syms: jsonSyms("false") };
const NULL: GNode = { k: "lit", syms: jsonSyms("null") };

/** Any JSON value (nesting bounded by the automaton's depth limit). */
export const ANY_JSON: GNode = (() => {
  const any: { k: "alt"; of: GNode[] } = { k: "alt", of: [] };
  any.of.push(
    { k: "obj", props: [], additional: any },
    { k: "arr", items: any, min: 0, max: Infinity },
    { k: "str", min: 0, max: Infinity },
    { k: "num", integer: false },
    TRUE,
    FALSE,
    NULL,
  );
  return any;
})();

/** Any JSON object. */
export const ANY_OBJECT: GNode = (ANY_JSON as { of: GNode[] }).of[0];

type Json = Record<string, unknown>;

function kind(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}

/** Compiles one schema document (its `$defs` resolved against its root). */
class Compiler {
  readonly refs = new Map<string, Extract<GNode, { k: "ref" }>>();
  readonly pendingRefs: { name: string; path: string }[] = [];

  constructor(readonly root: unknown) {}

  fail(path: string, message: string): never {
    throw new SchemaError(`${path === "" ? "the schema" : `'${path}'`}: ${message}`, path);
  }

  at(path: string, key: string): string {
    return path === "" ? key : `${path}.${key}`;
  }

  compile(schema: unknown, path: string): GNode {
    if (schema === true) return ANY_JSON;
    if (schema === false) this.fail(path, "the schema false allows no value");
    if (kind(schema) !== "object") this.fail(path, `a schema must be an object or a boolean, got ${kind(schema)}`);
    const s = schema as Json;
    for (const k of Object.keys(s)) {
      if (REFUSED.has(k)) {
        this.fail(
          this.at(path, k),
          `the keyword ${JSON.stringify(k)} is not supported (structured output enforces ${[...ENFORCED].join(", ")})`,
        );
      }
    }
    for (const defs of ["$defs", "definitions"]) {
      if (s[defs] !== undefined) {
        if (path !== "") this.fail(this.at(path, defs), `${defs} is read only at the root of the schema`);
        if (kind(s[defs]) !== "object") this.fail(defs, `${defs} must be an object`);
      }
    }
    // Keys that are no JSON Schema keyword ("strict", "discriminator", "x-...") are ignored.
    const keywords = Object.keys(s).filter((k) => ENFORCED.has(k) && !BESIDE_ANY.has(k));
    for (const composite of ["$ref", "anyOf", "oneOf", "allOf"]) {
      if (s[composite] === undefined) continue;
      const other = keywords.find((k) => k !== composite);
      if (other !== undefined) {
        this.fail(
          this.at(path, other),
          `keywords beside ${composite} are not supported: ${
            composite === "$ref" ? "move them into the referenced schema" : "repeat them in each branch"
          }`,
        );
      }
      if (composite === "$ref") return this.ref(s.$ref, this.at(path, "$ref"));
      const list = s[composite];
      if (!Array.isArray(list) || list.length === 0) {
        this.fail(this.at(path, composite), `${composite} must be a non-empty array of schemas`);
      }
      if (composite === "allOf") {
        if (list.length !== 1) this.fail(this.at(path, composite), "allOf is supported with one schema only");
        return this.compile(list[0], this.at(path, "allOf[0]"));
      }
      if (composite === "oneOf") this.disjoint(list, s.discriminator, this.at(path, "oneOf"));
      return { k: "alt", of: list.map((b, i) => this.compile(b, this.at(path, `${composite}[${i}]`))) };
    }
    const types = this.types(s, path);
    const branches: GNode[] = [];
    for (const t of types) branches.push(this.typed(t, s, path));
    const node: GNode = branches.length === 1 ? branches[0] : { k: "alt", of: branches };
    if (s.enum !== undefined || s.const !== undefined) return this.literals(s, node, path);
    return node;
  }

  types(s: Json, path: string): TypeName[] {
    const t = s.type;
    if (t === undefined) return [...TYPES].filter((x) => x !== "integer");
    const list = Array.isArray(t) ? t : [t];
    if (list.length === 0) this.fail(this.at(path, "type"), "type must not be an empty list");
    for (const x of list) {
      if (!(TYPES as readonly unknown[]).includes(x)) {
        this.fail(this.at(path, "type"), `type must be one of ${TYPES.join(", ")}, got ${JSON.stringify(x)}`);
      }
    }
    const set = new Set(list as TypeName[]);
    if (set.has("number")) set.delete("integer"); // every integer is a number
    return [...set];
  }

  count(s: Json, key: string, path: string): number | undefined {
    const v = s[key];
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      this.fail(this.at(path, key), `${key} must be a non-negative integer, got ${JSON.stringify(v)}`);
    }
    return v;
  }

  typed(t: TypeName, s: Json, path: string): GNode {
    switch (t) {
      case "object":
        return this.object(s, path);
      case "array": {
        const min = this.count(s, "minItems", path) ?? 0, max = this.count(s, "maxItems", path) ?? Infinity;
        if (min > max) this.fail(this.at(path, "minItems"), `minItems ${min} is above maxItems ${max}`);
        const items = s.items;
        if (Array.isArray(items)) {
          this.fail(this.at(path, "items"), "items as a list (tuples) is not supported: give one schema");
        }
        const node = items === undefined ? ANY_JSON : this.compile(items, this.at(path, "items"));
        return { k: "arr", items: node, min, max };
      }
      case "string": {
        const min = this.count(s, "minLength", path) ?? 0, max = this.count(s, "maxLength", path) ?? Infinity;
        if (min > max) this.fail(this.at(path, "minLength"), `minLength ${min} is above maxLength ${max}`);
        if (s.pattern === undefined && s.format === undefined) return { k: "str", min, max };
        return this.patterned(s, min, max, path);
      }
      case "number":
      case "integer":
        return this.number(t === "integer", s, path);
      case "boolean":
        return { k: "alt", of: [TRUE, FALSE] };
      case "null":
        return NULL;
    }
  }

  object(s: Json, path: string): GNode {
    const propsRaw = s.properties ?? {};
    if (kind(propsRaw) !== "object") this.fail(this.at(path, "properties"), "properties must be an object");
    const req = s.required ?? [];
    if (!Array.isArray(req) || req.some((r) => typeof r !== "string")) {
      this.fail(this.at(path, "required"), "required must be an array of strings");
    }
    const required = new Set(req as string[]);
    const ap = s.additionalProperties ?? true;
    const additional = ap === true
      ? ANY_JSON
      : ap === false
      ? null
      : this.compile(ap, this.at(path, "additionalProperties"));
    this.propertyNames(s.propertyNames, this.at(path, "propertyNames"));
    const props: ObjProp[] = Object.entries(propsRaw as Json).map(([name, sub]) => ({
      name,
      key: keySpelling(name),
      value: this.compile(sub, this.at(path, `properties.${name}`)),
      required: required.has(name),
    }));
    for (const name of required) {
      if (props.some((p) => p.name === name)) continue;
      if (!ap) {
        this.fail(
          this.at(path, "required"),
          `${JSON.stringify(name)} is required but not in properties, and additionalProperties is false`,
        );
      }
      props.push({ name, key: keySpelling(name), value: ANY_JSON, required: true });
    }
    return { k: "obj", props, additional };
  }

  /** propertyNames: only what every key already is (a string), as zod writes for records. */
  propertyNames(names: unknown, path: string): void {
    if (names === undefined || names === true) return;
    const ok = kind(names) === "object" &&
      Object.keys(names as Json).every((k) => !ENFORCED.has(k) && !REFUSED.has(k) || k === "type") &&
      ((names as Json).type === undefined || (names as Json).type === "string");
    if (!ok) this.fail(path, 'propertyNames is supported only as {"type": "string"}');
  }

  /** integer/number with bounds and a step (numbers.ts); without any, every JSON number of its type. */
  number(integer: boolean, s: Json, path: string): GNode {
    const keys = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
    for (const k of keys) {
      const v = s[k];
      if (
        v !== undefined && (typeof v !== "number" || !Number.isFinite(v)) &&
        !(typeof v === "boolean" && k.startsWith("exclusive"))
      ) {
        this.fail(this.at(path, k), `${k} must be a number, got ${JSON.stringify(v)}`);
      }
    }
    if (keys.every((k) => typeof s[k] !== "number")) return { k: "num", integer };
    let step = 1n;
    if (s.multipleOf !== undefined) {
      const m = s.multipleOf as number;
      if (!Number.isInteger(m) || m <= 0) {
        this.fail(
          this.at(path, "multipleOf"),
          `multipleOf must be a positive integer (a fraction such as ${m} cannot be matched by the float test JSON Schema validators run)`,
        );
      }
      step = BigInt(m);
      integer = true; // a multiple of an integer is an integer: written without a fraction
    }
    const scale = integer ? 0 : FRACTION_DIGITS;
    // Draft 4 wrote exclusiveMinimum/Maximum as booleans beside minimum/maximum.
    const bound = (inclusive: string, exclusive: string, lower: boolean): bigint | null => {
      let best: bigint | null = null;
      const consider = (x: number, strict: boolean) => {
        const edge = strict ? nextFloat(x, lower) : x;
        const units = integer ? BigInt(lower ? Math.ceil(edge) : Math.floor(edge)) : toUnits(edge, scale, lower);
        if (best === null || (lower ? units > best : units < best)) best = units;
      };
      const inc = s[inclusive], exc = s[exclusive];
      if (typeof inc === "number") consider(inc, exc === true);
      if (typeof exc === "number") consider(exc, true);
      return best;
    };
    let lo = bound("minimum", "exclusiveMinimum", true), hi = bound("maximum", "exclusiveMaximum", false);
    if (step > 1n) {
      // Validators read a JSON number as a float64: past 2^53 a multiple of the step can
      // round to a value that is not one, so a stepped integer stays within the safe range.
      const safe = BigInt(Number.MAX_SAFE_INTEGER);
      lo = lo === null || lo < -safe ? -safe : lo;
      hi = hi === null || hi > safe ? safe : hi;
    }
    const range = numberRange(lo, hi, scale, step);
    if (range === null) {
      this.fail(path, `no ${integer ? "integer" : "number"} of at most ${MAX_DIGITS} digits satisfies the bounds`);
    }
    return rangedNumber(range);
  }

  /** A string with a pattern and/or a format (patterns.ts). */
  patterned(s: Json, min: number, max: number, path: string): GNode {
    const format = s.format;
    if (format !== undefined && (typeof format !== "string" || !Object.hasOwn(FORMATS, format))) {
      this.fail(
        this.at(path, "format"),
        `the format ${JSON.stringify(format)} is not supported (enforced: ${Object.keys(FORMATS).join(", ")})`,
      );
    }
    if (s.pattern !== undefined && typeof s.pattern !== "string") {
      this.fail(this.at(path, "pattern"), "pattern must be a string");
    }
    try {
      return patternString(compilePattern(s.pattern as string | undefined, format as string | undefined, min, max));
    } catch (e) {
      if (!(e instanceof PatternError)) throw e;
      this.fail(this.at(path, s.pattern !== undefined ? "pattern" : "format"), e.message);
    }
  }

  /**
   * oneOf as anyOf: only when no value can match two branches, which a discriminator
   * proves (each branch an object requiring the named property, with one constant value
   * of its own).
   */
  disjoint(branches: unknown[], discriminator: unknown, path: string): void {
    const name = kind(discriminator) === "object" ? (discriminator as Json).propertyName : undefined;
    const seen = new Set<string>();
    for (const branch of branches) {
      let b = branch as Json;
      if (kind(b) === "object" && typeof b.$ref === "string") {
        const m = /^#\/(\$defs|definitions)\/([^/]+)$/.exec(b.$ref);
        b = m ? ((this.root as Json)[m[1]] as Json | undefined)?.[m[2]] as Json : b;
      }
      const prop = kind(b) === "object" && typeof name === "string"
        ? ((b.properties as Json | undefined)?.[name] as Json | undefined)
        : undefined;
      const values = prop?.const !== undefined ? [prop.const] : Array.isArray(prop?.enum) ? prop.enum : [];
      const required = Array.isArray(b?.required) && (b.required as unknown[]).includes(name);
      if (!required || values.length !== 1 || seen.has(JSON.stringify(values[0]))) {
        this.fail(
          path,
          "oneOf is supported only with a discriminator: every branch an object requiring that property with a constant value of its own",
        );
      }
      seen.add(JSON.stringify(values[0]));
    }
  }

  /** enum/const: the listed values (canonical JSON) that the rest of the schema allows. */
  literals(s: Json, rest: GNode, path: string): GNode {
    let values: unknown[];
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        this.fail(this.at(path, "enum"), "enum must be a non-empty array");
      }
      values = s.enum;
    } else values = [s.const];
    if (s.const !== undefined) {
      const c = JSON.stringify(s.const);
      values = values.filter((v) => JSON.stringify(v) === c);
    }
    const start: State = [push(new Value(rest), push(new End([-1], 0, false), null))];
    const kept = values.map((v) => jsonSyms(JSON.stringify(v))).filter((syms) => {
      const after = accepts(start, [...syms, -1]);
      return after.some((st) => st === DONE);
    });
    if (kept.length === 0) {
      this.fail(
        this.at(path, s.enum !== undefined ? "enum" : "const"),
        "no listed value satisfies the rest of the schema",
      );
    }
    return kept.length === 1 ? { k: "lit", syms: kept[0] } : { k: "alt", of: kept.map((syms) => ({ k: "lit", syms })) };
  }

  ref(ref: unknown, path: string): GNode {
    if (typeof ref !== "string") this.fail(path, "$ref must be a string");
    let name: string;
    if (ref === "#") name = "#";
    else {
      const m = /^#\/(\$defs|definitions)\/([^/]+)$/.exec(ref);
      if (!m) {
        this.fail(
          path,
          `$ref must point into this schema's $defs ("#/$defs/NAME") or be "#", got ${JSON.stringify(ref)}`,
        );
      }
      name = ref;
    }
    let node = this.refs.get(name);
    if (!node) {
      node = { k: "ref", target: null, name };
      this.refs.set(name, node);
      this.pendingRefs.push({ name, path });
    }
    return node;
  }

  /** Resolves every reference (compiling its target once), then refuses cycles that read nothing. */
  resolve(rootNode: GNode): void {
    while (this.pendingRefs.length > 0) {
      const { name, path } = this.pendingRefs.shift()!;
      const node = this.refs.get(name)!;
      if (name === "#") {
        node.target = rootNode;
        continue;
      }
      const [, defs, key] = /^#\/(\$defs|definitions)\/(.+)$/.exec(name)!;
      const table = (this.root as Json)[defs] as Json | undefined;
      if (!table || !Object.hasOwn(table, key)) {
        this.fail(path, `$ref ${JSON.stringify(name)} names no schema in ${defs}`);
      }
      node.target = this.compile(table[key], `${defs}.${key}`);
    }
    for (const node of this.refs.values()) {
      if (leftCycle(node, new Set())) {
        this.fail("$ref", `$ref ${JSON.stringify(node.name)} refers to itself before any value is read`);
      }
    }
  }
}

/** True when `node` reaches itself through alternatives and references alone. */
function leftCycle(node: GNode, path: Set<GNode>): boolean {
  if (node.k !== "alt" && node.k !== "ref") return false;
  if (path.has(node)) return true;
  path.add(node);
  const next = node.k === "alt" ? node.of : node.target ? [node.target] : [];
  const found = next.some((n) => leftCycle(n, path));
  path.delete(node);
  return found;
}

/** Compiles a JSON Schema of the subset; throws {@link SchemaError} naming the first keyword outside it. */
export function compileSchema(schema: unknown): GNode {
  const c = new Compiler(schema);
  const node = c.compile(schema, "");
  c.resolve(node);
  return node;
}

/** Compiles the parameters schema of a tool: an object (the tools channel says `type="object"`). */
export function compileToolParameters(schema: unknown): GNode {
  if (schema === undefined) return ANY_OBJECT;
  if (kind(schema) !== "object") throw new SchemaError("the schema: parameters must be a JSON Schema object", "");
  const s = schema as Json;
  if (s.type !== undefined && s.type !== "object") {
    throw new SchemaError(`'type': the parameters of a tool must be an object, got ${JSON.stringify(s.type)}`, "type");
  }
  if (s.anyOf !== undefined || s.$ref !== undefined || s.enum !== undefined || s.const !== undefined) {
    const k = ["anyOf", "$ref", "enum", "const"].find((x) => s[x] !== undefined)!;
    throw new SchemaError(`'${k}': a tool's parameters must be a plain object schema`, k);
  }
  return compileSchema({ ...s, type: "object" });
}
