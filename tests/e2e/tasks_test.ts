/**
 * The tasks and the one-file builds, run as a user runs them: deno.json tasks (described,
 * narrow permission sets, plain `deno`), package.json scripts that mirror them for npm,
 * user paths resolved against where the command was typed (INIT_CWD), and dist/k3.js
 * copied alone into an empty directory giving the same tokens as `k3 run`.
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS, PERMISSION_SETS, permissionFlags } from "../../cli/permissions.ts";
import { k3, ROOT, runCmd, tempDir, TINY } from "../helpers.ts";

const denoJson = JSON.parse(await Deno.readTextFile(`${ROOT}/deno.json`));
const packageJson = JSON.parse(await Deno.readTextFile(`${ROOT}/package.json`));
const readme = await Deno.readTextFile(`${ROOT}/README.md`);

Deno.test("tasks: each described, Deno through tools/deno, a permission set instead of --allow-all; npm scripts mirror them", () => {
  for (const [name, task] of Object.entries<{ description: string; command: string }>(denoJson.tasks)) {
    assert.ok(task.description?.length > 10, `${name} has a description`);
    assert.doesNotMatch(task.command, /node_modules\/\.bin|--allow-all|(^|\s)-A(\s|$)/, `${name}: ${task.command}`);
    // A bare `deno` in a task resolves to node_modules/.bin/deno after `npm ci`, which Deno's
    // task runner runs as JavaScript; tools/deno is named by path, so it never is.
    assert.doesNotMatch(task.command, /(^|&& |\s)deno /, `${name} runs Deno through tools/deno: ${task.command}`);
    for (const m of task.command.matchAll(/-P=(\w+)/g)) assert.ok(PERMISSION_SETS[m[1]], `${name}: set ${m[1]}`);
    // The npm script is the task, its last command exec'ed: npm signals only its own child
    // (sh), and exec makes that child Deno (deno task's shell forwards signals itself and has
    // no exec).
    const parts = task.command.split(" && ");
    if (/tools\/deno/.test(parts[parts.length - 1])) {
      parts[parts.length - 1] = parts[parts.length - 1].replace(/(sh \S*tools\/deno)/, "exec $1");
    }
    assert.equal(packageJson.scripts[name], parts.join(" && "), `npm script ${name} mirrors the task`);
    assert.match(readme, new RegExp(`^\\| \`${name}\` +\\|`, "m"), `README's task table has ${name}`);
  }
  assert.equal(packageJson.license, "Apache-2.0");
  // k3's own environment variables only, no subprocesses; the network only because
  // k3 serve listens (on the --host it is given).
  assert.ok(K3_PERMISSIONS.some((p) => /^--allow-env=K3_LIB,/.test(p)));
  assert.ok(!K3_PERMISSIONS.some((p) => /^--allow-(run|all)|^--allow-env$/.test(p)), K3_PERMISSIONS.join(" "));
});

Deno.test("npm run k3 from a subdirectory: relative paths are the user's (INIT_CWD)", async () => {
  const out = await runCmd("npm", ["run", "-s", "k3", "--", "run", "fixtures/tiny", "--ids", "1,2,3", "--gen", "2"], {
    cwd: `${ROOT}/tests`,
  });
  assert.equal(out.code, 0, out.stderr);
  const direct = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2"]);
  assert.equal(out.stdout.split("\n")[0], direct.stdout.split("\n")[0]);
});

Deno.test("deno task k3 without npm (no node_modules): plain deno, paths from INIT_CWD", async () => {
  // A checkout as a Deno user has it: the sources and a built kernel library, no npm.
  await using dir = await tempDir();
  const cp = await runCmd("cp", ["-rp", "deno.json", "main.ts", "cli", "engine", "kernels", "tools", dir.path]);
  assert.equal(cp.code, 0, cp.stderr);
  await Deno.mkdir(`${dir.path}/tests/fixtures`, { recursive: true });
  assert.equal((await runCmd("cp", ["-rp", TINY, `${dir.path}/tests/fixtures/`])).code, 0);
  const out = await runCmd(Deno.execPath(), [
    "task",
    "-q",
    "k3",
    "run",
    "fixtures/tiny",
    "--ids",
    "1,2,3",
    "--gen",
    "2",
  ], {
    // A clean environment: under `npm test` INIT_CWD is npm's, and deno task keeps it.
    cwd: `${dir.path}/tests`,
    clearEnv: true,
    // Deno installed as a Deno user has it: on PATH (tools/deno finds it there).
    env: { PATH: `${Deno.execPath().replace(/\/[^/]*$/, "")}:/usr/local/bin:/usr/bin:/bin`, HOME: dir.path },
  });
  assert.equal(out.code, 0, out.stderr);
  const direct = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2"]);
  assert.equal(out.stdout.split("\n")[0], direct.stdout.split("\n")[0]);
});

Deno.test("deno task bundle: dist/k3.js alone in an empty directory runs the tiny model, same tokens", async () => {
  await using dir = await tempDir();
  const build = await runCmd(Deno.execPath(), [
    "run",
    ...permissionFlags("compile"),
    `${ROOT}/cli/bundle.ts`,
    "--output",
    `${dir.path}/build/k3.js`,
  ]);
  assert.equal(build.code, 0, build.stderr);
  assert.match(build.stderr, /libk3\.so.*and the worker embedded; --version prints k3 /);
  // Its hint names a Deno that exists after `npm ci` alone (no `deno` on PATH then).
  const launcher = build.stderr.match(/run it: (\S+) run /)?.[1] ?? "";
  assert.equal(launcher, "tools/deno");
  assert.ok(Deno.statSync(`${ROOT}/${launcher}`).isFile);
  // Alone: nothing beside it, run from yet another directory, narrow permissions, a fresh
  // cache for the extracted library, no K3_LIB.
  await Deno.mkdir(`${dir.path}/alone`);
  await Deno.mkdir(`${dir.path}/elsewhere`);
  await Deno.copyFile(`${dir.path}/build/k3.js`, `${dir.path}/alone/k3.js`);
  await Deno.remove(`${dir.path}/build`, { recursive: true });
  const args = ["run", TINY, "--prompt", "Once upon a time", "--gen", "8", "--threads", "2"];
  const env = { XDG_CACHE_HOME: `${dir.path}/cache`, K3_LIB: "" };
  const one = await runCmd(Deno.execPath(), ["run", ...K3_PERMISSIONS, `${dir.path}/alone/k3.js`, ...args], {
    cwd: `${dir.path}/elsewhere`,
    env,
  });
  assert.equal(one.code, 0, one.stderr);
  // The chosen build, plus the scalar one when it was asked for the CPU's features (Deno
  // reads /proc/cpuinfo only with --allow-all).
  const extracted = [...Deno.readDirSync(`${dir.path}/cache/k3`)].map((e) => e.name);
  assert.ok(extracted.length >= 1 && extracted.length <= 2, extracted.join(" "));
  for (const f of extracted) assert.match(f, /^lib-[0-9a-f]{16}\.so$/);
  const ref = await k3(args);
  assert.equal(ref.code, 0, ref.stderr);
  assert.equal(one.stdout, ref.stdout, "same ids and text as k3 run");
  assert.ok(one.stdout.length > 0, "the generated text");
});

Deno.test("license, contributing guide and ignores: Apache-2.0 text, every check it names exists, outputs ignored", async () => {
  const license = await Deno.readTextFile(`${ROOT}/LICENSE`);
  assert.match(license, /^\s*Apache License\s+Version 2\.0, January 2004/);
  assert.match(license, /END OF TERMS AND CONDITIONS/);
  const guide = await Deno.readTextFile(`${ROOT}/CONTRIBUTING.md`);
  for (const section of ["## Layout", "## Running each check", "## Adding a subcommand", "## The bit-identity rule"]) {
    assert.ok(guide.includes(section), section);
  }
  for (const m of guide.matchAll(/npm run ([\w:]+)/g)) assert.ok(packageJson.scripts[m[1]], `npm run ${m[1]} exists`);
  for (const m of guide.matchAll(/`(cli\/\w+\.ts|tests\/\w+\.ts|tests\/oracle\/\w+\.py|engine\/\w+\.ts|main\.ts)`/g)) {
    await Deno.stat(`${ROOT}/${m[1]}`); // every file it names exists
  }
  const ignore = await Deno.readTextFile(`${ROOT}/.gitignore`);
  for (const entry of ["dist/", "report.json", "node_modules"]) {
    assert.match(ignore, new RegExp(`^${entry.replace(".", "\\.")}$`, "m"), entry);
  }
});
