/**
 * A model whose tokenizer does not name every id (tiny without tokenizer_config.json: ranks
 * 0..767 only, vocab_size 1024): one note before the run, those ids decode as `<|id:N|>`
 * in every output path (one decoder), the tokens are those of the full tokenizer, exit 0.
 * An id at or past the vocabulary is still refused.
 */

import assert from "node:assert/strict";
import { k3, tempDir, TINY } from "../helpers.ts";
import { Tokenizer, unnamedIdText } from "../../engine/text/tokenizer.ts";
import { K3Error } from "../../engine/errors.ts";

/** A copy of the tiny model without tokenizer_config.json. */
async function tinyWithoutConfig(dir: string): Promise<string> {
  for await (const e of Deno.readDir(TINY)) {
    if (e.isFile && e.name !== "tokenizer_config.json") await Deno.copyFile(`${TINY}/${e.name}`, `${dir}/${e.name}`);
  }
  return dir;
}

function refused(f: () => unknown, pattern: RegExp): void {
  assert.throws(f, (e) => e instanceof K3Error && e.exitCode === 2 && pattern.test(e.message));
}

Deno.test("tokenizer: forModel names the uncovered ids; they decode as <|id:N|>, past the vocabulary stays an error", async () => {
  await using dir = await tempDir();
  const tok = Tokenizer.load(await tinyWithoutConfig(dir.path));
  assert.equal(tok.vocabSize, 768);
  // Before binding to a model, the tokenizer's own vocabulary bounds decoding.
  refused(() => tok.decode([933]), /token id 933 is outside the vocabulary \(0\.\.767\)/);
  assert.deepEqual(tok.forModel(1024), [[768, 1023]]);
  assert.equal(unnamedIdText(933), "<|id:933|>");
  assert.equal(tok.decode([933]), "<|id:933|>");
  assert.equal(tok.decode([72, 768, 105]), tok.decode([72]) + "<|id:768|>" + tok.decode([105]));
  const s = tok.streamDecoder();
  assert.equal(s.push(1023), "<|id:1023|>");
  refused(() => tok.decode([1024]), /token id 1024 is outside the vocabulary \(0\.\.1023\)/);
  refused(() => tok.decode([-1]), /outside/);
  refused(() => tok.decode([768.5]), /outside/);
  // The full tiny tokenizer covers its model: nothing to note, nothing changes.
  const full = Tokenizer.load(TINY);
  assert.deepEqual(full.forModel(1024), []);
  assert.equal(full.decode([770]), "<|end_of_msg|>");
  // Gaps inside the vocabulary are ranges too.
  assert.deepEqual(tok.forModel(770), [[768, 769]]);
});

Deno.test("run and batch without tokenizer_config.json: one note first, placeholders in the text, same tokens, exit 0; chat and serve refuse up front", async () => {
  await using dir = await tempDir();
  const model = await tinyWithoutConfig(dir.path);
  const args = ["--prompt", "hi", "--gen", "12", "--json"];
  const bare = await k3(["run", model, ...args]);
  const full = await k3(["run", TINY, ...args]);
  assert.equal(bare.code, 0, bare.stderr);
  assert.equal(full.code, 0, full.stderr);
  const lines = (s: string) => s.trimEnd().split("\n").map((l) => JSON.parse(l));
  const [b, f] = [lines(bare.stdout), lines(full.stdout)];
  const summary = b[b.length - 1];
  assert.deepEqual(summary.generated_ids, f[f.length - 1].generated_ids, "the tokens do not depend on the names");
  const unnamed = (summary.generated_ids as number[]).filter((id) => id >= 768);
  assert.ok(unnamed.length > 0, "this prompt generates ids the bare tokenizer cannot name");
  for (const id of unnamed) assert.ok(summary.generated_text.includes(`<|id:${id}|>`), `${id} shown`);
  const perToken = b.slice(0, -1);
  // (A held-back incomplete UTF-8 character before it is flushed as U+FFFD.)
  for (const t of perToken) if (t.id >= 768) assert.ok(t.text.endsWith(`<|id:${t.id}|>`), t.text);
  // The note: one line, before the run (before the step table), naming the range.
  const notes = bare.stderr.split("\n").filter((l) => l.includes("decode as <|id:N|>"));
  assert.equal(notes.length, 1, bare.stderr);
  assert.match(notes[0], /^k3: note: the tokenizer in .* names 768 of the model's 1024 ids; 256 \(768\.\.1023\)/);
  assert.ok(bare.stderr.indexOf(notes[0]) < bare.stderr.indexOf("step   token"));
  assert.ok(!full.stderr.includes("decode as"), "a covering tokenizer gives no note");
  // Plain text output (the streamed decoder) shows the placeholders too.
  const text = await k3(["run", model, "--prompt", "hi", "--gen", "12"]);
  assert.equal(text.code, 0, text.stderr);
  assert.equal(text.stdout.trimEnd(), summary.generated_text.trimEnd());

  // batch decodes with the same tokenizer.
  await Deno.writeTextFile(`${dir.path}/in.jsonl`, JSON.stringify({ id: "a", prompt: "hi", gen: 12 }) + "\n");
  const out = await k3(["batch", model, "--input", `${dir.path}/in.jsonl`, "--output", `${dir.path}/out.jsonl`]);
  assert.equal(out.code, 0, out.stderr);
  const r = JSON.parse(await Deno.readTextFile(`${dir.path}/out.jsonl`));
  assert.deepEqual(r.generated_ids, summary.generated_ids);
  assert.equal(r.generated_text, summary.generated_text);
  assert.equal(out.stderr.split("\n").filter((l) => l.includes("decode as <|id:N|>")).length, 1);

  // chat needs the template's added tokens: refused before the model is opened.
  const chat = await k3(["chat", model, "--gen", "4"], { stdin: "hi\n" });
  assert.equal(chat.code, 1, chat.stderr);
  assert.match(chat.stderr, /^k3: .*vocabulary has no added token <\|end_of_msg\|>$/m);
  assert.ok(!chat.stderr.includes("memory plan"), chat.stderr);
  // So does serve (every request stops at them), before it listens.
  const serve = await k3(["serve", model, "--port", "0"], { seconds: 60 });
  assert.equal(serve.code, 1, serve.stderr);
  assert.match(serve.stderr, /^k3: .*vocabulary has no added token <\|end_of_msg\|>$/m);
  assert.ok(!/listening/i.test(serve.stderr + serve.stdout), serve.stderr);
});
