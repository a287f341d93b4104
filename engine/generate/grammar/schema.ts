/**
 * JSON Schema to a grammar node: the subset constrained decoding enforces exactly.
 *
 * Enforced: `type` (a name or a list of names), `properties`, `required`,
 * `additionalProperties` (true or false), `enum`, `const`, `items` (one schema for every
 * item), `minItems`/`maxItems`, `anyOf`, `$ref` to `#`, `#/$defs/NAME` or
 * `#/definitions/NAME`, string `minLength`/`maxLength` (in code points, as JSON Schema
 * counts). Annotations are accepted and ignored (`title`, `description`, `default`,
 * `examples`, `$schema`, `$id`, `$comment`, `deprecated`, `readOnly`, `writeOnly`). Every
 * other keyword, `pattern` and `format` among them, is refused with a {@link SchemaError}
 * naming it: a grammar that quietly ignored a keyword would promise output it does not
 * deliver.
 *
 * As JSON Schema defines it, a keyword constrains only values of its own type: a schema
 * without `type` allows every type, each with the keywords that apply to it.
 *
 * @module
 */

import { accepts, DONE, End, type GNode, type ObjProp, push, type State, Value } from "./automaton.ts";

/** A schema outside the subset, or one no value satisfies. */
export class SchemaError extends Error {
  /** `path`: where in the schema, as dotted keys (e.g. `properties.name.pattern`). */
  constructor(message: string, readonly path: string) {
    super(message);
    this.name = "SchemaError";
  }
}

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
]);
const ENFORCED = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "enum",
  "const",
  "items",
  "minItems",
  "maxItems",
  "anyOf",
  "$ref",
  "$defs",
  "definitions",
  "minLength",
  "maxLength",
]);
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
      if (ANNOTATIONS.has(k)) continue;
      if (k === "pattern") {
        this.fail(this.at(path, k), 'the keyword "pattern" is refused: regular expressions are not enforced');
      }
      if (!ENFORCED.has(k)) {
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
    if (s.$ref !== undefined) {
      const others = Object.keys(s).filter((k) =>
        !ANNOTATIONS.has(k) && k !== "$ref" && k !== "$defs" && k !== "definitions"
      );
      if (others.length > 0) {
        this.fail(
          this.at(path, others[0]),
          "keywords beside $ref are not supported: move them into the referenced schema",
        );
      }
      return this.ref(s.$ref, this.at(path, "$ref"));
    }
    if (s.anyOf !== undefined) {
      const others = Object.keys(s).filter((k) =>
        !ANNOTATIONS.has(k) && k !== "anyOf" && k !== "$defs" && k !== "definitions"
      );
      if (others.length > 0) {
        this.fail(this.at(path, others[0]), "keywords beside anyOf are not supported: repeat them in each branch");
      }
      const list = s.anyOf;
      if (!Array.isArray(list) || list.length === 0) {
        this.fail(this.at(path, "anyOf"), "anyOf must be a non-empty array of schemas");
      }
      return { k: "alt", of: list.map((b, i) => this.compile(b, this.at(path, `anyOf[${i}]`))) };
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
        return { k: "str", min, max };
      }
      case "number":
      case "integer":
        return { k: "num", integer: t === "integer" };
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
    if (typeof ap !== "boolean") {
      this.fail(
        this.at(path, "additionalProperties"),
        "additionalProperties must be true or false (a schema there is not supported)",
      );
    }
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
    return { k: "obj", props, additional: ap ? ANY_JSON : null };
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
