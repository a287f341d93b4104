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
 * @module
 */

import { EXIT, usageError } from "../engine/errors.ts";
import { testHook } from "../engine/native/test_hooks.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { makeSampler } from "../engine/generate/sampling.ts";
import {
  loadState,
  type ModelFingerprint,
  modelFingerprint,
  readStateFile,
  saveState,
} from "../engine/generate/state_file.ts";
import type { SequenceState } from "../engine/model/state.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import { engineEnvironment } from "./environment.ts";
import {
  type ChatMessage,
  chatPrompt,
  continuePrompt,
  EFFORTS,
  formatHistory,
  parseHistory,
  stopIds,
  type ToolDecl,
} from "../engine/text/chat.ts";
import type { ToolCall } from "../engine/text/xtml.ts";
import { ReplyStream } from "./reply.ts";
import { ApiError, parseTools } from "./openai.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { decodeUtf8Strict } from "../engine/text/utf8.ts";
import { fmtBytes, intFlag, modelDirArg, parseFlags, peakRssBytes, plural, writeFileAtomic } from "./common.ts";
import { info, OUTPUT_FLAGS, OUTPUT_HELP, outputMode, progress } from "./progress.ts";
import { LineEditor, type LineResult, readMessage, stdinTerminal } from "./line_editor.ts";
import { reportHead, snakeKeys } from "./report.ts";
import { EXIT_INTERRUPTED, Interrupts, writeStdout } from "./interrupt.ts";
import { MAX_PROMPT_IDS, MEMORY_FLAGS, MEMORY_HELP, memoryOptions, needTokenizer } from "./run_options.ts";
import { chunkFlag } from "./chunk_flag.ts";
import { DEFAULTS, SAMPLING_FLAGS, samplingHelp, samplingOptions, stopStrings } from "./request.ts";

/** Usage text of `k3 chat`. */
export const USAGE = `usage: k3 chat <model_dir> [options]

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
FILE.k3state with --state), /exit.

conversation:
  --system TEXT          a system message to start a new conversation with
  --history FILE.jsonl   load the conversation (one {"role","content"[,"reasoning"]} per
                         line; refused, never overwritten, if it does not parse) and save
                         it atomically after every turn
  --state FILE           the conversation's sequence state: continued when it holds the
                         same messages, saved after every turn (see README: Saved states)
  --no-think             reply straight in the response channel
  --thinking-effort E    ${EFFORTS.join(", ")}
  --hide-think           do not show the think channel (also on a terminal)
  --show-think           show it when stdout is not a terminal, between marker lines
  --input-history FILE   the line editor's history (default ~/.k3/chat_history; "" keeps
                         none); one JSON string per message sent
  -n, --gen N            tokens per reply at most (default 1024)
  --context N            positions the conversation may hold (default 4096)
  --stop TEXT            also end a reply at TEXT (repeatable)
  --tools FILE.json      function tools the model may call (OpenAI's "tools" array); a
                         call is shown as "[call NAME ARGS]" and its result read from stdin
                         (one line), then the turn continues
  --tool-results FILE    canned tool results instead of stdin: one JSON string (or any
                         JSON, as its text) per line, used in order
  --reprefill            diagnostic: forget the state after each turn and prefill the whole
                         conversation again (what the state saves)
  --out FILE             a JSON report of every turn (ids, timings), rewritten after each
${samplingHelp("default: temperature 1.0, top-p 0.95, the vendor's guidance")}
  --tok DIR, -t/--threads N, --layers N, --chunk N   as for k3 run
${MEMORY_HELP}
${OUTPUT_HELP}
  -h, --help             this help

examples:
  k3 chat tests/fixtures/tiny
  k3 chat tests/fixtures/tiny --system "Be brief." --history talk.jsonl --state talk.k3state
  printf 'Hello\nAnd then?\n' | k3 chat tests/fixtures/tiny --temperature 0 --gen 16 --show-think
`;

/** The REPL's /help. */
const REPL_HELP = `commands: /help  /reset (start over)  /save FILE  /exit (or Ctrl-D)
several lines: start with """ and end with """, or end a line with \\
keys: left/right, Home/End, Ctrl-A/E, Ctrl-K/U/W, up/down (history); Ctrl-C stops a reply`;

/** One turn of the report. */
interface TurnReport {
  /** Every token of the conversation before the reply (what one run over it would see). */
  prompt_ids: number[];
  /** Tokens prefilled this turn. */
  prefilled_tokens: number;
  generated_ids: number[];
  finish_reason: string;
  reasoning: string;
  content: string;
  prefill_seconds: number;
  decode_seconds: number;
}

/** Reads lines from stdin as they arrive. */
async function* stdinLines(): AsyncGenerator<string> {
  const reader = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
    }
  }
  if (buf !== "") yield buf;
}

/** The conversation: messages, and the kept state with the exact tokens it represents. */
class Conversation {
  messages: ChatMessage[] = [];
  state?: SequenceState;
  /** Tokens the state has processed. */
  done: number[] = [];
  /** The last generated token: chosen, not yet run through the model. */
  pending?: number;
  /** What the last reply left open. */
  left = { open: [] as readonly string[], ended: true };

  forget(): void {
    this.state?.free();
    this.state = undefined;
    this.done = [];
    this.pending = undefined;
  }
}

/** Reads and strictly parses a history file; undefined when it does not exist. */
async function readHistory(path: string): Promise<ChatMessage[] | undefined> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw usageError(`--history: cannot read ${path}: ${(e as Error).message}`);
  }
  return parseHistory(decodeUtf8Strict(bytes, path), path);
}

/** Reads --tools: an OpenAI `tools` array, validated as serve validates one; usage error (exit 2) otherwise. */
async function readTools(path: string): Promise<ToolDecl[]> {
  let v: unknown;
  try {
    v = JSON.parse(await Deno.readTextFile(path));
  } catch (e) {
    throw usageError(`--tools: cannot read ${path}: ${(e as Error).message}`);
  }
  if (!Array.isArray(v) || v.length === 0) {
    throw usageError(`--tools: ${path} must hold a non-empty JSON array of tools`);
  }
  try {
    return parseTools(v);
  } catch (e) {
    if (e instanceof ApiError) throw usageError(`--tools: ${path}: ${e.message}`);
    throw e;
  }
}

/** Reads --tool-results: one result per line, a JSON string as its text, other JSON as written. */
async function readToolResults(path: string): Promise<string[]> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw usageError(`--tool-results: cannot read ${path}: ${(e as Error).message}`);
  }
  return text.split("\n").filter((l) => l.trim() !== "").map((l, i) => {
    try {
      const v = JSON.parse(l);
      return typeof v === "string" ? v : JSON.stringify(v);
    } catch {
      throw usageError(`--tool-results: ${path}:${i + 1}: not JSON`);
    }
  });
}

/** Runs `k3 chat`; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const { values, positionals, tokens } = parseFlags("chat", args, {
    system: { type: "string" },
    history: { type: "string" },
    state: { type: "string" },
    "no-think": { type: "boolean" },
    "thinking-effort": { type: "string" },
    "hide-think": { type: "boolean" },
    "show-think": { type: "boolean" },
    "input-history": { type: "string" },
    gen: { type: "string", short: "n" },
    context: { type: "string" },
    stop: { type: "string", multiple: true },
    tools: { type: "string" },
    "tool-results": { type: "string" },
    reprefill: { type: "boolean" },
    out: { type: "string" },
    tok: { type: "string" },
    threads: { type: "string", short: "t" },
    layers: { type: "string" },
    chunk: { type: "string" },
    ...OUTPUT_FLAGS,
    ...SAMPLING_FLAGS,
    ...MEMORY_FLAGS,
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const dir = modelDirArg("chat", positionals, "--system");
  const mode = outputMode(values);
  const thinking = !values["no-think"];
  const effort = values["thinking-effort"];
  if (effort !== undefined && !(EFFORTS as readonly string[]).includes(effort)) {
    throw usageError(`--thinking-effort must be one of ${EFFORTS.join(", ")}, not ${effort}`);
  }
  const gen = intFlag("gen", values.gen, DEFAULTS.chat.maxTokens, 1, 1 << 20);
  const context = intFlag("context", values.context, 4096, 16, 1 << 20);
  const chunk = chunkFlag(values.chunk, MAX_PROMPT_IDS);
  const threads = intFlag("threads", values.threads, navigator.hardwareConcurrency, 1, 256);
  const sampling = samplingOptions(values, DEFAULTS.chat.sampling);
  const stops = stopStrings(values.stop);
  const tools = values.tools === undefined ? undefined : await readTools(values.tools);
  const canned = values["tool-results"] === undefined ? undefined : await readToolResults(values["tool-results"]);
  const memory = memoryOptions(tokens);
  const config = await readModelConfig(
    dir,
    values.layers !== undefined ? intFlag("layers", values.layers, 0, 1, 100000) : undefined,
  );
  const { cfg } = config;
  const tok: Tokenizer = needTokenizer(dir, values.tok, "chat", cfg.vocabSize);
  // Before the model opens: a tokenizer without the chat template's tokens is refused now.
  const ends = stopIds(tok);

  const conv = new Conversation();
  if (values.history !== undefined) conv.messages = (await readHistory(values.history)) ?? [];
  if (values.system !== undefined) {
    if (conv.messages.length > 0) {
      throw usageError(`--system: ${values.history} already holds a conversation; edit its first line instead`);
    }
    conv.messages.push({ role: "system", content: values.system });
  }

  const opened = await openModel(config, {
    ...engineEnvironment(),
    capacity: context,
    chunk,
    threads,
    memory,
    log: (line) => info(`k3: ${line}`),
    onProgress: (what, d, n) => progress(what, d, n),
  });
  const { model } = opened;
  const scheduler = new Scheduler(model, { chunk: opened.plan.chunk });
  const sample = makeSampler(sampling);
  // Tests script a reply (a tool call from a random-weight model) through this hook.
  const scripted = (testHook("K3_TEST_CHOOSE") ?? "").split(",").filter((x) => x !== "").map(Number);
  const sampler = (logits: Float32Array) => scripted.length > 0 ? scripted.shift()! : sample(logits);
  const tty = Deno.stdout.isTerminal();
  const interactive = tty && Deno.stdin.isTerminal();
  // The think channel: dimmed with colour; otherwise between marker lines, as ollama run does;
  // off a terminal only when asked for.
  const hideThink = values["hide-think"] === true || (!tty && !values["show-think"]);
  const home = (() => {
    try {
      return Deno.env.get("HOME");
    } catch {
      return undefined;
    }
  })();
  const historyFile = values["input-history"] ?? (home ? `${home}/.k3/chat_history` : "");
  const interrupts = new Interrupts();
  const turns: TurnReport[] = [];
  let fp: ModelFingerprint | undefined;
  const fingerprint = async () => (fp ??= await modelFingerprint(opened));

  const saveConversation = async (historyPath?: string, statePath?: string) => {
    if (historyPath) await writeFileAtomic(historyPath, formatHistory(conv.messages));
    if (statePath && conv.state) {
      await saveState(statePath, model, conv.state, conv.done, await fingerprint(), {
        messages: conv.messages,
        pending: conv.pending ?? null,
        left: conv.left,
        thinking,
      });
    }
  };

  try {
    // A saved state continues the conversation only if it holds exactly these messages.
    if (values.state !== undefined) {
      let exists = true;
      try {
        await Deno.stat(values.state);
      } catch {
        exists = false;
      }
      if (exists) {
        const file = await readStateFile(values.state);
        const loaded = await loadState(file, model, await fingerprint());
        const meta = loaded.meta as { messages?: unknown; pending?: unknown; left?: unknown; thinking?: unknown };
        const same = values.history === undefined && values.system === undefined ||
          JSON.stringify(meta.messages) === JSON.stringify(conv.messages);
        const left = meta.left as { open?: unknown; ended?: unknown } | undefined;
        const ok = Array.isArray(meta.messages) && meta.thinking === thinking &&
          (meta.pending === null || (Number.isInteger(meta.pending) && (meta.pending as number) >= 0 &&
            (meta.pending as number) < cfg.vocabSize)) &&
          !!left && Array.isArray(left.open) && left.open.every((t) => typeof t === "string") &&
          typeof left.ended === "boolean";
        if (ok && same) {
          conv.messages = parseHistory(formatHistory(meta.messages as ChatMessage[]), values.state);
          conv.state = loaded.state;
          conv.done = loaded.tokens;
          conv.pending = meta.pending === null ? undefined : meta.pending as number;
          conv.left = { open: left!.open as string[], ended: left!.ended as boolean };
          info(
            `k3: chat: continuing ${values.state}: ${conv.messages.length} messages, ${conv.done.length} tokens kept`,
          );
        } else {
          loaded.state.free();
          console.error(
            `k3: chat: ${values.state} holds ${
              ok ? "another conversation" : "no chat state"
            }; prefilling the history instead (it is replaced after the next turn)`,
          );
        }
      }
    }
    const count = conv.messages.length;
    info(
      `k3: chat: ${dir}: ${cfg.numLayers} layers, context ${context} positions; ${count} ${
        plural(count, "message")
      }; ` +
        `sampling temperature ${sampling.temperature}, top-p ${sampling.topP}, seed ${sampling.seed}. ` +
        (interactive ? "/help for commands, Ctrl-D to end." : "/exit to end."),
    );

    const editor = interactive ? new LineEditor(stdinTerminal(), historyFile || undefined) : undefined;
    const lines = stdinLines();
    const nextLine = async (prompt: string): Promise<LineResult> => {
      if (editor) return await editor.readLine(prompt);
      if (tty) writeStdout(prompt);
      const next = await lines.next();
      return next.done ? { kind: "eof" } : { kind: "line", text: next.value };
    };
    for (;;) {
      if (tty) writeStdout("\n");
      interrupts.busy = false;
      interrupts.idle = () => Deno.exit(EXIT_INTERRUPTED);
      const read = await readMessage(nextLine);
      if (read.kind === "eof") break;
      if (read.kind === "interrupt") {
        writeStdout("(Ctrl-D or /exit ends the chat)\n");
        continue;
      }
      const line = read.text;
      if (line.trim() === "") continue;
      editor?.addHistory(line);
      if (line.trim() === "/exit" || line.trim() === "/bye") break;
      if (line.trim() === "/help" || line.trim() === "/?") {
        writeStdout(REPL_HELP + "\n");
        continue;
      }
      if (line.trim() === "/reset") {
        conv.forget();
        conv.messages = conv.messages[0]?.role === "system" ? [conv.messages[0]] : [];
        conv.left = { open: [], ended: true };
        console.error("k3: chat: conversation reset");
        continue;
      }
      if (line.startsWith("/save")) {
        const to = line.slice(5).trim();
        if (!to) {
          console.error("k3: chat: /save needs a file name");
          continue;
        }
        try {
          await saveConversation(to, values.state !== undefined ? `${to}.k3state` : undefined);
          console.error(`k3: chat: saved ${to}${values.state !== undefined && conv.state ? ` and ${to}.k3state` : ""}`);
        } catch (e) {
          console.error(`k3: chat: /save: ${(e as Error).message}`);
        }
        continue;
      }
      if (line.startsWith("/")) {
        console.error(`k3: chat: unknown command ${line.split(/\s/, 1)[0]} (/help, /reset, /save FILE, /exit)`);
        continue;
      }

      const user: ChatMessage = { role: "user", content: line };
      // A turn: the user's message, then as long as the reply calls tools, their results.
      let turnIn: ChatMessage[] | undefined = [user];
      let calls: ToolCall[] = [];
      while (turnIn) {
        const incoming: ChatMessage[] = turnIn;
        turnIn = undefined;
        let prompt: number[];
        if (conv.state) {
          prompt = [
            ...(conv.pending === undefined ? [] : [conv.pending]),
            ...continuePrompt(tok, conv.left, incoming, thinking, calls),
          ];
        } else {
          prompt = chatPrompt(tok, [...conv.messages, ...incoming], { thinking, effort, tools });
        }
        const room = context - conv.done.length - prompt.length + 1;
        if (room < 1) {
          console.error(
            `k3: chat: the conversation is full (${conv.done.length + prompt.length} of ${context} positions); ` +
              `/reset, or start with a larger --context`,
          );
          break;
        }
        const before = [...conv.done, ...prompt];
        const reply = new ReplyStream(tok, { chat: { thinking, tools: tools !== undefined }, stops });
        let shown: "think" | "response" | "call" | undefined;
        // "thinking..." until the first text (a terminal only; erased by it).
        let waiting = tty;
        if (waiting) writeStdout(mode.color ? "\x1b[2mthinking...\x1b[0m" : "thinking...");
        const unwait = () => {
          if (waiting) writeStdout("\r\x1b[K");
          waiting = false;
        };
        const endThink = () => writeStdout(mode.color ? "\x1b[0m\n" : "\n...done thinking.\n\n");
        const show = (events: ReturnType<ReplyStream["token"]>["events"]) => {
          for (const e of events) {
            if (e.type !== "text") {
              unwait();
              if (shown === "think") endThink();
              if (e.type === "call") writeStdout(`${shown === "response" ? "\n" : ""}[call ${e.name} `);
              else writeStdout(e.text);
              shown = "call";
              continue;
            }
            if (e.channel === "think" && hideThink) continue;
            if (e.text === "") continue;
            unwait();
            if (shown === "think" && e.channel === "response") endThink();
            if (e.channel === "think" && shown !== "think") writeStdout(mode.color ? "\x1b[2m" : "Thinking...\n");
            shown = e.channel;
            writeStdout(e.text);
          }
        };
        interrupts.busy = true;
        const signal = interrupts.renew();
        const result = await scheduler.submit({
          prompt,
          maxTokens: Math.min(gen, room),
          stopIds: ends,
          choose: sampler,
          state: conv.state,
          keepState: true,
          signal,
          onToken: (token) => {
            const step = reply.token(token, undefined);
            show(step.events);
            return step.stop;
          },
        });
        await scheduler.close();
        interrupts.busy = false;
        show(reply.end());
        unwait();
        if (shown === "think") writeStdout(mode.color ? "\x1b[0m" : "\n...done thinking.");
        writeStdout(shown === "call" ? "]\n" : "\n");
        const reader = reply.reader!;
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
          conv.left = reader.left;
        }
        const said: ChatMessage = { role: "assistant", content };
        if (thinking) said.reasoning = reasoning;
        if (calls.length > 0) said.toolCalls = calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }));
        conv.messages.push(...incoming, said);
        if (values.reprefill) conv.forget();
        turns.push({
          prompt_ids: before,
          prefilled_tokens: prompt.length,
          generated_ids: result.tokens,
          finish_reason: calls.length > 0 && result.finishReason === "stop" ? "tool_calls" : result.finishReason,
          reasoning,
          content,
          prefill_seconds: result.prefillSeconds,
          decode_seconds: result.decodeSeconds,
        });
        info(
          `k3: chat: turn ${turns.length}: prefilled ${prompt.length} tokens in ${
            result.prefillSeconds.toFixed(3)
          } s, ` +
            `${result.tokens.length} tokens in ${result.decodeSeconds.toFixed(3)} s; finish_reason ${
              turns[turns.length - 1].finish_reason
            }`,
        );
        await saveConversation(values.history, values.state);
        if (values.out) {
          await writeFileAtomic(
            values.out,
            JSON.stringify(
              {
                ...reportHead("chat"),
                model_dir: dir,
                sampling: snakeKeys(sampling),
                thinking,
                turns,
                peak_rss_bytes: peakRssBytes(),
              },
              null,
              2,
            ) + "\n",
          );
        }
        if (calls.length > 0 && result.finishReason === "stop") {
          // The results, in call order: canned, or one line of stdin each.
          const results: ChatMessage[] = [];
          for (const c of calls) {
            let text: string | undefined = canned?.shift();
            if (text === undefined && !canned) {
              const got = await nextLine(`result of ${c.name}> `);
              text = got.kind === "line" ? got.text : undefined;
            }
            if (text === undefined) break;
            results.push({ role: "tool", content: text, toolCallId: c.id, name: c.name });
          }
          if (results.length === calls.length) turnIn = results;
          else console.error(`k3: chat: no result for a tool call; the turn ends here`);
        }
      }
    }
    info(`k3: chat: ${turns.length} ${plural(turns.length, "turn")}; PEAK RSS ${fmtBytes(peakRssBytes())}`);
    return EXIT.ok;
  } finally {
    interrupts.dispose();
    conv.forget();
    await opened.close();
  }
}
