/**
 * Stop strings across token boundaries, the channel splitter, conversation continuation
 * and the strict history parser.
 *
 * @module
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { StopMatcher } from "../../engine/generate/stops.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { chatPrompt, continuePrompt, formatHistory, parseHistory } from "../../engine/text/chat.ts";
import { K3Error } from "../../engine/errors.ts";
import { ReplyReader } from "../../engine/text/xtml.ts";
import { TINY } from "../helpers.ts";

const tiny = Tokenizer.load(TINY);

/** Runs ids through a StopMatcher; returns the emitted text and where it stopped. */
function feed(ids: number[], stops: string[]): { text: string; stoppedAt: number } {
  const m = new StopMatcher(tiny, stops);
  let text = "";
  for (const [i, id] of ids.entries()) {
    const r = m.push(id);
    text += r.text;
    if (r.stopped) return { text, stoppedAt: i };
  }
  return { text: text + m.flush(), stoppedAt: -1 };
}

Deno.test("stop strings: matched across token boundaries, never emitted, held text released", () => {
  const text = "The cat sat on the mat. The end.";
  const ids = tiny.encode(text);
  assert.ok(ids.length > 8);
  // No stop: everything comes out, as the plain decode.
  assert.deepEqual(feed(ids, []), { text, stoppedAt: -1 });
  assert.deepEqual(feed(ids, ["zebra"]), { text, stoppedAt: -1 });
  // Every substring of the text as a stop: the output is the text before its first
  // occurrence, and the stop is detected at the token that completes it.
  for (let a = 0; a < text.length; a++) {
    for (let b = a + 1; b <= Math.min(text.length, a + 9); b++) {
      const stop = text.slice(a, b);
      const first = text.indexOf(stop);
      const r = feed(ids, [stop]);
      assert.equal(r.text, text.slice(0, first), JSON.stringify(stop));
      const done = tiny.decode(ids.slice(0, r.stoppedAt + 1));
      assert.ok(
        done.length >= first + stop.length && tiny.decode(ids.slice(0, r.stoppedAt)).length < first + stop.length,
      );
    }
  }
  // Two stops: the earlier one wins.
  assert.equal(feed(ids, ["end", "mat"]).text, "The cat sat on the ");
  // A stop that is a prefix of text never completed is released at the end.
  assert.deepEqual(feed(ids, [". The end!"]), { text, stoppedAt: -1 });
});

Deno.test("stop strings: property over random text, ids split anywhere", () => {
  fc.assert(
    fc.property(
      fc.string({ unit: "grapheme", maxLength: 40 }),
      fc.string({ minLength: 1, maxLength: 4 }),
      (text, stop) => {
        const ids = tiny.encode(text);
        const full = tiny.decode(ids);
        const r = feed(ids, [stop]);
        const at = full.indexOf(stop);
        if (at < 0) assert.equal(r.text, full);
        else assert.equal(r.text, full.slice(0, at));
      },
    ),
    { numRuns: 300 },
  );
});

Deno.test("continuePrompt: closing what a cut reply left open gives chatPrompt's rendering", () => {
  const enc = (s: string) => tiny.encode(s, { allowSpecial: true });
  const user1 = { role: "user" as const, content: "Hi" };
  const user2 = { role: "user" as const, content: "More?" };
  const first = chatPrompt(tiny, [user1]);
  // The reply was cut inside its think channel.
  const reply = tiny.encode("hmm");
  const s = new ReplyReader(tiny, { thinking: true, tools: false });
  for (const id of reply) s.push(id);
  const whole = [...first, ...reply, ...continuePrompt(tiny, s.left, [user2], true)];
  assert.deepEqual(whole, chatPrompt(tiny, [user1, { role: "assistant", content: "", reasoning: "hmm" }, user2]));
  // A reply that ended at <|close|>message<|sep|> (the turn boundary) gets the
  // <|end_of_msg|> the encoder appends; one that ended with <|end_of_msg|> nothing.
  const done = new ReplyReader(tiny, { thinking: false, tools: false });
  for (const id of enc("ok<|close|>response<|sep|><|close|>message<|sep|>")) done.push(id);
  assert.ok(done.ended);
  const eom = new ReplyReader(tiny, { thinking: false, tools: false });
  for (const id of enc("ok<|end_of_msg|>")) eom.push(id);
  assert.deepEqual(eom.left, { open: [], ended: true });
  assert.deepEqual(continuePrompt(tiny, done.left, [user2], false), [
    ...enc("<|end_of_msg|>"),
    ...continuePrompt(tiny, eom.left, [user2], false),
  ]);
  assert.deepEqual(
    continuePrompt(tiny, eom.left, [user2], false),
    [
      ...enc('<|open|>message role="user"<|sep|>'),
      ...tiny.encode("More?"),
      ...enc(
        '<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>response<|sep|>',
      ),
    ],
  );
});

Deno.test("history: JSONL round trip; every malformed line refused with its line number", () => {
  const msgs = [
    { role: "system" as const, content: "Be brief." },
    { role: "user" as const, content: "Q\nwith newline" },
    { role: "assistant" as const, content: "A", reasoning: "R" },
  ];
  const text = formatHistory(msgs);
  assert.equal(text.split("\n").length, 4);
  assert.deepEqual(parseHistory(text, "h.jsonl"), msgs);
  assert.deepEqual(parseHistory("\n" + text + "\n\n", "h.jsonl"), msgs);
  const bad: [string, RegExp][] = [
    ['{"role":"user","content":"x"}\nnot json', /h\.jsonl:2: not JSON/],
    ["[1]", /h\.jsonl:1: expected a JSON object/],
    ['{"role":"bot","content":"x"}', /:1: "role"/],
    ['{"role":"user"}', /:1: "content" must be a string/],
    ['{"role":"user","content":"x","extra":1}', /:1: unknown field "extra"/],
    ['{"role":"user","content":"x","reasoning":"r"}', /:1: "reasoning" is only for assistant/],
    ['{"role":"assistant","content":"x","reasoning":5}', /:1: "reasoning" must be a string/],
  ];
  for (const [t, re] of bad) {
    assert.throws(
      () => parseHistory(t, "h.jsonl"),
      (e) => e instanceof K3Error && e.exitCode === 2 && re.test(e.message),
    );
  }
});
