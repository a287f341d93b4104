/**
 * `k3 chat`'s flags (declared once: the parser and `--help` both come from them) and the
 * options they give.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import type { SamplingParams } from "../../engine/generate/sampling.ts";
import { EFFORTS } from "../../engine/text/chat.ts";
import { type CommandFlags, commandFlags, type FlagGroup } from "../flags.ts";
import { intFlag, modelDirArg } from "../common.ts";
import {
  contextFlag,
  contextHelp,
  type ContextRequest,
  MODEL_GROUP,
  type ModelFlags,
  modelFlags,
} from "../flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../flag_groups/memory.ts";
import { samplingGroup, samplingOptions } from "../flag_groups/sampling.ts";
import { TERMINAL_GROUP } from "../flag_groups/terminal.ts";
import { reasoningBudgetOption } from "../flag_groups/reasoning.ts";
import { type OutputMode, outputMode } from "../progress.ts";
import { DEFAULTS, stopStrings } from "../request.ts";

/** The conversation's flags. */
const CONVERSATION_GROUP: FlagGroup = {
  name: "conversation",
  title: "conversation",
  column: 25,
  flags: {
    system: { type: "string", value: "TEXT", help: "a system message to start a new conversation with" },
    history: {
      type: "string",
      value: "FILE.jsonl",
      file: "input",
      help: 'load the conversation (one {"role","content"[,"reasoning"]} per\n' +
        "line; refused, never overwritten, if it does not parse) and save\n" +
        "it atomically after every turn",
    },
    state: {
      type: "string",
      value: "FILE",
      file: "input",
      help: "the conversation's sequence state: continued when it holds the\n" +
        "same messages, saved after every turn (see README: Saved states)",
    },
    "no-think": { type: "boolean", help: "reply straight in the response channel" },
    "thinking-effort": { type: "string", value: "E", help: EFFORTS.join(", ") },
    "reasoning-budget": {
      type: "string",
      value: "N",
      help: "close a reply's think channel after N tokens (forced markup,\n" +
        "then the response); default: none",
    },
    "hide-think": { type: "boolean", help: "do not show the think channel (also on a terminal)" },
    "show-think": { type: "boolean", help: "show it when stdout is not a terminal, between marker lines" },
    "input-history": {
      type: "string",
      value: "FILE",
      file: "input",
      help: 'the line editor\'s history (default ~/.k3/chat_history; "" keeps\n' +
        "none); one JSON string per message sent",
    },
    gen: { type: "string", short: "n", value: "N", help: "tokens per reply at most (default 1024)" },
    context: { type: "string", value: "N|auto", help: contextHelp("positions the conversation may hold") },
    stop: { type: "string", multiple: true, value: "TEXT", help: "also end a reply at TEXT (repeatable)" },
    tools: {
      type: "string",
      value: "FILE.json",
      file: "input",
      help: 'function tools the model may call (OpenAI\'s "tools" array); a\n' +
        'call is shown as "[call NAME ARGS]" and its result read from stdin\n' +
        "(one line), then the turn continues",
    },
    "tool-results": {
      type: "string",
      value: "FILE",
      file: "input",
      help: "canned tool results instead of stdin: one JSON string (or any\n" +
        "JSON, as its text) per line, used in order",
    },
    reprefill: {
      type: "boolean",
      help: "diagnostic: forget the state after each turn and prefill the whole\n" +
        "conversation again (what the state saves)",
    },
    out: {
      type: "string",
      value: "FILE",
      file: "output",
      help: "a JSON report of every turn (ids, timings), rewritten after each",
    },
  },
};

/** `k3 chat`'s flags and help. */
export const CHAT_FLAGS: CommandFlags = commandFlags({
  name: "chat",
  head: `usage: k3 chat <model_dir> [options]

A conversation in Kimi K3's chat format. Each line read from stdin is a user message
(a line starting with """ takes every line up to one ending with """; a line ending with a
backslash continues on the next); the reply streams to stdout.

On a terminal: a line editor (left/right, Home/End, Ctrl-A/E, Ctrl-K/U/W, up/down through
the inputs of earlier sessions, kept in --input-history), "thinking..." until the reply
starts, its think channel dimmed. Ctrl-C stops the current reply and keeps what was said;
at the prompt it clears the line; Ctrl-D (or /exit) ends the chat.
From a pipe: the think channel is left out of stdout unless --show-think, which marks it
with "Thinking..." and "...done thinking." lines (as ollama run); Ctrl-C exits (130).
Commands: /help, /reset (start over), /save FILE (the history as JSONL, and the state as
FILE.k3state with --state), /exit.`,
  groups: [
    CONVERSATION_GROUP,
    samplingGroup(
      "default: temperature 1.0, top-p 0.95, the vendor's guidance",
      "a fresh one per session, printed at the start",
    ),
    MODEL_GROUP,
    MEMORY_GROUP,
    TERMINAL_GROUP,
  ],
  tail: `examples:
  k3 chat tests/fixtures/tiny
  k3 chat tests/fixtures/tiny --system "Be brief." --history talk.jsonl --state talk.k3state
  printf 'Hello\nAnd then?\n' | k3 chat tests/fixtures/tiny --temperature 0 --gen 16 --show-think`,
});

/** Everything `k3 chat`'s flags asked for. */
export interface ChatOptions {
  /** The model directory. */
  dir: string;
  /** What stdout and stderr show. */
  mode: OutputMode;
  /** Open the think channel (false: --no-think). */
  thinking: boolean;
  /** --thinking-effort. */
  effort?: string;
  /** --reasoning-budget: think-channel tokens per reply at most (undefined: no budget). */
  reasoningBudget?: number;
  /** Tokens per reply at most. */
  gen: number;
  /** Positions the conversation may hold, or auto (cli/chat/main.ts opens with the plan's). */
  context: ContextRequest;
  /** Sampling. */
  sampling: SamplingParams;
  /** Stop strings. */
  stops: string[];
  /** --system. */
  system?: string;
  /** --history. */
  history?: string;
  /** --state. */
  state?: string;
  /** --hide-think. */
  hideThink: boolean;
  /** --show-think. */
  showThink: boolean;
  /** --input-history. */
  inputHistory?: string;
  /** --tools. */
  tools?: string;
  /** --tool-results. */
  toolResults?: string;
  /** --reprefill. */
  reprefill: boolean;
  /** --out. */
  out?: string;
  /** The model group. */
  model: ModelFlags;
  /** The memory budget. */
  memory: MemoryOptions;
}

/** Parses `k3 chat`'s arguments; undefined after printing `--help`. */
export function chatOptions(args: string[]): ChatOptions | undefined {
  const flags = CHAT_FLAGS.parseUnlessHelp(args);
  if (flags === undefined) return undefined;
  const { values, positionals, tokens } = flags;
  const dir = modelDirArg("chat", positionals, "--system");
  const mode = outputMode(values as { quiet?: boolean; verbose?: boolean; color?: string });
  const effort = flags.str("thinking-effort");
  if (effort !== undefined && !(EFFORTS as readonly string[]).includes(effort)) {
    throw usageError(`--thinking-effort must be one of ${EFFORTS.join(", ")}, not ${effort}`);
  }
  const gen = intFlag("gen", flags.str("gen"), DEFAULTS.chat.maxTokens, 1, 1 << 20);
  const context = contextFlag(flags.str("context"), 16);
  const model = modelFlags(values);
  return {
    dir,
    mode,
    thinking: !flags.bool("no-think"),
    effort,
    reasoningBudget: reasoningBudgetOption(flags.str("reasoning-budget")),
    gen,
    context,
    // A fresh seed per session (printed, so a reply can be repeated with --seed).
    sampling: samplingOptions(values, { ...DEFAULTS.chat.sampling, seed: freshSeed() }),
    stops: stopStrings(flags.list("stop")),
    system: flags.str("system"),
    history: flags.str("history"),
    state: flags.str("state"),
    hideThink: flags.bool("hide-think"),
    showThink: flags.bool("show-think"),
    inputHistory: flags.str("input-history"),
    tools: flags.str("tools"),
    toolResults: flags.str("tool-results"),
    reprefill: flags.bool("reprefill"),
    out: flags.str("out"),
    model,
    memory: memoryOptions(tokens),
  };
}

/** A random seed for a chat session without --seed (32 bits, as the generator is seeded). */
export function freshSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}
