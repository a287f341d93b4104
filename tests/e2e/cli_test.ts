/**
 * The command surface, run as a subprocess: help and version without a model, every
 * subcommand's --help, and every usage error and exit code the README documents
 * (0 ok, 1 runtime failure or a batch with bad lines, 2 usage error; 4 is exercised by the
 * expert-streaming tests). Usage errors are one line on stderr, "k3: ...", no stack trace.
 */

import assert from "node:assert/strict";
import { diskNeeded, fittingPreset, presetNeeds, problems, TRUNK_BYTES } from "../../cli/doctor/facts.ts";
import { fmtDuration, progressLine } from "../../cli/progress.ts";
import { permissionFlags } from "../../cli/permissions.ts";
import { copyDir, k3, type Output, ROOT, runCmd, tempDir, TINY, TINY_EN } from "../helpers.ts";

/** Exit `code` with exactly one line on stderr matching `pattern`. */
function assertOneLine(out: Output, code: number, pattern: RegExp, what: string): void {
  assert.equal(out.code, code, `${what}: exit code (stderr: ${out.stderr})`);
  const lines = out.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `${what}: one line on stderr, got: ${out.stderr}`);
  assert.match(lines[0], /^k3: /, what);
  assert.match(lines[0], pattern, what);
  assert.doesNotMatch(out.stderr, /\s+at .*:\d+:\d+/, `${what}: no stack trace`);
}

const COMMANDS = ["run", "batch", "serve", "pack", "tokenize", "detokenize", "doctor", "presets"];

Deno.test("k3 --help, -h, help: the command list, exit 0; no arguments: the same on stdout, exit 2", async () => {
  for (const flag of ["--help", "-h", "help"]) {
    const out = await k3([flag]);
    assert.equal(out.code, 0, out.stderr);
    for (const c of COMMANDS) {
      assert.match(out.stdout, new RegExp(`^  ${c} `, "m"), `${flag} lists ${c}`);
    }
    assert.match(out.stdout, /exit codes: 0 ok, 1 runtime failure, 2 usage/);
    assert.match(out.stdout, /--list-presets/);
  }
  const none = await k3([]);
  assert.equal(none.code, 2);
  assert.match(none.stdout, /usage: k3 <command>/);
});

Deno.test("k3 --version, -V: exit 0, no model needed", async () => {
  for (const flag of ["--version", "-V"]) {
    const out = await k3([flag]);
    assert.equal(out.code, 0);
    assert.match(out.stdout, /^k3 \d+\.\d+\.\d+\n$/);
  }
});

Deno.test({
  name: "k3 --list-presets and k3 presets: the preset table without a model",
  fn: async () => {
    for (const args of [["--list-presets"], ["presets"]]) {
      const out = await k3(args);
      assert.equal(out.code, 0, out.stderr);
      for (const p of ["ultra", "laptop", "desktop", "workstation", "server", "max", "auto"]) {
        assert.match(out.stdout, new RegExp(p));
      }
    }
    assertOneLine(
      await k3(["--list-presets", "x"]),
      2,
      /--list-presets takes no arguments/,
      "--list-presets x",
    );
  },
});

Deno.test("every subcommand has --help (exit 0, usage on stdout, no model needed)", async () => {
  for (const c of COMMANDS) {
    for (const flag of ["--help", "-h"]) {
      const out = await k3([c, flag]);
      assert.equal(out.code, 0, `${c} ${flag}: ${out.stderr}`);
      assert.match(out.stdout, new RegExp(`usage: k3 ${c}`, "i"), `${c} ${flag}`);
    }
  }
});

Deno.test("k3 <model_dir> is short for k3 run <model_dir>; k3 help <command>", async () => {
  const short = await k3([TINY, "--ids", "1,2,3", "--gen", "2"]);
  const run = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2"]);
  assert.equal(short.code, 0, short.stderr);
  assert.equal(short.stdout, run.stdout);
  assertOneLine(await k3([TINY, "--gen", "2"]), 2, /a prompt is required/, "short form, no prompt");
  assertOneLine(
    await k3(["tests/nowhere", "--ids", "1"]),
    2,
    /tests\/nowhere: no such model directory/,
    "missing dir",
  );
  const help = await k3(["help", "batch"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /usage: k3 batch/);
  assertOneLine(await k3(["help", "nope"]), 2, /help: no command "nope"/, "help nope");
});

Deno.test("unknown command or top-level option: exit 2", async () => {
  assertOneLine(
    await k3(["frobnicate"]),
    2,
    /unknown command "frobnicate"; see k3 --help/,
    "unknown command",
  );
  assertOneLine(await k3(["--frobnicate"]), 2, /unknown option "--frobnicate"/, "unknown option");
  assertOneLine(
    await k3(["constructor"]),
    2,
    /unknown command "constructor"/,
    "no prototype lookups",
  );
});

Deno.test("k3 run: usage errors exit 2 with one line naming the problem", async () => {
  await using noTok = await tempDir();
  await copyDir(TINY, noTok.path);
  await Deno.remove(`${noTok.path}/tiktoken.model`);
  const cases: [string[], RegExp][] = [
    [["run", TINY, "--ids", "1", "--frob"], /run: unknown option --frob; see k3 run --help/],
    [["run", TINY, "--ids", "1", "--gen"], /run: Option '--gen <value>' argument missing/],
    [["run", TINY, "--ids"], /--ids <value>' argument missing/],
    [
      ["run", TINY, "--prompt", "hi", "--ids", "1,2"],
      /only one prompt source is allowed, got --prompt and --ids/,
    ],
    [["run", TINY, "--prompt", "hi", "--prompt-file", "/x"], /only one prompt source is allowed/],
    [["run", TINY], /a prompt is required: one of --prompt, --prompt-file, --ids/],
    [["run", "--ids", "1"], /run: expected exactly one <model_dir>/],
    [["run", TINY, TINY, "--ids", "1"], /run: expected exactly one <model_dir>/],
    [["run", TINY, "--ids", "1", "--gen", "5000"], /--gen: 5000 is out of range 1\.\.4096/],
    [["run", TINY, "--ids", "1", "--gen", "0"], /--gen: 0 is out of range/],
    [["run", TINY, "--ids", "1", "--gen", "many"], /--gen: expected an integer, got "many"/],
    [["run", TINY, "--ids", "1", "--chunk", "0"], /--chunk: 0 is out of range 1\.\.8192/],
    [["run", TINY, "--ids", "1", "--layers", "14"], /--layers: 14 is out of range 1\.\.13/],
    [["run", TINY, "--ids", "1,x"], /--ids: expected comma-separated token ids/],
    [["run", TINY, "--ids", "1,99999"], /--ids: id 99999 is outside the vocabulary \(0\.\.1023\)/],
    [
      ["run", TINY, "--ids", "1", "--stop-id", "5000"],
      /--stop-id: id 5000 is outside the vocabulary/,
    ],
    [
      ["run", TINY, "--ids", "1", "--incremental", "--full-recompute"],
      /--incremental and --full-recompute conflict/,
    ],
    [["run", TINY, "--ids", "1", "--preset", "huge"], /--preset: unknown preset "huge"/],
    [["run", TINY, "--ids", "1", "--trunk-gb=-1"], /--trunk-gb: -1 is out of range/],
    [["run", TINY, "--ids", "1", "--trunk-gb", "-1"], /--trunk-gb: -1 is out of range/],
    [["run", TINY, "--ids", "1", "--trunk-gb", "-0.5"], /--trunk-gb: -0\.5 is out of range/],
    [["run", TINY, "--promt", "hi"], /unknown option --promt \(did you mean --prompt\?\); see k3 run --help/],
    [["run", TINY, "--prompt", "a", "--prompt", "b"], /--prompt given more than once; give it once/],
    [["run", TINY, "--ids", "1", "--gen", "2", "--gen", "3"], /--gen given more than once/],
    [["tokenize", "--tok", TINY, "--text", "a", "--text", "b"], /tokenize: --text given more than once/],
    [["run", TINY, "--threds", "2", "--ids", "1"], /did you mean --threads\?/],
    [["ru", TINY], /unknown command "ru" \(did you mean run\?\); see k3 --help/],
    [["tokenise"], /did you mean tokenize\?/],
    [["--versoin"], /unknown option "--versoin" \(did you mean --version\?\)/],
    [["run", "README.md", "--ids", "1"], /^k3: README\.md is not a model directory: it is a file$/],
    [["run", "tests", "--ids", "1"], /^k3: tests is not a model directory: no config\.json$/],
    [["run", TINY, "--tok", "README.md", "--prompt", "hi"], /README\.md is not a tokenizer directory: it is a file/],
    [["run", TINY, "--prompt-file", "tests"], /--prompt-file: cannot read tests is a directory, not a file/],
    [["tokenize", "--tok", TINY, "--file", "tests"], /--file: cannot read tests is a directory, not a file/],
    [
      ["run", TINY, "--ids", "1", "--cache-gb", "lots"],
      /--cache-gb: expected a number, got "lots"/,
    ],
    [["run", noTok.path, "--prompt", "hi"], /--prompt needs a tokenizer: pass --tok DIR/],
    [["run", TINY, "--prompt-file", `${noTok.path}/missing.txt`], /--prompt-file: cannot read/],
    [["run", TINY, "--prompt", ""], /the prompt is empty/],
    [["run", `${noTok.path}/nowhere`, "--ids", "1"], /nowhere: no such directory \(expected a model directory\)/],
  ];
  for (const [args, pattern] of cases) assertOneLine(await k3(args), 2, pattern, args.join(" "));
});

Deno.test("k3 run: a prompt from text, a file and ids; the tokenizer from --tok", async () => {
  await using dir = await tempDir();
  await copyDir(TINY, dir.path);
  await Deno.rename(`${dir.path}/tiktoken.model`, `${dir.path}/tok.model`);
  await Deno.mkdir(`${dir.path}/tok`);
  await Deno.rename(`${dir.path}/tok.model`, `${dir.path}/tok/tiktoken.model`);
  await Deno.copyFile(`${TINY}/tokenizer_config.json`, `${dir.path}/tok/tokenizer_config.json`);
  await Deno.writeTextFile(`${dir.path}/p.txt`, "Once upon a time");
  const a = await k3(["run", TINY, "--prompt", "Once upon a time", "--gen", "3"]);
  const b = await k3([
    "run",
    dir.path,
    "--tok",
    `${dir.path}/tok`,
    "--prompt-file",
    `${dir.path}/p.txt`,
    "--gen",
    "3",
  ]);
  assert.equal(a.code, 0, a.stderr);
  assert.equal(b.code, 0, b.stderr);
  assert.equal(a.stdout, b.stdout);
  assert.match(a.stderr, /PEAK RSS/);
});

Deno.test("tokenize / detokenize: unknown flags and missing values exit 2", async () => {
  for (const c of ["tokenize", "detokenize"]) {
    const out = await k3([c, "--frob"]);
    assert.equal(out.code, 2, `${c}: ${out.stderr}`);
    assert.match(out.stderr, /^k3: .*unknown option --frob; see k3 (de)?tokenize --help/);
    const miss = await k3([c, "--tok"]);
    assert.equal(miss.code, 2, `${c} --tok: ${miss.stderr}`);
  }
});

Deno.test("k3 doctor: usage errors exit 2", async () => {
  const cases: [string[], RegExp][] = [
    [["doctor", "--size-mb", "10"], /--size-mb: 10 is out of range 64\.\.65536/],
    [["doctor", "--size-mb"], /argument missing/],
    [["doctor", "--dir", "/nonexistent/k3"], /--dir: \/nonexistent\/k3 does not exist/],
    [["doctor", "--dir", `${TINY}/config.json`], /is not a directory/],
    [["doctor", "--no-read", "--size-mb", "64"], /--size-mb and --no-read conflict/],
    [["doctor", "extra"], /doctor: Unexpected argument 'extra'/],
    [["doctor", "--frob"], /doctor: unknown option --frob; see k3 doctor --help/],
  ];
  for (const [args, pattern] of cases) assertOneLine(await k3(args), 2, pattern, args.join(" "));
});

Deno.test("k3 doctor --size-mb 64: every section, a verdict that matches the exit code, nothing left behind", async () => {
  await using dir = await tempDir();
  const out = await k3(["doctor", "--dir", dir.path, "--size-mb", "64"]);
  for (const section of ["cpu", "kernels", "memory", "disk", "reads"]) {
    assert.match(out.stdout, new RegExp(`^${section} +\\S`, "m"), section);
  }
  assert.match(out.stdout, /^kernels +(avx512|avx2|neon|scalar) path/m);
  assert.match(out.stdout, /^memory +[\d.]+ [kMG]?B available/m);
  assert.match(
    out.stdout,
    /^reads +(O_DIRECT|buffered).* on a 64 MiB file: 17\.5 MB random [\d.]+ GB\/s at depth 1, [\d.]+ GB\/s at depth 16; sequential [\d.]+ GB\/s/m,
  );
  const bad = /^PROBLEM /m.test(out.stdout);
  assert.equal(out.code, bad ? 1 : 0, out.stdout + out.stderr);
  assert.match(
    out.stdout,
    bad
      ? /verdict: this machine cannot run Kimi K3/
      : /verdict: this machine can run Kimi K3 with --preset \w+\. Next:\n.*k3 run/,
  );
  const left = [];
  for await (const e of Deno.readDir(dir.path)) left.push(e.name);
  assert.deepEqual(left, [], "the temporary file is removed");
});

Deno.test("doctor verdict: too little memory for the smallest plan, too little disk, no kernels -> cannot run; presets by the engine's plan", () => {
  const ok = { memAvailable: 30e9, minNeed: 4.1e9, diskFree: 2e12, hasCheckpoint: false };
  assert.deepEqual(problems(ok), []);
  assert.match(
    problems({ ...ok, memAvailable: 3.9e9 })[0],
    /only 3\.90 GB of memory available; the smallest plan \(--preset ultra, 256 positions\) needs 4\.10 GB/,
  );
  assert.match(problems({ ...ok, diskFree: 1e12 })[0], /the checkpoint .* need/);
  assert.deepEqual(problems({ ...ok, diskFree: 200e9, hasCheckpoint: true }), []);
  assert.match(
    problems({ ...ok, diskFree: TRUNK_BYTES - 1, hasCheckpoint: true })[0],
    /packing the trunk needs/,
  );
  assert.match(problems({ ...ok, kernelError: "nope" })[0], /no loadable kernel library: nope/);
  assert.equal(diskNeeded(true), TRUNK_BYTES);
  // The needs come from engine/weights/plan.ts (the same numbers k3 presets prints), growing by preset.
  const needs = presetNeeds(4096);
  assert.deepEqual(needs.map((n) => n.name), [
    "ultra",
    "laptop",
    "desktop",
    "workstation",
    "server",
    "max",
  ]);
  for (let i = 1; i < needs.length; i++) {
    assert.ok(needs[i].bytes > needs[i - 1].bytes, needs[i].name);
  }
  assert.ok(presetNeeds(256)[0].bytes < needs[0].bytes, "a shorter context needs less");
  assert.equal(fittingPreset(needs[0].bytes - 1, needs), undefined);
  assert.equal(fittingPreset(needs[0].bytes, needs)?.name, "ultra");
  assert.equal(fittingPreset(needs[2].bytes + 1, needs)?.name, "desktop");
  assert.equal(fittingPreset(1e13, needs)?.name, "max");
});

Deno.test("k3 doctor: not enough memory for even the smallest plan -> exit 1 with the reason", async () => {
  const out = await k3(["doctor", "--dir", TINY, "--no-read"], {
    env: { K3_MEM_AVAILABLE_GB: "3" },
  });
  assert.equal(out.code, 1, out.stdout + out.stderr);
  assert.match(out.stdout, /^memory +3\.00 GB available .* fits no preset/m);
  assert.match(out.stdout, /^PROBLEM +only 3\.00 GB of memory available; the smallest plan/m);
  assert.match(out.stdout, /verdict: this machine cannot run Kimi K3/);
  assertOneLine(
    await k3(["doctor", "--positions", "0"]),
    2,
    /--positions: 0 is out of range/,
    "positions 0",
  );
});

Deno.test("progress line: done/total, rate or MB/s, ETA, then the total time", () => {
  assert.equal(progressLine("index", 5, 10, 2), "index: 5/10 (50%), 2.50/s, ETA 2.0 s");
  assert.equal(progressLine("pack", 1, 4, 10, 500e6), "pack: 1/4 (25%), 50.0 MB/s, ETA 30 s");
  assert.equal(progressLine("load", 10, 10, 125), "load: 10/10 (100%), 0.08/s, in 2 min 05 s");
  assert.equal(progressLine("load", 0, 10, 0), "load: 0/10 (0.0%)");
  assert.equal(fmtDuration(7300), "2 h 01 min");
});

Deno.test("the compiled binary's permissions are enough: run, batch and doctor under exactly them", async () => {
  const { PERMISSIONS } = await import("../../cli/compile.ts");
  await using dir = await tempDir();
  const sub = (args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args: ["run", ...PERMISSIONS, `${ROOT}/main.ts`, ...args],
      stdout: "piped",
      stderr: "piped",
    }).output();
  const dec = new TextDecoder();
  const run = await sub(["run", TINY, "--prompt", "Once upon a time", "--gen", "2"]);
  assert.equal(run.code, 0, dec.decode(run.stderr));
  await Deno.writeTextFile(`${dir.path}/p.jsonl`, '{"id": 1, "prompt": "hi", "gen": 2}\n');
  const batch = await sub([
    "batch",
    TINY,
    "--input",
    `${dir.path}/p.jsonl`,
    "--output",
    `${dir.path}/r.jsonl`,
  ]);
  assert.equal(batch.code, 0, dec.decode(batch.stderr));
  const doc = await sub(["doctor", "--dir", dir.path, "--no-read"]);
  assert.doesNotMatch(
    dec.decode(doc.stdout) + dec.decode(doc.stderr),
    /Requires .* access|cannot read free space/,
  );
  assert.ok(
    !PERMISSIONS.some((p: string) => /^--allow-(run|all)\b|^-A$/.test(p)),
    "no subprocesses (the network is granted for k3 serve's listener)",
  );
});

Deno.test("deno task demo: the trained model said, its text shown, tokens equal the float64 reference, streamed equals resident", async () => {
  const tasks = JSON.parse(await Deno.readTextFile(`${ROOT}/deno.json`)).tasks;
  assert.match(tasks.demo.command, /deno run -q -P=k3 cli\/demo\.ts/);
  const { K3_PERMISSIONS } = await import("../../cli/permissions.ts");
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...K3_PERMISSIONS, `${ROOT}/cli/demo.ts`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  assert.match(
    stderr,
    /^demo: the bundled model \(tests\/fixtures\/tiny-en\) is a 2 M-parameter K3 trained on the Brown corpus/m,
  );
  assert.match(stderr, /demo: \$ k3 pack tests\/fixtures\/tiny-en \/\S+\/trunk/);
  const ref = JSON.parse(await Deno.readTextFile(`${TINY_EN}/reference.json`));
  const n = ref.generated_ids.length;
  assert.ok(
    stderr.includes(
      `demo: $ k3 run tests/fixtures/tiny-en --prompt ${JSON.stringify(ref.prompt_text)} --gen ${n} --out `,
    ),
  );
  assert.match(stderr, /demo: \$ k3 run .* --trunk \S+ --trunk-gb 0\.0005 --cache-gb 0\.0002/);
  assert.ok(stderr.includes(`(${ref.prompt_ids.length} tokens, the reference's prompt ids)`), "the prompt ids");
  assert.ok(stderr.includes(`reference.json): ${ref.generated_ids.join(",")}\n`), "the reference tokens");
  assert.ok(new TextDecoder().decode(out.stdout).includes(JSON.parse(stderr.match(/continuation: (".*")\n/)![1])));
  assert.match(
    stderr,
    new RegExp(`resident run: ${n}/${n} tokens equal the reference; prefill [\\d.]+ s, decode [\\d.]+ s/token`),
  );
  assert.match(
    stderr,
    new RegExp(`streamed run: ${n}/${n} tokens equal the resident run; prefill [\\d.]+ s, decode [\\d.]+ s/token`),
  );
  assert.match(stderr, /Next, from this checkout: npm run -s k3 -- doctor/);
  assert.equal(packageJsonScript("k3").length > 0, true, "the hint's npm script exists");
  const tmp = stderr.match(/removed (\S+)\./)![1];
  await assert.rejects(() => Deno.stat(tmp), Deno.errors.NotFound);
});

function packageJsonScript(name: string): string {
  return JSON.parse(Deno.readTextFileSync(`${ROOT}/package.json`)).scripts[name] ?? "";
}

Deno.test("k3 doctor --checkpoint: a complete checkpoint passes, a shard longer than its header is a problem", async () => {
  const good = await k3(["doctor", "--no-read", "--dir", TINY, "--checkpoint", TINY]);
  assert.match(
    good.stdout,
    /^model +.*tiny: 3 of 3 shards whole, [\d,]+ bytes, 919 tensors; complete \(not the released shape\)$/m,
  );
  assert.doesNotMatch(good.stdout, /PROBLEM .*header describes/);
  await using dir = await tempDir();
  await copyDir(TINY, dir.path);
  const shard = `${dir.path}/model-00002-of-00003.safetensors`;
  const f = await Deno.open(shard, { append: true });
  await f.write(new Uint8Array(100));
  f.close();
  const bad = await k3(["doctor", "--no-read", "--dir", dir.path, "--checkpoint", dir.path]);
  assert.equal(bad.code, 1);
  assert.match(bad.stdout, /PROBLEM +.*model-00002-of-00003\.safetensors: \d+ bytes, but its header describes \d+/);
  // A truncated shard and a missing one: each named by file, a verdict, and what to run.
  await Deno.truncate(shard, (await Deno.stat(shard)).size - 5000);
  await Deno.remove(`${dir.path}/model-00003-of-00003.safetensors`);
  const cut = await k3(["doctor", "--no-read", "--dir", dir.path, "--checkpoint", dir.path]);
  assert.equal(cut.code, 1);
  assert.equal(cut.stderr, "", "a verdict, not a stop");
  assert.match(cut.stdout, /^model +.*: 1 of 3 shards whole, /m);
  assert.match(cut.stdout, /PROBLEM +.*model-00002-of-00003\.safetensors: shorter than its header says: \d+ bytes/);
  assert.match(
    cut.stdout,
    /PROBLEM +.*model-00003-of-00003\.safetensors: missing \(model\.safetensors\.index\.json puts \d+/,
  );
  assert.match(cut.stdout, /PROBLEM +download those 2 shards again: k3 pull <repo> /);
  assert.match(cut.stdout, /^verdict: /m);
});

Deno.test("help texts: every one begins `usage: k3 <command>` and shows examples; -V is documented", async () => {
  for (const c of COMMANDS) {
    const out = await k3([c, "--help"]);
    assert.match(out.stdout, new RegExp(`^usage: k3 ${c}\\b`), c);
    assert.match(out.stdout, /^examples?:\n {2}k3 /m, `${c} has examples`);
  }
  const top = await k3(["--help"]);
  assert.match(top.stdout, /-V, --version/);
  assert.match(top.stdout, /^examples:\n {2}k3 /m);
});

Deno.test("--threads above the cores: capped at the cores, said on stderr, same tokens", async () => {
  const cores = navigator.hardwareConcurrency;
  const over = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "3", "--threads", String(cores + 5)]);
  assert.equal(over.code, 0, over.stderr);
  assert.match(
    over.stderr,
    new RegExp(`^k3: --threads ${cores + 5}: this machine has ${cores} cores; using ${cores}$`, "m"),
  );
  const plain = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "3"]);
  assert.equal(over.stdout, plain.stdout);
  assert.doesNotMatch(plain.stderr, /--threads/);
});

Deno.test("bench scripts: --help prints the usage (exit 0), a bad flag is one message (exit 2), no stack trace", async () => {
  for (
    const script of [
      "disk",
      "ladder",
      "layers",
      "tokenizer_sweep",
      "batch",
      "slice",
      "serve",
      "chat",
      "verify",
      "limits",
      "long_prompt",
    ]
  ) {
    const help = await runCmd(Deno.execPath(), [
      "run",
      ...permissionFlags("bench"),
      `${ROOT}/bench/${script}.ts`,
      "--help",
    ]);
    assert.equal(help.code, 0, `${script}: ${help.stderr}`);
    assert.match(help.stdout, new RegExp(`^usage: deno (run -A bench/${script}\\.ts|task ${script})`), script);
    const bad = await runCmd(Deno.execPath(), [
      "run",
      ...permissionFlags("bench"),
      `${ROOT}/bench/${script}.ts`,
      "--bogus",
    ]);
    assert.equal(bad.code, 2, script);
    assert.match(bad.stderr, /^Unknown option '--bogus'\nusage: /, script);
    assert.doesNotMatch(bad.stderr, /\s+at .*:\d+:\d+/, `${script}: no stack trace`);
  }
});

Deno.test("presets: each label says the memory its plan needs, runtime included (no promises about machines)", async () => {
  const out = await k3(["presets"]);
  assert.equal(out.code, 0, out.stderr);
  for (const n of presetNeeds(4096)) {
    const gb = (n.bytes / 1e9).toFixed(2);
    assert.match(
      out.stdout,
      new RegExp(`^  ${n.name} +[\\d.]+ +[\\d.]+  ${gb.replace(".", "\\.")} GB free: `, "m"),
      n.name,
    );
  }
  assert.doesNotMatch(out.stdout, /GB machines/);
});

Deno.test("doctor --checkpoint: free space measured where the checkpoint is, only the trunk still to write", async () => {
  const out = await k3(["doctor", "--no-read", "--checkpoint", TINY]);
  const disk = out.stdout.match(/^disk +.*$/m)?.[0] ?? "";
  // The tiny model's own trunk (its non-expert tensors), not the released 113.5 GB.
  assert.match(
    disk,
    new RegExp(`free at ${TINY}; the checkpoint is already on disk .*packing its trunk needs [\\d.]+ MB$`),
  );
  assert.doesNotMatch(out.stdout, /the checkpoint \(1560\.94 GB\)/, "the checkpoint is not counted again");
});

Deno.test("paths of the wrong kind: one line saying what was expected, exit 2", async () => {
  await using dir = await tempDir();
  const file = `${dir.path}/a-file`;
  await Deno.writeTextFile(file, "x");
  await Deno.writeTextFile(`${dir.path}/in.jsonl`, '{"id": 1, "ids": [1]}\n');
  const cases: [string[], RegExp][] = [
    [["pack", TINY, file], /^k3: pack: \S+a-file is a file; the trunk needs a directory/],
    [
      ["batch", TINY, "--input", dir.path, "--output", `${dir.path}/o.jsonl`],
      /--input: cannot read \S+ is a directory, not a file/,
    ],
    [
      ["batch", TINY, "--input", `${dir.path}/in.jsonl`, "--output", dir.path],
      /--output: \S+ is a directory, expected a file to write/,
    ],
    [["run", TINY, "--trunk", file, "--ids", "1"], /a-file is not a packed trunk: it is a file; make one with k3 pack/],
    [["run", file, "--ids", "1"], /a-file is not a model directory: it is a file$/],
    [["run", `${dir.path}/missing`, "--ids", "1"], /missing: no such directory \(expected a model directory\)$/],
  ];
  for (const [args, pattern] of cases) {
    const out = await k3(args);
    // A wrong-kind --trunk is 2 like every other path (README, Exit codes).
    assertOneLine(out, 2, pattern, args.join(" "));
    assert.doesNotMatch(out.stderr, /os error|readfile|internal error/, args.join(" "));
  }
});

Deno.test("doctor names the CPU model under k3's own permissions (no --allow-all)", async () => {
  const out = await k3(["doctor", "--no-read"]);
  const cpuinfo = (await runCmd("cat", ["/proc/cpuinfo"])).stdout;
  const model = cpuinfo.match(/^(?:model name|Model|Hardware)\s*:\s*(.+)$/m)?.[1];
  assert.ok(model, "this machine's /proc/cpuinfo names a model");
  const line = out.stdout.match(/^cpu +(.*)$/m)?.[1] ?? "";
  assert.ok(line.startsWith(`${model};`), line);
  assert.doesNotMatch(line, /model unknown/);
});
