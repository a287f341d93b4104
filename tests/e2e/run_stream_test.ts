/**
 * `k3 run` as a stream: seeded sampling reproducible at every budget and thread count,
 * temperature 0 equal to greedy and the reference, stop strings, --json lines, saved
 * states through the CLI, and SIGINT keeping and reporting what was generated.
 *
 * @module
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { jsonIds, k3, type Output, readReference, ROOT, tempDir, TINY } from "../helpers.ts";

const SAMPLED = ["--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed", "7"];

/** The --json lines of a run: per-token objects, then the summary. */
function jsonLines(out: Output): { tokens: { index: number; id: number; text: string }[]; summary: any } {
  assert.equal(out.code, 0, out.stderr);
  const lines = out.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
  return { tokens: lines.slice(0, -1), summary: lines[lines.length - 1] };
}

Deno.test("run: seeded sampling gives the same tokens at every budget and thread count; another seed differs", async () => {
  const args = ["run", TINY, "--ids", "5,17,300,42", "--gen", "16", "--json", ...SAMPLED];
  const resident = jsonIds((await k3([...args, "--threads", "1"])).stdout);
  assert.equal(resident.length, 16);
  assert.deepEqual(jsonIds((await k3([...args, "--threads", "2"])).stdout), resident);
  assert.deepEqual(jsonIds((await k3([...args, "--cache-gb", "0.00003", "--trunk-gb", "0.0002"])).stdout), resident);
  assert.deepEqual(jsonIds((await k3([...args, "--chunk", "1"])).stdout), resident);
  const other = jsonIds((await k3([...args.slice(0, -2), "--seed", "8"])).stdout);
  assert.notDeepEqual(other, resident);
  const greedy = jsonIds((await k3(["run", TINY, "--ids", "5,17,300,42", "--gen", "16", "--json"])).stdout);
  assert.notDeepEqual(greedy, resident, "sampling at temperature 0.9 is not the argmax");
});

Deno.test("run: temperature 0 is greedy and equals the float64 reference, whatever the other sampling flags", async () => {
  const ref = await readReference(`${TINY}/reference.json`);
  const out = await k3([
    "run",
    TINY,
    "--ids",
    ref.prompt_ids.join(","),
    "--gen",
    String(ref.generated_ids.length),
    "--json",
    "--temperature",
    "0",
    "--top-p",
    "0.5",
    "--min-p",
    "0.3",
    "--seed",
    "99",
  ]);
  assert.deepEqual(jsonIds(out.stdout), ref.generated_ids);
});

Deno.test("run: --json streams one object per token whose texts add up; stop strings cut across tokens", async () => {
  const base = ["run", TINY, "--prompt", "Once upon a time", "--gen", "16", "--json"];
  const { tokens, summary } = jsonLines(await k3(base));
  assert.equal(tokens.length, 16);
  assert.deepEqual(tokens.map((t) => t.id), summary.generated_ids);
  assert.deepEqual(tokens.map((t) => t.index), [...Array(16).keys()]);
  const text: string = summary.generated_text;
  assert.equal(tokens.map((t) => t.text).join(""), text);
  assert.equal(summary.finish_reason, "length");
  // A stop string that spans the boundary between the 3rd and 4th token's text.
  const cut = tokens.slice(0, 3).map((t) => t.text).join("").length;
  assert.ok(tokens[2].text.length > 0 && tokens[3].text.length > 0);
  const stop = text.slice(cut - 1, cut + 1);
  const at = text.indexOf(stop);
  const stopped = jsonLines(await k3([...base, "--stop", "zzz-never", "--stop", stop]));
  assert.equal(stopped.summary.finish_reason, "stop");
  assert.equal(stopped.summary.generated_text, text.slice(0, at), "text before the stop, the stop not emitted");
  assert.ok(stopped.summary.generated_ids.length <= 4);
  assert.deepEqual(stopped.summary.generated_ids, summary.generated_ids.slice(0, stopped.summary.generated_ids.length));
  // Plain stdout: the same text, streamed, then a newline.
  const plain = await k3(["run", TINY, "--prompt", "Once upon a time", "--gen", "16", "--stop", stop]);
  assert.equal(plain.stdout, text.slice(0, at) + "\n");
  assert.match(plain.stderr, /finish_reason stop/);
  // Without a tokenizer the ids stream instead.
  await using d = await tempDir();
  for (const f of ["config.json", "model.safetensors.index.json"]) {
    await Deno.copyFile(`${TINY}/${f}`, `${d.path}/${f}`);
  }
  for await (const e of Deno.readDir(TINY)) {
    if (e.name.endsWith(".safetensors")) await Deno.symlink(`${TINY}/${e.name}`, `${d.path}/${e.name}`);
  }
  const ids = await k3(["run", d.path, "--ids", "1,2,3", "--gen", "4"]);
  const withTok = jsonIds((await k3(["run", TINY, "--ids", "1,2,3", "--gen", "4", "--json"])).stdout);
  assert.equal(ids.stdout, withTok.join(",") + "\n");
  const noTok = await k3(["run", d.path, "--ids", "1,2,3", "--stop", "x"]);
  assert.equal(noTok.code, 2);
  assert.match(noTok.stderr, /--stop needs a tokenizer/);
});

Deno.test("run: --save-state then --load-state with the rest of the prompt equals one run; damage refused", async () => {
  await using d = await tempDir();
  const ids = [5, 17, 300, 42, 99, 123, 640, 7, 250];
  const whole = jsonIds((await k3(["run", TINY, "--ids", ids.join(","), "--gen", "10", "--json"])).stdout);
  const st = `${d.path}/p.k3state`;
  const save = await k3(["run", TINY, "--ids", ids.slice(0, 5).join(","), "--gen", "0", "--save-state", st]);
  assert.equal(save.code, 0, save.stderr);
  assert.match(save.stderr, /saved the state of 5 tokens/);
  const cont = await k3(["run", TINY, "--ids", ids.slice(5).join(","), "--gen", "10", "--load-state", st, "--json"]);
  assert.deepEqual(jsonIds(cont.stdout), whole);
  // A state saved after generation holds the generated tokens too.
  const st2 = `${d.path}/g.k3state`;
  const gen = await k3(["run", TINY, "--ids", ids.join(","), "--gen", "4", "--save-state", st2, "--json"]);
  assert.deepEqual(jsonIds(gen.stdout), whole.slice(0, 4));
  const more = await k3(["run", TINY, "--ids", String(whole[4]), "--gen", "5", "--load-state", st2, "--json"]);
  assert.deepEqual(jsonIds(more.stdout), whole.slice(5, 10));
  // Damage: one line, exit 1, nothing generated.
  const bytes = await Deno.readFile(st);
  bytes[bytes.length - 100] ^= 1;
  await Deno.writeFile(`${d.path}/bad.k3state`, bytes);
  const bad = await k3(["run", TINY, "--ids", "1", "--load-state", `${d.path}/bad.k3state`]);
  assert.equal(bad.code, 1);
  assert.equal(bad.stdout, "");
  assert.match(bad.stderr, /^k3: state .*bad\.k3state: corrupt \(checksum mismatch\); refusing it$/m);
  const other = await k3(["run", TINY, "--ids", "1", "--load-state", st, "--layers", "5"]);
  assert.equal(other.code, 1);
  assert.match(other.stderr, /saved with a different model config/);
  const usage = await k3(["run", TINY, "--ids", "1", "--load-state", st, "--full-recompute"]);
  assert.equal(usage.code, 2);
});

Deno.test("run: SIGINT stops cleanly: the text so far on stdout, --out with finish_reason interrupted, exit 130", async () => {
  await using d = await tempDir();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...K3_PERMISSIONS,
      `${ROOT}/main.ts`,
      "run",
      TINY,
      "--ids",
      "1,2,3",
      "--gen",
      "4096",
      "--out",
      `${d.path}/r.json`,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdout = new Response(child.stdout).text();
  // Wait for a few generated steps on stderr, then interrupt.
  const dec = new TextDecoder();
  let err = "";
  const reader = child.stderr.getReader();
  while (!/\n {3}5 /.test(err)) {
    const { value, done } = await reader.read();
    if (done) break;
    err += dec.decode(value);
  }
  child.kill("SIGINT");
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      err += dec.decode(value);
    }
  })();
  const { code } = await child.status;
  await rest;
  assert.equal(code, 130, err);
  const report = JSON.parse(await Deno.readTextFile(`${d.path}/r.json`));
  assert.equal(report.finish_reason, "interrupted");
  const n = report.generated_ids.length;
  assert.ok(n >= 6 && n < 4096, `${n} tokens`);
  assert.equal(await stdout, report.generated_text + "\n");
  assert.match(err, /finish_reason interrupted/);
  // What it kept is what an uninterrupted run generates.
  const again = jsonIds((await k3(["run", TINY, "--ids", "1,2,3", "--gen", String(n), "--json"])).stdout);
  assert.deepEqual(report.generated_ids, again);
});
