/**
 * The structure holds: the real import graph of main.ts, cli/, engine/ and pack/ has no
 * cycle, and inside engine/ every import runs down the layers (errors and paths at the
 * bottom, then native, then text and model side by side, then weights, then generate,
 * then the composition root open.ts); engine/ imports nothing of cli/, pack/ or main.ts.
 * bench/ has no import cycle either and may import the product, never the reverse. The C
 * kernels have no call circle between their .c files. docs/architecture.md names every
 * product module (every .ts of main.ts, cli/, engine/, pack/ and every kernels/*.c, *.h) in
 * its module tables, and names none that is gone.
 *
 * The graphs are read from the files (every import, export-from and literal dynamic import
 * with a relative specifier; every call of a function another .c file defines), so they
 * cannot drift from the code. Each checker is also tested on small made-up inputs, so a
 * passing run means the rules held, not that the checker saw nothing.
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

/** The files under `rel` (a file or a folder, relative to `root`) whose names end in one of `exts`. */
function filesUnder(root: string, rel: string, exts: string[]): string[] {
  const path = `${root}/${rel}`;
  if (Deno.statSync(path).isFile) return exts.some((e) => rel.endsWith(e)) ? [rel] : [];
  return [...Deno.readDirSync(path)].flatMap((e) => filesUnder(root, `${rel}/${e.name}`, exts));
}

function tsFiles(root: string, rel: string): string[] {
  return filesUnder(root, rel, [".ts"]);
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

/** Every import from outside bench/ into bench/, as "a -> b: why" (bench/ may import the product, never the reverse). */
export function importsOfBench(graph: Graph): string[] {
  const out: string[] = [];
  for (const [from, tos] of graph) {
    if (from.startsWith("bench/")) continue;
    for (const to of tos) if (to.startsWith("bench/")) out.push(`${from} -> ${to}: product code imports bench/`);
  }
  return out.sort();
}

/** C source without its comments and string and character literals (so a name in them is no call). */
function cCode(src: string): string {
  return src.replace(
    /\/\*[\s\S]*?\*\/|\/\/[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'/g,
    (m) => m.replace(/[^\n]/g, " "),
  );
}

/** A function definition with external linkage at a line's start: a type, the name, the
 * parameters (maybe over several lines), then the body's brace. `static` ones (also through
 * simd.h's `K3_INLINE`) cannot be called from another file, and a declaration ends in `;`,
 * so neither matches. */
const C_DEFINITION = /^(?!static\b|K3_INLINE\b)(?:[A-Za-z_]\w*[ \t*]+)+([A-Za-z_]\w*)\s*\([^()]*\)\s*\{/gm;

/** The names of the functions a C source defines with external linkage. */
export function cDefinitions(src: string): string[] {
  return [...cCode(src).matchAll(C_DEFINITION)].map((m) => m[1]);
}

/** file -> the other .c files whose functions it calls, for C sources given by file name. */
export function cCallGraph(sources: Map<string, string>): Graph {
  const definedIn = new Map<string, string[]>();
  for (const [file, src] of sources) {
    for (const name of cDefinitions(src)) definedIn.set(name, [...(definedIn.get(name) ?? []), file]);
  }
  const graph: Graph = new Map();
  for (const [file, src] of sources) {
    // A name the file defines itself is its own (a program's `main`, or its definition's line).
    const own = new Set(cDefinitions(src));
    const to = new Set<string>();
    for (const m of cCode(src).matchAll(/\b([A-Za-z_]\w*)\s*\(/g)) {
      if (own.has(m[1])) continue;
      for (const other of definedIn.get(m[1]) ?? []) to.add(other);
    }
    graph.set(file, [...to].sort());
  }
  return graph;
}

/** The product's modules on disk: every .ts of main.ts, cli/, engine/, pack/ and every kernels/*.c, *.h. */
export function productModules(root: string): string[] {
  const ts = ["main.ts", "cli", "engine", "pack"].flatMap((r) => tsFiles(root, r));
  const kernels = [...Deno.readDirSync(`${root}/kernels`)]
    .filter((e) => e.isFile && /\.[ch]$/.test(e.name))
    .map((e) => `kernels/${e.name}`);
  return [...ts, ...kernels].sort();
}

/** The modules the "## Modules" section of a markdown page names: the first cell of each
 * table row, a path in backticks (`| \`engine/open.ts\` | role |`). */
export function documentedModules(markdown: string): string[] {
  const section = markdown.split(/^## /m).find((s) => s.startsWith("Modules\n")) ?? "";
  return [...section.matchAll(/^\| `([^`]+)` +\|/gm)].map((m) => m[1]);
}

/** What the module tables and the disk disagree on, one line each: files the doc does not
 * name, names the doc has that are no file, names given twice. */
export function moduleDocProblems(onDisk: string[], documented: string[]): string[] {
  const disk = new Set(onDisk), doc = new Set(documented);
  return [
    ...onDisk.filter((f) => !doc.has(f)).map((f) => `${f}: not in docs/architecture.md's module tables (add a line)`),
    ...[...doc].filter((f) => !disk.has(f)).map((f) =>
      `${f}: in docs/architecture.md's module tables but no such file`
    ),
    ...documented.filter((f, i) => documented.indexOf(f) !== i).map((f) => `${f}: named twice in the module tables`),
  ];
}

Deno.test("the bench checker names a cycle in bench/ and a product file importing bench/", () => {
  const g: Graph = new Map([
    ["bench/limits.ts", ["bench/speculation.ts", "engine/open.ts"]],
    ["bench/speculation.ts", ["bench/limits.ts"]],
    ["bench/args.ts", []],
    ["engine/open.ts", ["bench/args.ts"]],
    ["cli/run.ts", ["engine/open.ts"]],
  ]);
  assert.deepEqual(cycles(g), ["bench/limits.ts -> bench/speculation.ts -> bench/limits.ts"]);
  assert.deepEqual(importsOfBench(g), ["engine/open.ts -> bench/args.ts: product code imports bench/"]);
});

Deno.test("the C checker reads definitions and calls across files, and names a call circle", () => {
  const sources = new Map([
    [
      "ops.c",
      [
        "/* k3_alloc( in a comment is no call */",
        "static float helper(float x) { return x; }",
        "void k3_mla_expand(const void *w,",
        "                   int32_t n) {",
        '  k3_matmul(w, n); puts("k3_free(");',
        "}",
      ].join("\n"),
    ],
    ["products.c", "void *k3_matmul(const void *w, int32_t n) {\n  return k3_alloc(n);\n}\nvoid k3_free(void *p);\n"],
    ["memory.c", "void *k3_alloc(uint64_t bytes) {\n  return helper(bytes);\n}\n"],
  ]);
  assert.deepEqual(cDefinitions(sources.get("ops.c")!), ["k3_mla_expand"]);
  const oneWay = cCallGraph(sources);
  assert.deepEqual(Object.fromEntries(oneWay), { "ops.c": ["products.c"], "products.c": ["memory.c"], "memory.c": [] });
  assert.deepEqual(cycles(oneWay), []);
  // The allocator back in ops.c: products.c calls ops.c, which calls products.c.
  sources.set("ops.c", sources.get("ops.c")! + "\nvoid *k3_alloc(uint64_t bytes) {\n  return 0;\n}\n");
  sources.delete("memory.c");
  assert.deepEqual(cycles(cCallGraph(sources)), ["ops.c -> products.c -> ops.c"]);
});

Deno.test("the module-table checker names an undocumented file, a gone one and a doubled line", () => {
  const doc = [
    "# Architecture",
    "## Modules",
    "| module | role |",
    "| --- | --- |",
    "| `engine/open.ts` | the composition root |",
    "| `engine/gone.ts` | removed since |",
    "| `engine/open.ts` | again |",
    "## Where to find",
    "| `cli/run.ts` | a table of another section is not a module table |",
  ].join("\n");
  assert.deepEqual(documentedModules(doc), ["engine/open.ts", "engine/gone.ts", "engine/open.ts"]);
  assert.deepEqual(moduleDocProblems(["cli/run.ts", "engine/open.ts"], documentedModules(doc)), [
    "cli/run.ts: not in docs/architecture.md's module tables (add a line)",
    "engine/gone.ts: in docs/architecture.md's module tables but no such file",
    "engine/open.ts: named twice in the module tables",
  ]);
});

Deno.test("bench/ has no import cycle and the product imports nothing of it", () => {
  const graph = importGraph(ROOT, ["main.ts", "cli", "engine", "pack", "bench"]);
  assert.ok([...graph.keys()].filter((f) => f.startsWith("bench/")).length >= 10, "bench/ was read");
  const found = [...cycles(graph), ...importsOfBench(graph)];
  assert.deepEqual(found, [], `bench/:\n${found.join("\n")}`);
});

Deno.test("no call circle between the kernels' .c files", () => {
  const files = [...Deno.readDirSync(`${ROOT}/kernels`)].filter((e) => e.isFile && e.name.endsWith(".c"));
  const graph = cCallGraph(new Map(files.map((e) => [e.name, Deno.readTextFileSync(`${ROOT}/kernels/${e.name}`)])));
  // The checker saw the real calls: the ops call the products (k3_mla_expand), the products the allocator.
  assert.ok(graph.get("ops.c")?.includes("products.c"), JSON.stringify(Object.fromEntries(graph)));
  assert.ok(graph.get("products.c")?.includes("memory.c"), JSON.stringify(Object.fromEntries(graph)));
  const found = cycles(graph);
  assert.deepEqual(found, [], `call circles between kernels/*.c:\n${found.join("\n")}`);
});

Deno.test("docs/architecture.md names every product module in its module tables, and only those", () => {
  const onDisk = productModules(ROOT);
  assert.ok(onDisk.length >= 100 && onDisk.includes("main.ts") && onDisk.includes("kernels/k3.h"), onDisk.join(" "));
  const documented = documentedModules(Deno.readTextFileSync(`${ROOT}/docs/architecture.md`));
  const found = moduleDocProblems(onDisk, documented);
  assert.deepEqual(found, [], found.join("\n"));
});
