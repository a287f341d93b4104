/**
 * Structured output for the commands: the grammar a request asks for (`response_format`,
 * a forced `tool_choice`, `k3 run --grammar json` / `--json-schema FILE`), and the
 * per-sequence constraint the scheduler applies (engine/generate/grammar/).
 *
 * @module
 */

import type { GNode } from "../engine/generate/grammar/automaton.ts";
import { type GrammarSpec, type ReplyChannel, startState } from "../engine/generate/grammar/forms.ts";
import { TokenConstraint, tokenSymbols } from "../engine/generate/grammar/mask.ts";
import { ANY_JSON, compileSchema, compileToolParameters, SchemaError } from "../engine/generate/grammar/schema.ts";
import { EXIT, usageError } from "../engine/errors.ts";
import { readInputJson } from "../engine/native/files.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { ApiError, type ChatRequest, offeredTools, schemaApiError } from "./openai.ts";
import type { FlagGroup } from "./flags.ts";
import type { TokenFilter } from "../engine/generate/scheduler.ts";
import { ReasoningBudget } from "../engine/generate/reasoning_budget.ts";

/**
 * The grammar of a validated chat request: a forced tool call when `tool_choice` is
 * "required" or names a function, else its `response_format`; undefined when neither
 * constrains the reply. Throws ApiError (400) for a named tool that is not declared or a
 * parameters schema outside the subset.
 */
export function chatGrammar(r: ChatRequest): GrammarSpec | undefined {
  const reply: ReplyChannel = r.thinking ? "think" : "response";
  const choice = r.toolChoice;
  if (choice === "required" || (typeof choice === "object" && choice !== null)) {
    // The request's tools and those declared mid-conversation.
    const offered = offeredTools(r);
    const named = typeof choice === "object" ? choice.name : undefined;
    if (offered.length === 0) {
      throw new ApiError(400, "'tool_choice' forces a call but 'tools' is empty", "tool_choice");
    }
    const chosen = named === undefined ? offered : offered.filter((o) => o.tool.name === named);
    if (chosen.length === 0) {
      throw new ApiError(
        400,
        `'tool_choice' names ${JSON.stringify(named)}, which 'tools' does not declare`,
        "tool_choice",
      );
    }
    const tools = chosen.map(({ tool, param }) => {
      try {
        return { name: tool.name, args: compileToolParameters(strictDefaults(tool.parameters)) };
      } catch (e) {
        if (e instanceof SchemaError) throw schemaApiError(e, `${param}.function.parameters`);
        throw e;
      }
    });
    // A named choice is one call of that function; "required" one or more (unless
    // parallel_tool_calls is false).
    return { kind: "tools", tools, parallel: named === undefined && r.parallelToolCalls !== false, reply };
  }
  if (r.responseFormat) return { kind: "value", value: r.responseFormat.value, reply };
  return undefined;
}

/**
 * A tool's parameters schema with OpenAI's strict semantics as the default: an object
 * schema that declares `properties` and says nothing of `additionalProperties` takes no
 * other keys (at every depth). A schema that allows them says so; one without
 * `properties` stays any object.
 */
export function strictDefaults(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(strictDefaults);
  if (typeof schema !== "object" || schema === null) return schema;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(schema)) {
    // Keywords whose values are schemas (or maps or lists of them); `enum`, `const` and
    // `default` hold data and are kept as given.
    if (k === "properties" || k === "$defs" || k === "definitions") {
      out[k] = typeof v === "object" && v !== null
        ? Object.fromEntries(Object.entries(v).map(([name, sub]) => [name, strictDefaults(sub)]))
        : v;
    } else if (k === "items" || k === "anyOf" || k === "oneOf" || k === "allOf") out[k] = strictDefaults(v);
    else out[k] = v;
  }
  if ("properties" in out && !("additionalProperties" in out)) out.additionalProperties = false;
  return out;
}

/**
 * The constraint of one sequence for `grammar`, over `tokenizer`'s tokens for a model of
 * `vocab` ids, ending on one of `ends` (the task's stop ids). `maskAll`: apply the whole
 * mask at every step (a caller reading the logits as a distribution, e.g. log probabilities).
 */
export function sequenceConstraint(
  grammar: GrammarSpec,
  tokenizer: Tokenizer,
  vocab: number,
  ends: readonly number[],
  maskAll = false,
): TokenConstraint {
  return new TokenConstraint(tokenSymbols(tokenizer, vocab), startState(grammar, tokenizer, ends), maskAll);
}

/**
 * What constrains one sequence of a task (cli/request.ts): its grammar ({@link sequenceConstraint}) and its
 * reasoning budget (engine/generate/reasoning_budget.ts), either, both or neither.
 */
export function taskFilter(
  task: { grammar?: GrammarSpec; reasoningBudget?: number; chat?: { thinking: boolean } },
  tokenizer: Tokenizer,
  vocab: number,
  ends: readonly number[],
  maskAll = false,
): TokenFilter | undefined {
  const grammar = task.grammar && sequenceConstraint(task.grammar, tokenizer, vocab, ends, maskAll);
  if (task.reasoningBudget === undefined || !task.chat?.thinking) return grammar;
  return reasoningBudgetFilter(task.reasoningBudget, tokenizer, grammar);
}

/** A thinking reply's reasoning budget (engine/generate/reasoning_budget.ts), around its grammar if any. */
export function reasoningBudgetFilter(
  budget: number,
  tokenizer: Tokenizer,
  grammar?: TokenConstraint,
): ReasoningBudget {
  const closing = tokenizer.encode("<|close|>think<|sep|><|open|>response<|sep|>", { allowSpecial: true });
  return new ReasoningBudget(budget, closing, tokenizer.specialId("<|close|>"), grammar);
}

/** The flags of `k3 run` that constrain its output. */
export const STRUCTURED_GROUP: FlagGroup = {
  name: "structured output",
  title: "structured output (the text is the value, then an end id: --stop-id, default [EOS])",
  flags: {
    grammar: { type: "string", value: "json", help: "the output is one JSON value (any)" },
    "json-schema": {
      type: "string",
      value: "F",
      file: "input",
      help: "the output is a JSON value the schema in file F allows (the README's\n" +
        '"Structured output" lists the subset; anything else is refused)',
    },
  },
};

/**
 * The grammar of `k3 run`'s flags: `--grammar json` (any JSON value) or `--json-schema
 * FILE` (a schema of the subset); undefined without either. A usage error (exit 2) for an
 * unknown grammar, an unreadable file, or a schema outside the subset.
 */
export function runGrammar(values: Record<string, unknown>): GrammarSpec | undefined {
  const name = values.grammar as string | undefined, file = values["json-schema"] as string | undefined;
  if (name !== undefined && file !== undefined) throw usageError("--grammar and --json-schema: give one");
  let value: GNode;
  if (name !== undefined) {
    if (name !== "json") throw usageError(`--grammar must be json, got ${JSON.stringify(name)}`);
    value = ANY_JSON;
  } else if (file !== undefined) {
    const schema = readInputJson(file, { what: "--json-schema", maxBytes: 1 << 20, exitCode: EXIT.usage });
    try {
      value = compileSchema(schema);
    } catch (e) {
      if (e instanceof SchemaError) throw usageError(`--json-schema ${file}: ${e.message}`);
      throw e;
    }
  } else return undefined;
  return { kind: "value", value };
}
