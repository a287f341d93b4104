/**
 * One turn of `k3 chat`: the user's message, then for as long as the reply calls tools,
 * their results; each reply streamed (the think channel dimmed or between marker lines),
 * the state kept, the files and the report saved.
 *
 * @module
 */

import type { Scheduler } from "../../engine/generate/scheduler.ts";
import { type ChatMessage, chatPrompt, continuePrompt, type ToolDecl } from "../../engine/text/chat.ts";
import type { ToolCall } from "../../engine/text/xtml.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { peakRssBytes, writeFileAtomic } from "../common.ts";
import { type Interrupts, writeStdout } from "../interrupt.ts";
import type { LineResult } from "../line_editor.ts";
import { info } from "../progress.ts";
import { ReplyStream } from "../reply.ts";
import { reasoningBudgetFilter } from "../structured.ts";
import { reportHead, snakeKeys } from "../report.ts";
import { type Conversation, type ConversationFiles, saveConversation } from "./conversation.ts";
import type { ChatOptions } from "./options.ts";

/** One turn of the report. */
export interface TurnReport {
  /** Every token of the conversation before the reply (what one run over it would see). */
  prompt_ids: number[];
  /** Tokens prefilled this turn. */
  prefilled_tokens: number;
  /** The reply's ids. */
  generated_ids: number[];
  /** Why it ended. */
  finish_reason: string;
  /** The think channel's text. */
  reasoning: string;
  /** The response channel's text. */
  content: string;
  /** Seconds of prefill. */
  prefill_seconds: number;
  /** Seconds of decode. */
  decode_seconds: number;
}

/** What every turn of a chat shares. */
export interface ChatSession {
  /** The flags. */
  o: ChatOptions;
  /** Positions the conversation may hold (the opened plan's: `--context` or auto). */
  context: number;
  /** The conversation. */
  conv: Conversation;
  /** Where it is saved. */
  files: ConversationFiles;
  /** The scheduler on the open model. */
  scheduler: Scheduler;
  /** The tokenizer. */
  tok: Tokenizer;
  /** The chat template's end ids. */
  ends: number[];
  /** Picks the next token. */
  sampler: (logits: Float32Array) => number;
  /** --tools. */
  tools?: ToolDecl[];
  /** --tool-results, consumed in order. */
  canned?: string[];
  /** SIGINT/SIGTERM. */
  interrupts: Interrupts;
  /** Whether stdout is a terminal. */
  tty: boolean;
  /** Whether stdin is one too (the line editor). */
  interactive: boolean;
  /** Leave the think channel out of stdout. */
  hideThink: boolean;
  /** The turns so far. */
  turns: TurnReport[];
}

/** Streams a reply's events to stdout as the user sees them. */
class ReplyView {
  #shown: "think" | "response" | "call" | undefined;
  // "thinking..." until the first text (a terminal only; erased by it).
  #waiting: boolean;

  constructor(readonly color: boolean, readonly hideThink: boolean, tty: boolean) {
    this.#waiting = tty;
    if (tty) writeStdout(color ? "\x1b[2mthinking...\x1b[0m" : "thinking...");
  }

  #unwait(): void {
    if (this.#waiting) writeStdout("\r\x1b[K");
    this.#waiting = false;
  }

  #endThink(): void {
    writeStdout(this.color ? "\x1b[0m\n" : "\n...done thinking.\n\n");
  }

  /** Shows the events of one token. */
  show(events: ReturnType<ReplyStream["token"]>["events"]): void {
    for (const e of events) {
      if (e.type !== "text") {
        this.#unwait();
        if (this.#shown === "think") this.#endThink();
        if (e.type === "call") writeStdout(`${this.#shown === "response" ? "\n" : ""}[call ${e.name} `);
        else writeStdout(e.text);
        this.#shown = "call";
        continue;
      }
      if (e.channel === "think" && this.hideThink) continue;
      if (e.text === "") continue;
      this.#unwait();
      if (this.#shown === "think" && e.channel === "response") this.#endThink();
      if (e.channel === "think" && this.#shown !== "think") writeStdout(this.color ? "\x1b[2m" : "Thinking...\n");
      this.#shown = e.channel;
      writeStdout(e.text);
    }
  }

  /** Ends the reply's output. */
  end(): void {
    this.#unwait();
    if (this.#shown === "think") writeStdout(this.color ? "\x1b[0m" : "\n...done thinking.");
    writeStdout(this.#shown === "call" ? "]\n" : "\n");
  }
}

/** The prompt of a turn: what the kept state lacks, or the whole conversation. */
function turnPrompt(s: ChatSession, incoming: ChatMessage[], calls: ToolCall[]): number[] {
  const { conv, tok, o } = s;
  if (!conv.state) {
    return chatPrompt(tok, [...conv.messages, ...incoming], { thinking: o.thinking, effort: o.effort, tools: s.tools });
  }
  return [
    ...(conv.pending === undefined ? [] : [conv.pending]),
    ...continuePrompt(tok, conv.left, incoming, o.thinking, calls),
  ];
}

/** Writes --out: every turn so far. */
async function writeReport(s: ChatSession): Promise<void> {
  const report = {
    ...reportHead("chat"),
    model_dir: s.o.dir,
    sampling: snakeKeys(s.o.sampling),
    thinking: s.o.thinking,
    turns: s.turns,
    peak_rss_bytes: peakRssBytes(),
  };
  await writeFileAtomic(s.o.out!, JSON.stringify(report, null, 2) + "\n");
}

/** The results of `calls`, in call order: canned, or one line of stdin each; undefined if one is missing. */
async function toolResults(
  s: ChatSession,
  calls: ToolCall[],
  nextLine: (prompt: string) => Promise<LineResult>,
): Promise<ChatMessage[] | undefined> {
  const results: ChatMessage[] = [];
  for (const c of calls) {
    let text: string | undefined = s.canned?.shift();
    if (text === undefined && !s.canned) {
      const got = await nextLine(`result of ${c.name}> `);
      text = got.kind === "line" ? got.text : undefined;
    }
    if (text === undefined) return undefined;
    results.push({ role: "tool", content: text, toolCallId: c.id, name: c.name });
  }
  return results;
}

/** Runs one turn for `user`'s message (and the tool calls that follow). */
export async function takeTurn(
  s: ChatSession,
  user: ChatMessage,
  nextLine: (prompt: string) => Promise<LineResult>,
): Promise<void> {
  const { conv, o } = s;
  let turnIn: ChatMessage[] | undefined = [user];
  let calls: ToolCall[] = [];
  while (turnIn) {
    const incoming: ChatMessage[] = turnIn;
    turnIn = undefined;
    const prompt = turnPrompt(s, incoming, calls);
    const room = s.context - conv.done.length - prompt.length + 1;
    if (room < 1) {
      console.error(
        `k3: chat: the conversation is full (${conv.done.length + prompt.length} of ${s.context} positions); ` +
          `/reset, or start with a larger --context`,
      );
      return;
    }
    const before = [...conv.done, ...prompt];
    const reply = new ReplyStream(s.tok, {
      chat: { thinking: o.thinking, tools: s.tools !== undefined },
      stops: o.stops,
    });
    const view = new ReplyView(o.mode.color, s.hideThink, s.tty);
    s.interrupts.busy = true;
    const signal = s.interrupts.renew();
    const result = await s.scheduler.submit({
      prompt,
      maxTokens: Math.min(o.gen, room),
      stopIds: s.ends,
      choose: s.sampler,
      ...(o.thinking && o.reasoningBudget !== undefined
        ? { grammar: reasoningBudgetFilter(o.reasoningBudget, s.tok) }
        : {}),
      state: conv.state,
      keepState: true,
      signal,
      onToken: (token) => {
        const step = reply.token(token, undefined);
        view.show(step.events);
        return step.stop;
      },
    });
    await s.scheduler.close();
    s.interrupts.busy = false;
    view.show(reply.end());
    view.end();
    calls = [...reply.calls];
    const reasoning = reply.reasoning, content = reply.text;

    conv.state = result.state;
    if (result.tokens.length === 0) {
      // Stopped during the prefill: the state is part-way through the prompt; start the
      // next turn from the messages instead.
      conv.forget();
    } else {
      conv.done = [...before, ...result.tokens.slice(0, -1)];
      conv.pending = result.tokens[result.tokens.length - 1];
      conv.left = reply.reader!.left;
    }
    const said: ChatMessage = { role: "assistant", content };
    if (o.thinking) said.reasoning = reasoning;
    if (calls.length > 0) said.toolCalls = calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }));
    conv.messages.push(...incoming, said);
    if (o.reprefill) conv.forget();
    const finish = calls.length > 0 && result.finishReason === "stop" ? "tool_calls" : result.finishReason;
    s.turns.push({
      prompt_ids: before,
      prefilled_tokens: prompt.length,
      generated_ids: result.tokens,
      finish_reason: finish,
      reasoning,
      content,
      prefill_seconds: result.prefillSeconds,
      decode_seconds: result.decodeSeconds,
    });
    info(
      `k3: chat: turn ${s.turns.length}: prefilled ${prompt.length} tokens in ${result.prefillSeconds.toFixed(3)} s, ` +
        `${result.tokens.length} tokens in ${result.decodeSeconds.toFixed(3)} s; finish_reason ${finish}`,
    );
    await saveConversation(conv, s.files, o.history, o.state);
    if (o.out) await writeReport(s);
    if (calls.length > 0 && result.finishReason === "stop") {
      turnIn = await toolResults(s, calls, nextLine);
      if (!turnIn) console.error(`k3: chat: no result for a tool call; the turn ends here`);
    }
  }
}
