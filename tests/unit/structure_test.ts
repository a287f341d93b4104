/**
 * The structure holds: the real import graph of main.ts, cli/, engine/ and pack/ has no
 * cycle, and inside engine/ every import runs down the layers (errors and paths at the
 * bottom, then native, then text and model side by side, then weights, then generate,
 * then the composition root open.ts); engine/ imports nothing of cli/, pack/ or main.ts.
 *
 * The graph is read from the files (every import, export-from and literal dynamic import
 * with a relative specifier), so it cannot drift from the code. The checker itself is
 * tested on a small made-up graph, so a passing run means the rules held, not that the
 * checker saw nothing.
 */

import assert from "node:assert/strict";
import { ROOT } from "../helpers.ts";

/** file -> the files it imports (paths relative to the repository). */
type Graph = Map<string, string[]>;

/** Statement imports and re-exports (`import ... from "x"`, `import "x"`, `export ... from "x"`) at a line's start. */
const STATIC = /^\s*(?:import|export)\s+(?:type\s+)?(?:(?:[\w$*{},\s]|\bas\b)*?\s*from\s*)?["']([^"']+)["']/gm;
/** Dynamic imports of a literal specifier. */
const DYNAMIC = /\bimport\(\s*["']([^"']+)["']\s*\)/g;

/** The relative specifiers a TypeScript source imports. */
export function specifiers(src: string): string[] {
  const out: string[] = [];
  for (const re of [STATIC, DYNAMIC]) for (const m of src.matchAll(re)) out.push(m[1]);
  return out.filter((s) => s.startsWith("./") || s.startsWith("../"));
}

/** `spec` resolved against the file `from` (both relative to the repository). */
export function resolve(from: string, spec: string): string {
  const parts = from.split("/").slice(0, -1);
  for (const p of spec.split("/")) {
    if (p === "..") parts.pop();
    else if (p !== "." && p !== "") parts.push(p);
  }
  return parts.join("/");
}

function tsFiles(root: string, rel: string): string[] {
  const path = `${root}/${rel}`;
  if (Deno.statSync(path).isFile) return rel.endsWith(".ts") ? [rel] : [];
  return [...Deno.readDirSync(path)].flatMap((e) => tsFiles(root, `${rel}/${e.name}`));
}

/** The import graph of the `.ts` files under `roots`, edges to files outside them dropped. */
export function importGraph(root: string, roots: string[]): Graph {
  const files = roots.flatMap((r) => tsFiles(root, r)).sort();
  const known = new Set(files);
  const graph: Graph = new Map();
  for (const f of files) {
    const to = specifiers(Deno.readTextFileSync(`${root}/${f}`)).map((s) => resolve(f, s)).filter((t) => known.has(t));
    graph.set(f, [...new Set(to)]);
  }
  return graph;
}

/** engine/'s layers, bottom first: a file's layer and its group (folders of one rank are apart). */
const LAYERS: { group: string; rank: number; holds: (f: string) => boolean }[] = [
  {
    group: "base",
    rank: 0,
    holds: (f) => f === "engine/errors.ts" || f === "engine/paths.ts" || f === "engine/json_fields.ts",
  },
  { group: "native", rank: 1, holds: (f) => f.startsWith("engine/native/") },
  { group: "text", rank: 2, holds: (f) => f.startsWith("engine/text/") },
  { group: "model", rank: 2, holds: (f) => f.startsWith("engine/model/") },
  { group: "weights", rank: 3, holds: (f) => f.startsWith("engine/weights/") },
  { group: "generate", rank: 4, holds: (f) => f.startsWith("engine/generate/") },
  { group: "open", rank: 5, holds: (f) => f === "engine/open.ts" },
];

/** Every cycle's edges as "a -> b -> ... -> a" (one line per strongly connected part). */
export function cycles(graph: Graph): string[] {
  // Tarjan's strongly connected components; a part of two files or more (or a file that
  // imports itself) is a cycle, named by one loop through it.
  let next = 0;
  const index = new Map<string, number>(), low = new Map<string, number>(), stack: string[] = [];
  const onStack = new Set<string>();
  const parts: string[][] = [];
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const part: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        part.push(w);
      } while (w !== v);
      if (part.length > 1 || (graph.get(v) ?? []).includes(v)) parts.push(part);
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return parts.map((part) => {
    const inPart = new Set(part);
    const start = part.sort()[0];
    // Walk inside the part until a file repeats: that loop names the cycle.
    const path = [start];
    let at = start;
    for (;;) {
      at = (graph.get(at) ?? []).filter((w) => inPart.has(w)).sort()[0];
      const seen = path.indexOf(at);
      if (seen >= 0) return [...path.slice(seen), at].join(" -> ");
      path.push(at);
    }
  });
}

/** Every import in engine/ that breaks the layering, as "a -> b: why". */
export function upwardEdges(graph: Graph): string[] {
  const out: string[] = [];
  for (const [from, tos] of graph) {
    if (!from.startsWith("engine/")) continue;
    const a = LAYERS.find((l) => l.holds(from));
    if (!a) {
      out.push(`${from}: in no layer of engine/ (place it, or add its layer here)`);
      continue;
    }
    for (const to of tos) {
      if (!to.startsWith("engine/")) {
        out.push(`${from} -> ${to}: engine/ imports nothing outside engine/`);
        continue;
      }
      const b = LAYERS.find((l) => l.holds(to));
      if (!b || a.group === b.group) continue;
      if (b.rank > a.rank) out.push(`${from} -> ${to}: ${a.group} imports ${b.group}, a higher layer`);
      else if (b.rank === a.rank) out.push(`${from} -> ${to}: ${a.group} imports ${b.group}, a layer beside it`);
    }
  }
  return out.sort();
}

Deno.test("the checker finds a cycle and an upward import in a made-up graph, naming the edges", () => {
  const g: Graph = new Map([
    ["engine/native/pool.ts", ["engine/model/model.ts"]],
    ["engine/model/model.ts", ["engine/native/pool.ts", "engine/errors.ts"]],
    ["engine/model/config.ts", ["engine/text/tokenizer.ts"]],
    ["engine/text/tokenizer.ts", []],
    ["engine/generate/generate.ts", ["cli/run.ts"]],
    ["engine/errors.ts", []],
    ["engine/stray.ts", []],
    ["cli/run.ts", ["cli/run.ts"]],
  ]);
  assert.deepEqual(cycles(g).sort(), [
    "cli/run.ts -> cli/run.ts",
    "engine/model/model.ts -> engine/native/pool.ts -> engine/model/model.ts",
  ]);
  assert.deepEqual(upwardEdges(g), [
    "engine/generate/generate.ts -> cli/run.ts: engine/ imports nothing outside engine/",
    "engine/model/config.ts -> engine/text/tokenizer.ts: model imports text, a layer beside it",
    "engine/native/pool.ts -> engine/model/model.ts: native imports model, a higher layer",
    "engine/stray.ts: in no layer of engine/ (place it, or add its layer here)",
  ]);
});

Deno.test("the checker reads every kind of import statement", () => {
  const src = [
    'import { a, type B } from "./a.ts";',
    'import type { C } from "../c.ts";',
    "import {",
    "  d,",
    "  e as f,",
    '} from "./d.ts";',
    'import * as g from "./g.ts";',
    'import "./side.ts";',
    'export { h } from "./h.ts";',
    'export * from "./all.ts";',
    'const m = await import("./lazy.ts");',
    'import assert from "node:assert/strict";',
    ' * import { doc } from "./comment.ts";',
    '  `import "./template.ts";` +',
  ].join("\n");
  assert.deepEqual(specifiers(src).sort(), [
    "../c.ts",
    "./a.ts",
    "./all.ts",
    "./d.ts",
    "./g.ts",
    "./h.ts",
    "./lazy.ts",
    "./side.ts",
  ]);
  assert.equal(resolve("engine/model/model.ts", "../native/pool.ts"), "engine/native/pool.ts");
  assert.equal(resolve("main.ts", "./cli/commands.ts"), "cli/commands.ts");
});

Deno.test("no import cycle in main.ts, cli/, engine/ and pack/", () => {
  const found = cycles(importGraph(ROOT, ["main.ts", "cli", "engine", "pack"]));
  assert.deepEqual(found, [], `import cycles:\n${found.join("\n")}`);
});

Deno.test("engine/ imports only down its layers: base < native < text, model < weights < generate < open.ts", () => {
  const found = upwardEdges(importGraph(ROOT, ["main.ts", "cli", "engine", "pack"]));
  assert.deepEqual(found, [], `imports against engine/'s layers:\n${found.join("\n")}`);
});
