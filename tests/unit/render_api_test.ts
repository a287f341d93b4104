/**
 * The render API: `k3 serve`'s POST /tokenize and /detokenize (vLLM's shapes) and
 * /apply-template (llama-server's) answer from the tokenizer alone, behind the API key,
 * with the same prompt a chat completion renders; `k3 tokenize --chat` prints those ids.
 */

import assert from "node:assert/strict";
import { TINY } from "../helpers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { type ServeEngine, startServer } from "../../cli/server/http.ts";
import { main as tokenizeMain } from "../../cli/tokenize.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { openaiTask } from "../../cli/request.ts";
import { K3Error } from "../../engine/errors.ts";

const KEY = "render-key-0123";
const CONTEXT = 512;
const tokenizer = Tokenizer.load(TINY);
const engine: ServeEngine = {
  scheduler: {
    queued: 0,
    active: 0,
    submit: () => Promise.reject(new Error("the render API must not run the model")),
  },
  tokenizer,
  capacity: CONTEXT,
  vocabSize: 1024,
  bytesRead: () => 0,
};

const CHAT = {
  messages: [{ role: "user", content: "Weather in Paris?" }],
  tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object" } } }],
  tool_choice: "required",
  reasoning_effort: "low",
};

async function withServer(
  f: (post: (path: string, body: unknown, key?: string) => Promise<Response>) => Promise<void>,
) {
  const server = startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: "tiny",
    apiKey: KEY,
    parallel: 1,
    maxQueue: 1,
    maxBodyBytes: 1 << 20,
    log: () => {},
    fingerprint: "fp_test",
  });
  server.ready(engine);
  const post = (path: string, body: unknown, key = KEY) =>
    fetch(`http://127.0.0.1:${server.addr.port}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  try {
    await f(post);
  } finally {
    await server.shutdown(0);
  }
}

Deno.test("render API: /tokenize, /detokenize and /apply-template give the chat completion's prompt", async () => {
  const prompt = openaiTask(parseChatRequest(CHAT), { tokenizer, seed: 0, capacity: CONTEXT }).promptIds;
  await withServer(async (post) => {
    const tokenized = await (await post("/tokenize", CHAT)).json();
    assert.deepEqual(tokenized, { count: prompt.length, max_model_len: CONTEXT, tokens: prompt, token_strs: null });

    const text = tokenizer.decode(prompt);
    assert.ok(text.includes("`thinking_effort=low`") && text.includes("`tool_choice=required`"));
    assert.deepEqual(await (await post("/apply-template", CHAT)).json(), { prompt: text });
    assert.deepEqual(await (await post("/detokenize", { tokens: prompt })).json(), { prompt: text });

    // add_generation_prompt false: the prompt without the assistant's opening.
    const bare = await (await post("/tokenize", { ...CHAT, add_generation_prompt: false })).json();
    assert.ok(bare.count < prompt.length);
    assert.deepEqual(bare.tokens, prompt.slice(0, bare.count));
    assert.ok(!tokenizer.decode(prompt.slice(bare.count)).includes("tool_choice"));

    // A text prompt is encoded as /v1/completions encodes it (special tokens as bytes).
    const plain = await (await post("/tokenize", { prompt: "a <|open|> b" })).json();
    assert.deepEqual(plain.tokens, tokenizer.encode("a <|open|> b", { allowSpecial: false }));

    // Bad input: a 400 naming the field; no key: a 401.
    const badId = await post("/detokenize", { tokens: [1, 99999] });
    assert.equal(badId.status, 400);
    assert.equal((await badId.json()).error.param, "tokens[1]");
    const badChat = await post("/apply-template", { messages: [] });
    assert.equal(badChat.status, 400);
    await badChat.body?.cancel();
    const noKey = await post("/tokenize", CHAT, "wrong");
    assert.equal(noKey.status, 401);
    await noKey.body?.cancel();
  });
});

Deno.test("render API: k3 tokenize --chat prints the prompt ids; a bad request is one usage line", async () => {
  const path = await Deno.makeTempFile({ suffix: ".json" });
  try {
    await Deno.writeTextFile(path, JSON.stringify(CHAT));
    let printed = "";
    await tokenizeMain(["--tok", TINY, "--chat", path, "--json"], { write: (t) => (printed += t) });
    const prompt = openaiTask(parseChatRequest(CHAT), { tokenizer, seed: 0, capacity: CONTEXT }).promptIds;
    assert.deepEqual(JSON.parse(printed), prompt);
    await Deno.writeTextFile(path, JSON.stringify({ messages: [{ role: "user" }] }));
    assert.throws(
      () => tokenizeMain(["--tok", TINY, "--chat", path], { write: () => {} }),
      (e) => e instanceof K3Error && e.exitCode === 2 && /--chat .*messages\[0\]\.content/.test(e.message),
    );
  } finally {
    await Deno.remove(path);
  }
});
