/**
 * The test tiers mean what they say: `deno task test:unit` runs the in-process tiers
 * (tests/unit/, tests/fuzz/), `deno task test:e2e` the tiers that start processes or run a
 * whole stack (tests/e2e/, tests/oracle/); together they are every test `npm test` runs, each once; and
 * no file of an in-process tier starts a process.
 */

import assert from "node:assert/strict";
import { ROOT } from "../helpers.ts";

/** The directories a test task runs (its `tests/<tier>/` arguments). */
async function tiersOf(task: string): Promise<string[]> {
  const tasks = JSON.parse(await Deno.readTextFile(`${ROOT}/deno.json`)).tasks;
  const command: string = tasks[task].command;
  return [...command.matchAll(/ (tests\/\w+)\/(?= |$)/g)].map((m) => m[1]);
}

/** Every `*_test.ts` under `dir` (relative to the checkout), skipping node_modules and dot directories. */
async function testFiles(dir: string): Promise<string[]> {
  const found: string[] = [];
  for await (const e of Deno.readDir(`${ROOT}/${dir}`)) {
    const path = dir === "." ? e.name : `${dir}/${e.name}`;
    if (e.isDirectory && e.name !== "node_modules" && !e.name.startsWith(".")) found.push(...await testFiles(path));
    else if (e.isFile && e.name.endsWith("_test.ts")) found.push(path);
  }
  return found;
}

/** What starts a process from a test: Deno's API, and the helpers around it (tests/helpers.ts). */
const PROCESS_STARTS: [RegExp, string][] = [
  [/\bDeno\.(Command|run)\b/, "Deno.Command"],
  [/\bDeno\.execPath\(/, "a child Deno"],
  [/\brunCmd\(/, "runCmd"],
  [/\bpython\(/, "the python helper"],
  [/\bk3\(/, "the k3 helper (the CLI as a subprocess)"],
  [/\bserveTiny\(/, "serveTiny (k3 serve as a subprocess)"],
  [/\bK3Process\b/, "K3Process"],
];

Deno.test("tiers: test:unit and test:e2e together run every test file, each once", async () => {
  const unit = await tiersOf("test:unit"), e2e = await tiersOf("test:e2e");
  assert.deepEqual(unit, ["tests/unit", "tests/fuzz"]);
  assert.deepEqual(e2e, ["tests/e2e", "tests/oracle"]);
  const all = await testFiles(".");
  assert.ok(all.length > 50, `${all.length} test files`);
  for (const file of all) {
    const tiers = [...unit, ...e2e].filter((t) => file.startsWith(`${t}/`));
    assert.equal(tiers.length, 1, `${file} is in exactly one tier`);
  }
});

Deno.test("tiers: no file of tests/unit/ or tests/fuzz/ starts a process", async () => {
  const self = new URL(import.meta.url).pathname;
  for (const tier of await tiersOf("test:unit")) {
    for (const file of await testFiles(tier)) {
      if (`${ROOT}/${file}` === self) continue; // it names the patterns it looks for
      const text = await Deno.readTextFile(`${ROOT}/${file}`);
      for (const [pattern, what] of PROCESS_STARTS) {
        assert.doesNotMatch(
          text,
          pattern,
          `${file} starts a process (${what}): it belongs in tests/e2e/ or tests/oracle/`,
        );
      }
    }
  }
  // The fuzz tier's shared module is in-process too.
  const shared = await Deno.readTextFile(`${ROOT}/tests/fuzz/fuzz.ts`);
  for (const [pattern, what] of PROCESS_STARTS) assert.doesNotMatch(shared, pattern, `tests/fuzz/fuzz.ts: ${what}`);
});
