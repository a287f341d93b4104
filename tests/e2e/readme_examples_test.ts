/**
 * The examples of the README and the docs pages (tests/doc_pages.ts) checked, not only run:
 * every curl and every TypeScript block of "Tools and log probabilities" and "Structured
 * output" (docs/tools.md) against a real `k3 serve` on the bundled models (the SDK snippets
 * type-checked and run as written, through the openai package and the AI SDK, with only the
 * port changed), and every command of the console blocks of "The bundled model" (README)
 * against the output shown. Tool examples go to the random tiny model, structured output to
 * the trained tiny-en, as the page says. Every curl, TypeScript and console block of every
 * page must be in one of these sections, so none is left unchecked.
 * (tests/e2e/readme_commands_test.ts runs the shell lines too, but only for their exit code.)
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { K3Process, ROOT, runCmd, serveTiny, TINY_EN } from "../helpers.ts";
import { EXAMPLE_PAGES, readPage } from "../doc_pages.ts";

const ajv = new Ajv({ strict: false });

/** A fenced block of a page: its page, language, heading, text, and the prose after it. */
interface Block {
  page: string;
  lang: string;
  section: string;
  text: string;
  after: string;
}

function blocks(page: string, text: string): Block[] {
  const out: Block[] = [];
  let section = "", open: Block | undefined, lines: string[] = [];
  for (const raw of text.split("\n")) {
    const fence = raw.match(/^```(\w*)/);
    if (fence) {
      if (open) {
        open.text = lines.join("\n");
        out.push(open);
        open = undefined;
      } else (open = { page, lang: fence[1], section, text: "", after: "" }, lines = []);
      continue;
    }
    if (open) lines.push(raw);
    else {
      if (/^#{1,6} /.test(raw)) section = raw.replace(/^#+ /, "");
      if (out.length > 0 && out[out.length - 1].section === section) out[out.length - 1].after += raw + "\n";
    }
  }
  return out;
}

const all = EXAMPLE_PAGES.flatMap((page) => blocks(page, readPage(page)));
/** The sections whose examples are checked here, each on one page. */
const CHECKED = ["Tools and log probabilities", "Structured output", "The bundled model"];
const tools = all.filter((b) => b.section === CHECKED[0]);
const structured = all.filter((b) => b.section === CHECKED[1]);

/** A block this file checks the result of: a curl, a TypeScript snippet, a console transcript. */
const isChecked = (b: Block) =>
  (b.lang === "sh" && b.text.startsWith("curl")) || b.lang === "ts" || b.lang === "console";

Deno.test("README examples: every page has blocks, each checked section is on one page, no checkable block outside them", () => {
  for (const page of EXAMPLE_PAGES) assert.ok(all.some((b) => b.page === page), `${page}: no block found`);
  for (const section of CHECKED) {
    const pages = new Set(all.filter((b) => b.section === section).map((b) => b.page));
    assert.equal(pages.size, 1, `"${section}" is on one page: ${[...pages].join(", ")}`);
  }
  const unchecked = all.filter((b) => isChecked(b) && !CHECKED.includes(b.section));
  assert.deepEqual(unchecked.map((b) => `${b.page}, ${b.section}: ${b.text.slice(0, 60)}`), []);
});

/** The JSON body of a curl line (`-d '...'`). */
function curlBody(cmd: string): Record<string, unknown> {
  const m = cmd.match(/-d '([\s\S]*)'\s*$/);
  assert.ok(m, `a curl with a -d body: ${cmd.slice(0, 80)}`);
  return JSON.parse(m[1]);
}

/** Runs a README line or script with `port` for 8000. */
function onPort(text: string, port: string): string {
  return text.replace(/(127\.0\.0\.1|localhost):8000/g, `127.0.0.1:${port}`);
}

type Choice = {
  finish_reason: string;
  message: { content: string | null; tool_calls?: { id: string; function: { name: string; arguments: string } }[] };
  logprobs: { content: { token: string; logprob: number; bytes: number[]; top_logprobs: unknown[] }[] } | null;
};

/** Checks one curl example's reply by what its body asks for; returns the reply. */
function checkReply(body: Record<string, unknown>, reply: { choices: Choice[]; usage: { completion_tokens: number } }) {
  assert.ok(reply.choices?.length === 1, JSON.stringify(reply));
  const c = reply.choices[0];
  const choice = body.tool_choice as { function?: { name: string } } | string | undefined;
  if (choice === "required" || typeof choice === "object") {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
    assert.equal(c.message.tool_calls!.length, 1);
    const call = c.message.tool_calls![0];
    const declared = (body.tools as { function: { name: string; parameters: object } }[]).map((t) => t.function);
    const tool = declared.find((t) => t.name === call.function.name);
    assert.ok(tool, call.function.name);
    if (typeof choice === "object") assert.equal(call.function.name, choice.function!.name);
    assert.ok(ajv.validate(tool.parameters, JSON.parse(call.function.arguments)), call.function.arguments);
  }
  if (body.logprobs) {
    const entries = c.logprobs!.content;
    assert.ok(entries.length >= 1, "logprobs for the reply's tokens");
    for (const e of entries) {
      assert.ok(e.logprob <= 0 && Array.isArray(e.bytes) && typeof e.token === "string", JSON.stringify(e));
      assert.equal(e.top_logprobs.length, body.top_logprobs);
    }
  }
  const format = body.response_format as { type: string; json_schema?: { schema: object } } | undefined;
  if (format) {
    assert.equal(c.finish_reason, "stop", "the example's max_tokens lets the reply finish");
    const value = JSON.parse(c.message.content!);
    assert.ok(ajv.validate(format.json_schema?.schema ?? { type: "object" }, value), c.message.content!);
  }
  return reply;
}

/** Type-checks and runs a TypeScript block as a script of this checkout (so `openai` and `ai` resolve); its stdout. */
async function runSnippet(code: string, port: string): Promise<string> {
  await Deno.mkdir(`${ROOT}/tmp`, { recursive: true });
  const dir = await Deno.makeTempDir({ dir: `${ROOT}/tmp`, prefix: "readme-" });
  try {
    await Deno.writeTextFile(`${dir}/snippet.ts`, onPort(code, port));
    // As written, it type-checks against the packages' own types (the README is copied from).
    const checked = await runCmd(Deno.execPath(), ["check", "--quiet", `${dir}/snippet.ts`]);
    assert.equal(checked.code, 0, `${code}\n${checked.stderr}`);
    const r = await runCmd(Deno.execPath(), [
      "run",
      "--quiet",
      "--allow-net=127.0.0.1",
      "--allow-read",
      "--allow-env",
      `${dir}/snippet.ts`,
    ]);
    assert.equal(r.code, 0, `${code}\n${r.stderr}`);
    return r.stdout;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("README examples: the tools/logprobs section's curls and SDK snippets round-trip on a real k3 serve (tiny)", {
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const curls = tools.filter((b) => b.lang === "sh" && b.text.startsWith("curl"));
  const ts = tools.filter((b) => b.lang === "ts");
  assert.equal(curls.length, 2, "the auto/logprobs and the forced-call curls");
  assert.equal(ts.length, 2, "the openai SDK loop and the AI SDK");
  const server = await serveTiny(["--parallel", "2"]);
  try {
    const port = new URL(server.url).port;
    let forced = 0;
    for (const b of curls) {
      const body = curlBody(b.text);
      const r = await runCmd("sh", ["-c", onPort(b.text, port)]);
      assert.equal(r.code, 0, r.stderr);
      checkReply(body, JSON.parse(r.stdout));
      if (typeof body.tool_choice === "object") forced++;
    }
    assert.equal(forced, 1);
    // The openai SDK's two-step loop prints the forced call and the answer's finish reason.
    const loop = (await runSnippet(ts[0].text, port)).trim().match(/^get_weather (\{.*\}) (stop|length)$/s);
    assert.ok(loop, "a call of get_weather, then an answer");
    const args = JSON.parse(loop[1]);
    assert.ok(typeof args.city === "string" && [...args.city].length <= 20 && Object.keys(args).length === 1, loop[1]);
    // The AI SDK's generateText with tools: steps taken and the text.
    const sdk = (await runSnippet(ts[1].text, port)).trim().match(/^(\d+) (".*")$/s);
    assert.ok(sdk && Number(sdk[1]) >= 1, "generateText answered");
    assert.equal(typeof JSON.parse(sdk[2]), "string");
  } finally {
    await server.stop();
  }
});

Deno.test(
  "README examples: structured output's curl and SDK snippet on tiny-en, and the quoted reply is the real one",
  {
    sanitizeOps: false,
    sanitizeResources: false,
  },
  async () => {
    const curls = structured.filter((b) => b.lang === "sh" && b.text.startsWith("curl"));
    const ts = structured.filter((b) => b.lang === "ts");
    assert.equal(curls.length, 1);
    assert.equal(ts.length, 1);
    const server = new K3Process(["serve", TINY_EN, "--port", "0"]);
    try {
      const port = (await server.waitFor(/k3: ready: http:\/\/127\.0\.0\.1:(\d+)\/v1/))[1];
      const body = curlBody(curls[0].text);
      const r = await runCmd("sh", ["-c", onPort(curls[0].text, port)]);
      assert.equal(r.code, 0, r.stderr);
      const reply = checkReply(body, JSON.parse(r.stdout));
      // The prose after the block quotes the parsed reply and its length in tokens.
      const quoted = curls[0].after.match(/Parsed, it is\s+`(\{[^`]*\})`/);
      assert.ok(quoted, "the README quotes the parsed reply");
      assert.equal(JSON.stringify(JSON.parse(reply.choices[0].message.content!)), quoted[1]);
      const tokens = curls[0].after.match(/\((\d+) tokens/);
      assert.equal(reply.usage.completion_tokens, Number(tokens?.[1]));
      // The SDK snippet asks the same greedily: the same value.
      assert.equal((await runSnippet(ts[0].text, port)).trim(), quoted[1]);
    } finally {
      server.child.kill("SIGTERM");
      await server.exit();
    }
  },
);

/** A console block's commands (`$ ...` lines) with the output shown after each. */
function transcript(text: string): { cmd: string; output: string }[] {
  const out: { cmd: string; output: string }[] = [];
  for (const line of text.split("\n")) {
    if (line.startsWith("$ ")) out.push({ cmd: line.slice(2), output: "" });
    else {
      assert.ok(out.length > 0, `a console block starts with a command: ${line}`);
      out[out.length - 1].output += line + "\n";
    }
  }
  return out;
}

Deno.test("README examples: every command shown in 'The bundled model' writes the output shown", async () => {
  const shown = all.filter((b) => b.section === CHECKED[2] && b.lang === "console");
  assert.equal(shown.length, 2, "the plain and sampled runs, and the constrained one");
  const commands = shown.flatMap((b) => transcript(b.text));
  assert.equal(commands.length, 4);
  let constrained = 0;
  for (const { cmd, output } of commands) {
    const r = await runCmd("sh", ["-c", cmd], { cwd: ROOT });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), output.trim(), cmd);
    if (!/--json-schema/.test(cmd)) continue;
    // And the constrained one is JSON the schema allows.
    const schema = JSON.parse(await Deno.readTextFile(`${ROOT}/tests/fixtures/person.schema.json`));
    assert.ok(ajv.validate(schema, JSON.parse(r.stdout.replace(/\[EOS\]\s*$/, ""))), r.stdout);
    constrained++;
  }
  assert.equal(constrained, 1);
});
