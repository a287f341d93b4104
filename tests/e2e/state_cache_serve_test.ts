/**
 * The state cache through `k3 serve` and the official `openai` client: a six-turn
 * conversation gets, turn by turn, the replies a server without the cache gives, while
 * each turn prefills only its new message (counted from
 * `usage.prompt_tokens_details.cached_tokens` and /metrics), though the client sends back
 * only each reply's content, not the reasoning the model read; conversations running at
 * once never see each other's states; a spill directory with a damaged file is refused and
 * recomputed without changing a reply; two servers sharing a spill directory stay within
 * its budget together, counting a running process's temporary and removing a gone one's.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import OpenAI from "openai";
import { type ChatMessage, chatPrompt, generationPromptIds } from "../../engine/text/chat.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { ROOT, tempDir, TINY } from "../helpers.ts";

/** A `k3 serve` subprocess on the tiny model, ready; `stop` ends it and returns its stderr. */
async function serve(args: string[]) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, "serve", TINY, "--port", "0", "--context", "2048", ...args],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let stderr = "";
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  const ready = /k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/;
  while (!ready.test(stderr)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`k3 serve ended before it was ready: ${stderr}`);
    stderr += value;
  }
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      stderr += value;
    }
  })();
  const url = ready.exec(stderr)![1];
  let stopped = false;
  return {
    url,
    client: new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 }),
    metric: async (name: string) => {
      const text = await (await fetch(`${url}/metrics`)).text();
      const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text);
      return m ? Number(m[1]) : NaN;
    },
    /** Ends the server (again: a no-op) and returns its stderr. */
    stop: async () => {
      if (!stopped) (stopped = true, child.kill("SIGTERM"));
      await child.status;
      await rest;
      return stderr;
    },
  };
}

type Server = Awaited<ReturnType<typeof serve>>;
const tok = Tokenizer.load(TINY);
/** Ids of the generation prompt (what follows the last complete message). */
const GENERATION_PROMPT = generationPromptIds(tok, true).length;

/** One turn: the reply's text, and its usage. */
async function turn(s: Server, messages: ChatMessage[]) {
  const r = await s.client.chat.completions.create({
    model: "tiny",
    messages: messages.map((m) => ({ role: m.role, content: m.content })) as OpenAI.ChatCompletionMessageParam[],
    max_tokens: 6,
    temperature: 0,
  });
  const msg = r.choices[0].message as { content: string | null; reasoning_content?: string | null };
  return {
    reply: { content: msg.content ?? "", reasoning: msg.reasoning_content ?? "" },
    promptTokens: r.usage!.prompt_tokens,
    completionTokens: r.usage!.completion_tokens,
    cached: (r.usage as { prompt_tokens_details?: { cached_tokens: number } }).prompt_tokens_details?.cached_tokens,
  };
}

/** Runs `turns` user messages as one conversation on both servers; checks every turn. */
async function conversation(
  on: Server,
  off: Server,
  system: string,
  users: string[],
  only = false,
): Promise<number> {
  const messages: ChatMessage[] = [{ role: "system", content: system }];
  let prefilled = 0, previous: ChatMessage[] | undefined;
  for (const [i, user] of users.entries()) {
    messages.push({ role: "user", content: user });
    const [a, b] = await Promise.all([turn(on, messages), turn(off, messages)]);
    assert.deepEqual(a.reply, b.reply, `turn ${i + 1}: the same reply with and without the cache`);
    assert.equal(a.completionTokens, b.completionTokens);
    assert.equal(a.promptTokens, b.promptTokens);
    assert.equal(b.cached, 0, "the cache-off server serves nothing from a cache");
    assert.equal(a.promptTokens, chatPrompt(tok, messages).length);
    if (previous) {
      // At least everything up to the previous turn's last complete message was kept.
      const kept = chatPrompt(tok, previous).length - GENERATION_PROMPT;
      assert.ok(a.cached! >= kept, `turn ${i + 1}: ${a.cached} cached, the previous turn kept ${kept}`);
      assert.ok(a.cached! < a.promptTokens);
      if (only) {
        // Alone on its server, the reply as shown (its content, no reasoning) was kept too:
        // only the new user message and the generation prompt are prefilled.
        const shown = chatPrompt(tok, [...previous, messages.at(-2)!]).length - GENERATION_PROMPT;
        assert.equal(a.cached, shown, `turn ${i + 1}: the previous reply, as the client sends it back, was kept`);
      }
    }
    prefilled += a.promptTokens - a.cached!;
    previous = [...messages];
    messages.push({ role: "assistant", content: a.reply.content });
  }
  return prefilled;
}

const USERS = [
  "Hello there, can you help me plan a trip?",
  "I would like to visit the mountains in spring.",
  "What should I pack for cold nights?",
  "How long should the trip be?",
  "Which trails are good for beginners?",
  "Thanks, please summarise the plan.",
];

Deno.test("six turns through the server: the cache-off replies, prefilling only new tokens", async () => {
  const on = await serve([]), off = await serve(["--state-cache-gb", "0"]);
  try {
    const prefilled = await conversation(on, off, "You are a careful travel planner.", USERS, true);
    const all = USERS.map((_, i) => {
      const m: ChatMessage[] = [{ role: "system", content: "You are a careful travel planner." }];
      for (let j = 0; j <= i; j++) m.push({ role: "user", content: USERS[j] }, { role: "assistant", content: "" });
      return m;
    });
    assert.ok(all.length === 6);
    // The counters agree with the responses: every prompt token is prefilled or cached.
    const prompt = await on.metric("k3_prompt_tokens_total");
    assert.equal(await on.metric("k3_cached_prompt_tokens_total"), prompt - prefilled);
    assert.equal(await on.metric("k3_state_cache_hits_total"), 5);
    assert.equal(await on.metric("k3_state_cache_misses_total"), 1);
    assert.ok(prefilled < prompt / 2, `${prefilled} of ${prompt} prompt tokens prefilled`);
    assert.ok(Number.isNaN(await off.metric("k3_state_cache_hits_total")), "no cache, no cache metrics");
  } finally {
    await on.stop();
    await off.stop();
  }
});

Deno.test("conversations at once do not see each other's states", async () => {
  const on = await serve(["--parallel", "4"]), off = await serve(["--state-cache-gb", "0"]);
  try {
    await Promise.all([
      conversation(on, off, "You are a careful travel planner.", USERS.slice(0, 3)),
      conversation(on, off, "You are a terse chef.", ["What is a roux?", "And a béchamel?", "Thanks."]),
      conversation(on, off, "You are a careful travel planner.", ["A different first question.", "And then?"]),
    ]);
  } finally {
    await on.stop();
    await off.stop();
  }
});

Deno.test("a tiny RAM budget spills to disk; a restart reads the spills back; a damaged one is refused", async () => {
  await using dir = await tempDir();
  const spill = ["--state-cache-gb", "0.000001", "--state-cache-dir", dir.path];
  const off = await serve(["--state-cache-gb", "0"]);
  const users = USERS.slice(0, 3);
  let on = await serve(spill);
  try {
    await conversation(on, off, "You are a careful travel planner.", users);
    assert.ok((await on.metric("k3_state_cache_evictions_total")) > 0);
    await on.stop(); // waits for the spills in flight
    assert.ok([...Deno.readDirSync(dir.path)].length > 0);
    // A restarted server has nothing in RAM: its first hit is read back from the spill
    // (no disk rate measured yet, so it reads), and the replies stay the cache-off ones.
    on = await serve(spill);
    await conversation(on, off, "You are a careful travel planner.", users);
    assert.ok((await on.metric("k3_state_cache_disk_hits_total")) >= 1);
    assert.equal(await on.metric("k3_state_cache_refused_total"), 0);
    assert.match(await on.stop(), /kept from before\)[^]*positions on disk .*no disk rate measured yet: reading it/);
    // Damage every spill file: the restarted server refuses what it reads and recomputes
    // (then spills the recomputed states afresh).
    for (const f of Deno.readDirSync(dir.path)) {
      const path = join(dir.path, f.name);
      const bytes = Deno.readFileSync(path);
      bytes[bytes.length - 40] ^= 0xff;
      Deno.writeFileSync(path, bytes);
    }
    on = await serve(spill);
    await conversation(on, off, "You are a careful travel planner.", users);
    assert.ok((await on.metric("k3_state_cache_refused_total")) >= 1);
    assert.match(await on.stop(), /checksum mismatch\); refusing it; recomputing its \d+ positions/);
  } finally {
    await on.stop();
    await off.stop();
  }
});

/** Bytes of every file a spill can leave in `dir` (state files and their temporaries),
 * counted under the directory's lock as the servers count them (no rename midway). */
function spillBytes(dir: string): number {
  using lock = Deno.openSync(dir, { read: true });
  lock.lockSync(true);
  let n = 0;
  for (const f of Deno.readDirSync(dir)) {
    if (f.name.includes(".k3state")) n += Deno.statSync(join(dir, f.name)).size;
  }
  return n;
}

Deno.test("two servers sharing a spill directory stay within its budget; a running process's temporary counts", async () => {
  await using dir = await tempDir();
  // A spill being written by another process (a sleeping one stands in for it), then
  // left behind when it dies.
  const writer = new Deno.Command("sleep", { args: ["600"] }).spawn();
  const planted = join(dir.path, `00.k3state.tmp-${writer.pid}-1700000000000`);
  await Deno.writeFile(planted, new Uint8Array(300_000));
  const budget = 800_000;
  const spill = ["--state-cache-gb", "0.000001", "--state-cache-dir", dir.path];
  const servers = [
    await serve([...spill, "--state-cache-disk-gb", String(budget / 1e9)]),
    await serve([...spill, "--state-cache-disk-gb", String(budget / 1e9)]),
  ];
  /** Waits until no spill of the servers is being written, then counts the directory. */
  const settledBytes = async () => {
    while ([...Deno.readDirSync(dir.path)].some((f) => f.name.includes(".tmp-") && !f.name.startsWith("00."))) {
      await new Promise((r) => setTimeout(r, 20));
    }
    return spillBytes(dir.path);
  };
  const sum = async (name: string) => (await Promise.all(servers.map((s) => s.metric(name)))).reduce((a, b) => a + b);
  try {
    for (let i = 0; i < 6; i++) {
      await Promise.all(servers.map((s, k) =>
        s.client.chat.completions.create({
          model: "tiny",
          messages: [{ role: "system", content: `Server ${k}, round ${i}.` }, { role: "user", content: USERS[i] }],
          max_tokens: 2,
        })
      ));
      const bytes = await settledBytes();
      assert.ok(bytes <= budget, `round ${i}: ${bytes} bytes in the directory, budget ${budget}`);
    }
    assert.ok(Deno.statSync(planted).isFile, "a running process's temporary is left alone");
    for (const s of servers) assert.ok((await s.metric("k3_state_cache_disk_other_bytes")) >= 300_000);
    assert.ok((await sum("k3_state_cache_evictions_total")) > 0);
    assert.equal(await sum("k3_state_cache_orphans_removed_total"), 0);
    // Its process gone, the temporary is removed at the next spill of either server
    // (spills run after their answers, and late ones of the last round may come first; a
    // stopped server has finished its spills).
    writer.kill("SIGKILL");
    await writer.status;
    await servers[0].client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "One more question." }],
      max_tokens: 2,
    });
    const logs = (await Promise.all(servers.map((s) => s.stop()))).join("");
    assert.equal(
      logs.match(/removed \S*00\.k3state\.tmp-\d+-1700000000000 .*, left by process \d+, which is gone/g)?.length,
      1,
    );
    assert.throws(() => Deno.statSync(planted), Deno.errors.NotFound);
  } finally {
    for (const s of servers) await s.stop();
    try {
      writer.kill("SIGKILL");
    } catch { /* already gone */ }
    await writer.status;
  }
});
