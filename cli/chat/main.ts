/**
 * `k3 chat <model_dir>`: a conversation in K3's chat format (XTML), one reply streamed per
 * line of input. The sequence state is kept between turns, so a turn prefills only its own
 * tokens (the markup closing the previous reply, the user message, the generation prompt),
 * never the conversation again.
 *
 * Lines come from stdin, a terminal or not (so a conversation can be scripted and tested).
 * The history (`--history`) is saved atomically after every turn; the state (`--state`)
 * too, with the messages it represents, so a later session continues where this one ended
 * without prefilling anything.
 *
 * Its phases: options (cli/chat/options.ts), prepare (the conversation, cli/chat/conversation.ts),
 * run (the REPL loop, cli/chat/repl.ts, and its turns, cli/chat/turn.ts), report.
 *
 * @module
 */

import { EXIT, usageError } from "../../engine/errors.ts";
import { testHook } from "../../engine/native/test_hooks.ts";
import { Scheduler } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { type ModelFingerprint, modelFingerprint } from "../../engine/generate/state_file.ts";
import { type ModelConfig, type OpenedModel, readModelConfig } from "../../engine/open.ts";
import { stopIds, type ToolDecl } from "../../engine/text/chat.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { fmtBytes, peakRssBytes, plural } from "../common.ts";
import { info, progress } from "../progress.ts";
import { needTokenizer } from "../run_options.ts";
import { withOpenModel } from "../model_session.ts";
import { contextOpenOptions } from "../flag_groups/model.ts";
import type { Interrupts } from "../interrupt.ts";
import { type ChatOptions, chatOptions } from "./options.ts";
import { continueSavedState, Conversation, readHistory } from "./conversation.ts";
import { readToolResults, readTools } from "./tools.ts";
import { repl } from "./repl.ts";
import type { ChatSession } from "./turn.ts";

/** What the chat needs before the model opens. */
interface PreparedChat {
  /** The model's config. */
  config: ModelConfig;
  /** The tokenizer (it has the chat template's tokens). */
  tok: Tokenizer;
  /** The chat template's end ids. */
  ends: number[];
  /** The conversation from --history and --system. */
  conv: Conversation;
  /** --tools. */
  tools?: ToolDecl[];
  /** --tool-results. */
  canned?: string[];
}

/** Reads the tool files, the config, the tokenizer and the history. */
async function prepareChat(o: ChatOptions): Promise<PreparedChat> {
  const tools = o.tools === undefined ? undefined : readTools(o.tools);
  const canned = o.toolResults === undefined ? undefined : readToolResults(o.toolResults);
  const config = await readModelConfig(o.dir, o.model.layers);
  const tok = needTokenizer(o.dir, o.model.tokDir, "chat", config.cfg.vocabSize);
  // Before the model opens: a tokenizer without the chat template's tokens is refused now.
  const ends = stopIds(tok);
  const conv = new Conversation();
  if (o.history !== undefined) conv.messages = readHistory(o.history) ?? [];
  if (o.system !== undefined) {
    if (conv.messages.length > 0) {
      throw usageError(`--system: ${o.history} already holds a conversation; edit its first line instead`);
    }
    conv.messages.push({ role: "system", content: o.system });
  }
  return { config, tok, ends, conv, tools, canned };
}

/** The session on the open model: the scheduler, the sampler, the terminal. */
function startSession(opened: OpenedModel, interrupts: Interrupts, o: ChatOptions, p: PreparedChat): ChatSession {
  const sample = makeSampler(o.sampling);
  // Tests script a reply (a tool call from a random-weight model) through this hook.
  const scripted = (testHook("K3_TEST_CHOOSE") ?? "").split(",").filter((x) => x !== "").map(Number);
  const tty = Deno.stdout.isTerminal();
  let fp: ModelFingerprint | undefined;
  return {
    o,
    context: opened.plan.state.positions,
    conv: p.conv,
    files: {
      model: opened.model,
      fingerprint: async () => (fp ??= await modelFingerprint(opened)),
      thinking: o.thinking,
      vocab: p.config.cfg.vocabSize,
    },
    scheduler: new Scheduler(opened.model, { chunk: opened.plan.chunk }),
    tok: p.tok,
    ends: p.ends,
    sampler: (logits) => scripted.length > 0 ? scripted.shift()! : sample(logits),
    tools: p.tools,
    canned: p.canned,
    interrupts,
    tty,
    interactive: tty && Deno.stdin.isTerminal(),
    // The think channel: dimmed with colour; otherwise between marker lines, as ollama
    // run does; off a terminal only when asked for.
    hideThink: o.hideThink || (!tty && !o.showThink),
    turns: [],
  };
}

/** Continues a saved state (if it holds exactly these messages) and says what the chat holds. */
async function beginConversation(s: ChatSession, p: PreparedChat): Promise<void> {
  const { o } = s;
  if (o.state !== undefined) {
    await continueSavedState(s.conv, s.files, o.state, o.history === undefined && o.system === undefined);
  }
  const count = s.conv.messages.length;
  info(
    `k3: chat: ${o.dir}: ${p.config.cfg.numLayers} layers, context ${s.context} positions; ${count} ${
      plural(count, "message")
    }; ` +
      `sampling temperature ${o.sampling.temperature}, top-p ${o.sampling.topP}, seed ${o.sampling.seed}. ` +
      (s.interactive ? "/help for commands, Ctrl-D to end." : "/exit to end."),
  );
}

/** The chat's last line: turns and peak memory. */
function reportChat(s: ChatSession): void {
  info(`k3: chat: ${s.turns.length} ${plural(s.turns.length, "turn")}; PEAK RSS ${fmtBytes(peakRssBytes())}`);
}

/** Runs `k3 chat`; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const o = chatOptions(args);
  if (!o) return EXIT.ok;
  const prepared = await prepareChat(o);
  const openOptions = {
    ...contextOpenOptions(o.context, prepared.config.cfg, 1),
    chunk: o.model.chunk,
    threads: o.model.threads,
    memory: o.memory,
    log: (line: string) => info(`k3: ${line}`),
    onProgress: (what: string, d: number, n: number) => progress(what, d, n),
  };
  return await withOpenModel(prepared.config, openOptions, async (opened, interrupts) => {
    const s = startSession(opened, interrupts, o, prepared);
    try {
      await beginConversation(s, prepared);
      await repl(s);
      reportChat(s);
      return EXIT.ok;
    } finally {
      s.conv.forget(); // before the model closes
    }
  });
}
