/**
 * `k3 chat --tools`: the declarations go into the prompt exactly as the template renders
 * them (each turn still equal to chatPrompt over the conversation), and a bad tools or
 * results file is a one-line usage error (exit 2).
 */

import assert from "node:assert/strict";
import { chatPrompt } from "../../engine/text/chat.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { k3, tempDir, TINY } from "../helpers.ts";

const tiny = Tokenizer.load(TINY);
const TOOLS = [{
  type: "function",
  function: { name: "get_weather", description: "Weather.", parameters: { type: "object", properties: {} } },
}];

Deno.test("chat --tools: the tools are declared in the prompt the template gives", async () => {
  await using d = await tempDir();
  const tools = `${d.path}/tools.json`, out = `${d.path}/r.json`;
  await Deno.writeTextFile(tools, JSON.stringify(TOOLS));
  const res = await k3(
    ["chat", TINY, "--tools", tools, "--no-think", "--gen", "4", "--temperature", "0", "--out", out],
    { stdin: "Weather?\n" },
  );
  assert.equal(res.code, 0, res.stderr);
  const turn = JSON.parse(await Deno.readTextFile(out)).turns[0];
  const want = chatPrompt(tiny, [{ role: "user", content: "Weather?" }], {
    thinking: false,
    tools: [{ name: "get_weather", description: "Weather.", parameters: { type: "object", properties: {} } }],
  });
  assert.deepEqual(turn.prompt_ids, want);
  assert.ok(tiny.decode(want).startsWith('<|open|>message role="system" type="tool-declare"<|sep|># Tools'));
});

Deno.test("chat --tools / --tool-results: unreadable or malformed files exit 2 with one line", async () => {
  await using d = await tempDir();
  const bad = `${d.path}/bad.json`;
  await Deno.writeTextFile(bad, '[{"type":"function","function":{"name":"has space"}}]');
  for (const args of [["--tools", `${d.path}/missing.json`], ["--tools", bad], ["--tool-results", `${d.path}/none`]]) {
    const res = await k3(["chat", TINY, ...args], { stdin: "" });
    assert.equal(res.code, 2, res.stderr);
    assert.equal(res.stderr.trim().split("\n").length, 1, res.stderr);
  }
});

Deno.test("chat --tools: a call is shown, its canned result goes back, the turn continues (exact ids)", async () => {
  await using d = await tempDir();
  const tools = `${d.path}/tools.json`, out = `${d.path}/r.json`, results = `${d.path}/results.jsonl`;
  const history = `${d.path}/h.jsonl`;
  await Deno.writeTextFile(tools, JSON.stringify(TOOLS));
  await Deno.writeTextFile(results, '"sunny, 20 C"\n');
  const OPEN = tiny.specialId("<|open|>"), CLOSE = tiny.specialId("<|close|>"), SEP = tiny.specialId("<|sep|>");
  const t = (s: string) => tiny.encode(s);
  const open = (h: string) => [OPEN, ...t(h), SEP], close = (h: string) => [CLOSE, ...t(h), SEP];
  // The model runs every token; the hook picks these ids (a random-weight model never would).
  const call = [
    ...t("Let me look."),
    ...close("response"),
    ...open("tools"),
    ...open('call tool="get_weather" index="1"'),
    ...open('argument key="city" type="string"'),
    ...t("Paris"),
    ...close("argument"),
    ...close("call"),
    ...close("tools"),
    ...close("message"),
  ];
  const answer = [...t("Sunny."), ...close("response"), ...close("message")];
  const res = await k3(
    [
      "chat",
      TINY,
      "--tools",
      tools,
      "--tool-results",
      results,
      "--no-think",
      "--gen",
      "400",
      "--history",
      history,
      "--out",
      out,
    ],
    { stdin: "Weather in Paris?\n", env: { K3_TEST_CHOOSE: [...call, ...answer].join(",") } },
  );
  assert.equal(res.code, 0, res.stderr);
  assert.ok(res.stdout.includes('Let me look.\n[call get_weather {"city":"Paris"}]'), res.stdout);
  assert.ok(res.stdout.includes("Sunny."), res.stdout);
  const turns = JSON.parse(await Deno.readTextFile(out)).turns;
  assert.deepEqual(turns.map((x: { finish_reason: string }) => x.finish_reason), ["tool_calls", "stop"]);
  assert.deepEqual(turns[0].generated_ids, call);
  assert.deepEqual(turns[1].generated_ids, answer);
  // The kept state plus the continuation is exactly the template over the conversation.
  const decl = [{ name: "get_weather", description: "Weather.", parameters: { type: "object", properties: {} } }];
  const convo = [
    { role: "user" as const, content: "Weather in Paris?" },
    {
      role: "assistant" as const,
      content: "Let me look.",
      toolCalls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
    },
    { role: "tool" as const, content: "sunny, 20 C", toolCallId: "x" },
  ];
  const msgs = [convo[0], convo[1], { ...convo[2], toolCallId: undefined }];
  assert.deepEqual(turns[1].prompt_ids, chatPrompt(tiny, msgs, { thinking: false, tools: decl }));
  // The history holds the call and its result.
  const lines = (await Deno.readTextFile(history)).trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(lines.map((l) => l.role), ["user", "assistant", "tool", "assistant"]);
  assert.equal(lines[1].tool_calls[0].name, "get_weather");
  assert.equal(lines[2].tool_call_id, lines[1].tool_calls[0].id);
});
