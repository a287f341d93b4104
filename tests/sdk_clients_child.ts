/**
 * Child of tests/e2e/langchain_agents_test.ts: LangChain.js or the OpenAI Agents SDK for
 * JS against the `k3 serve` at the URL given, as their users write them, printing one JSON
 * array of {@link SdkResult} (the schemas as the SDK sent them) for the parent to validate.
 *
 * - `langchain`: `withStructuredOutput` with a zod schema, by its default method
 *   (response_format) and by function calling, at temperature 0 and seeded at 1.
 * - `agents`: Agents with a zod `outputType` on the chat completions and the responses
 *   model (temperature 0 and seeded at 1), then a tool-using Agent (the tool forced once)
 *   on each.
 *
 * Both read what the test permissions do not grant (the Agents SDK every environment
 * variable as it loads, LangChain's tracing client the home directory), so they run here:
 *
 *   deno run --allow-env --allow-sys=homedir --allow-read --allow-net=127.0.0.1 \
 *     tests/sdk_clients_child.ts <url> langchain|agents
 *
 * @module
 */

import { z } from "zod";
import OpenAI from "openai";
import { ChatOpenAI } from "@langchain/openai";
import {
  Agent,
  type Model,
  OpenAIChatCompletionsModel,
  OpenAIResponsesModel,
  Runner,
  setTracingDisabled,
  tool,
} from "@openai/agents";
import { Contact, StrictContact } from "./client_schemas.ts";

/** One run: what it was, the output schema sent, the object the SDK handed back; an agent's
 * tool's schema and calls; or the error it ended with, and the server's last answer. */
export interface SdkResult {
  what: string;
  schema?: Record<string, unknown>;
  output?: unknown;
  tool?: { schema: Record<string, unknown>; calls: unknown[] };
  error?: string;
  lastAnswer?: string;
}

type Json = Record<string, unknown>;

/** The parameters of the tool named `name` in a request (chat or responses tool shape). */
function toolSchema(body: Json, name: string): Json {
  const tools = (body.tools ?? []) as {
    name?: string;
    parameters?: Json;
    function?: { name: string; parameters: Json };
  }[];
  const t = tools.find((t) => (t.function?.name ?? t.name) === name);
  if (!t) throw new Error(`no tool ${name} in ${JSON.stringify(body).slice(0, 300)}`);
  return (t.function?.parameters ?? t.parameters)!;
}

/** The schema a request constrained its answer with: response_format's (chat), text.format's
 * (responses), or its forced tool's parameters. */
function outputSchema(body: Json): Json {
  const rf = body.response_format as { json_schema?: { schema: Json } } | undefined;
  const text = body.text as { format?: { schema: Json } } | undefined;
  const forced = (body.tool_choice as { function?: { name: string } } | undefined)?.function?.name;
  const schema = rf?.json_schema?.schema ?? text?.format?.schema ?? (forced ? toolSchema(body, forced) : undefined);
  if (!schema) throw new Error(`no output schema in ${JSON.stringify(body).slice(0, 300)}`);
  return schema;
}

/** Every JSON request body an SDK sent, and the server's last answer. */
class Recorder {
  readonly bodies: Json[] = [];
  lastAnswer = "";
  /** A fetch that records. */
  readonly fetch: typeof fetch = (input, init) => {
    if (typeof init?.body === "string") this.bodies.push(JSON.parse(init.body));
    return fetch(input, init).then(async (r) => (this.lastAnswer = (await r.clone().text()).slice(0, 2000), r));
  };

  /** Runs `fn`: its object and the schema of the last request, or its error and the last answer. */
  async attempt(what: string, fn: () => Promise<unknown>): Promise<SdkResult> {
    try {
      const output = await fn();
      return { what, schema: outputSchema(this.bodies.at(-1)!), output };
    } catch (e) {
      return { what, error: String(e), lastAnswer: this.lastAnswer };
    }
  }
}

/** LangChain's withStructuredOutput: its default method (response_format) and function calling. */
async function langchain(url: string): Promise<SdkResult[]> {
  const rec = new Recorder();
  const results: SdkResult[] = [];
  for (const method of ["jsonSchema", "functionCalling"] as const) {
    for (const temperature of [0, 1]) {
      const chat = new ChatOpenAI({
        model: "tiny",
        apiKey: "none",
        configuration: { baseURL: `${url}/v1`, fetch: rec.fetch },
        temperature,
        maxTokens: 1500,
        maxRetries: 0,
        // What LangChain has no field for goes into the body as is: thinking off (the tiny
        // model thinks without end), and a seed so the sampled run repeats.
        modelKwargs: { chat_template_kwargs: { thinking: false }, seed: 11 },
      });
      // jsonSchema is LangChain's default for a model name it does not know: not passed.
      const structured = chat.withStructuredOutput(Contact, {
        name: "contact",
        ...(method === "jsonSchema" ? {} : { method }),
      });
      results.push(
        await rec.attempt(`${method} at temperature ${temperature}`, () => structured.invoke("A contact, please.")),
      );
    }
  }
  return results;
}

/** Agents with an outputType on both models, then a tool-using agent on each. */
async function agents(url: string): Promise<SdkResult[]> {
  setTracingDisabled(true);
  const rec = new Recorder();
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0, fetch: rec.fetch });
  // The SDK brings its own openai 7; openai-node 6's client has the surface it calls.
  const sdkClient = client as unknown as ConstructorParameters<typeof OpenAIChatCompletionsModel>[0];
  const models: [string, Model][] = [
    ["chat", new OpenAIChatCompletionsModel(sdkClient, "tiny")],
    ["responses", new OpenAIResponsesModel(sdkClient, "tiny")],
  ];
  // The tiny model thinks without end: thinking off, as OpenAI's reasoning effort says it;
  // sampled runs seeded (the SDK passes providerData into the body), so they repeat.
  const settings = { maxTokens: 1500, reasoning: { effort: "none" as const }, providerData: { seed: 11 } };
  const runner = new Runner();
  const results: SdkResult[] = [];
  for (const [api, model] of models) {
    for (const temperature of [0, 1]) {
      const agent = new Agent({
        name: "contacts",
        instructions: "Answer with a contact.",
        model,
        outputType: StrictContact,
        modelSettings: { ...settings, temperature },
      });
      results.push(
        await rec.attempt(
          `${api} at temperature ${temperature}`,
          async () => (await runner.run(agent, "A contact, please.")).finalOutput,
        ),
      );
    }
  }
  const calls: unknown[] = [];
  const lookup = tool({
    name: "lookup_contact",
    description: "Looks a contact up by code.",
    parameters: z.object({ code: z.string().regex(/^[A-Z]{2}-\d{3}$/), limit: z.number().int().min(1).max(5) }),
    execute: (args) => {
      calls.push(args);
      return "Ada, ada@example.com, code AB-123.";
    },
  });
  for (const [api, model] of models) {
    calls.length = 0;
    const first = rec.bodies.length;
    const agent = new Agent({
      name: "lookup",
      instructions: "Look the contact up, then answer with it.",
      model,
      tools: [lookup],
      outputType: StrictContact,
      // The tool is forced on the first turn only (resetToolChoice), then the agent answers.
      modelSettings: { ...settings, toolChoice: "lookup_contact", temperature: 0 },
      resetToolChoice: true,
    });
    const result = await rec.attempt(
      `${api} after the tool`,
      async () => (await runner.run(agent, "Find contact AB-123.", { maxTurns: 4 })).finalOutput,
    );
    const sent = rec.bodies[first];
    results.push({ ...result, tool: { schema: sent ? toolSchema(sent, "lookup_contact") : {}, calls: [...calls] } });
  }
  return results;
}

if (import.meta.main) {
  const [url, sdk] = Deno.args;
  console.log(JSON.stringify(await (sdk === "langchain" ? langchain(url) : agents(url))));
}
