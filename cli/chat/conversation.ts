/**
 * `k3 chat`'s conversation state: the messages, the kept sequence state with the exact
 * tokens it holds, the history file, and saving and continuing a saved state.
 *
 * @module
 */

import { EXIT } from "../../engine/errors.ts";
import { notRegular, readInput } from "../../engine/native/files.ts";
import { loadState, type ModelFingerprint, readStateFile, saveState } from "../../engine/generate/state_file.ts";
import type { SequenceState } from "../../engine/model/state.ts";
import type { K3Model } from "../../engine/model/model.ts";
import { type ChatMessage, formatHistory, parseHistory } from "../../engine/text/chat.ts";
import { decodeUtf8Strict } from "../../engine/text/utf8.ts";
import { writeFileAtomic } from "../common.ts";
import { info } from "../progress.ts";

/** The conversation: messages, and the kept state with the exact tokens it represents. */
export class Conversation {
  /** The messages so far. */
  messages: ChatMessage[] = [];
  /** The kept sequence state (none: the next turn prefills the messages). */
  state?: SequenceState;
  /** Tokens the state has processed. */
  done: number[] = [];
  /** The last generated token: chosen, not yet run through the model. */
  pending?: number;
  /** What the last reply left open. */
  left = { open: [] as readonly string[], ended: true };

  /** Drops the kept state (the messages stay). */
  forget(): void {
    this.state?.free();
    this.state = undefined;
    this.done = [];
    this.pending = undefined;
  }

  /** Starts over: only the system message stays. */
  reset(): void {
    this.forget();
    this.messages = this.messages[0]?.role === "system" ? [this.messages[0]] : [];
    this.left = { open: [], ended: true };
  }
}

/** The largest --history file read. */
const MAX_HISTORY_BYTES = 256 << 20;

/** Reads and strictly parses a history file; undefined when it does not exist. */
export function readHistory(path: string): ChatMessage[] | undefined {
  if (notRegular(path) === "no such file") return undefined;
  const bytes = readInput(path, { what: "--history", maxBytes: MAX_HISTORY_BYTES, exitCode: EXIT.usage });
  return parseHistory(decodeUtf8Strict(bytes, path), path);
}

/** The conversation's files and what a saved state must match. */
export interface ConversationFiles {
  /** The model the state belongs to. */
  model: K3Model;
  /** Its fingerprint (computed once, when first needed). */
  fingerprint: () => Promise<ModelFingerprint>;
  /** Whether the think channel is open. */
  thinking: boolean;
  /** The model's vocabulary. */
  vocab: number;
}

/** Saves the messages to `historyPath` and the state (with them) to `statePath`. */
export async function saveConversation(
  conv: Conversation,
  files: ConversationFiles,
  historyPath?: string,
  statePath?: string,
): Promise<void> {
  if (historyPath) await writeFileAtomic(historyPath, formatHistory(conv.messages));
  if (statePath && conv.state) {
    await saveState(statePath, files.model, conv.state, conv.done, await files.fingerprint(), {
      messages: conv.messages,
      pending: conv.pending ?? null,
      left: conv.left,
      thinking: files.thinking,
    });
  }
}

/**
 * Continues the state saved in `path` when it holds exactly the conversation's messages
 * (`anyMessages`: no --history or --system, so whatever it holds); otherwise says so and
 * the history is prefilled instead.
 */
export async function continueSavedState(
  conv: Conversation,
  files: ConversationFiles,
  path: string,
  anyMessages: boolean,
): Promise<void> {
  try {
    await Deno.stat(path);
  } catch {
    return;
  }
  const file = await readStateFile(path);
  const loaded = await loadState(file, files.model, await files.fingerprint());
  const meta = loaded.meta as { messages?: unknown; pending?: unknown; left?: unknown; thinking?: unknown };
  const same = anyMessages || JSON.stringify(meta.messages) === JSON.stringify(conv.messages);
  const left = meta.left as { open?: unknown; ended?: unknown } | undefined;
  const ok = Array.isArray(meta.messages) && meta.thinking === files.thinking &&
    (meta.pending === null || (Number.isInteger(meta.pending) && (meta.pending as number) >= 0 &&
      (meta.pending as number) < files.vocab)) &&
    !!left && Array.isArray(left.open) && left.open.every((t) => typeof t === "string") &&
    typeof left.ended === "boolean";
  if (ok && same) {
    conv.messages = parseHistory(formatHistory(meta.messages as ChatMessage[]), path);
    conv.state = loaded.state;
    conv.done = loaded.tokens;
    conv.pending = meta.pending === null ? undefined : meta.pending as number;
    conv.left = { open: left!.open as string[], ended: left!.ended as boolean };
    info(`k3: chat: continuing ${path}: ${conv.messages.length} messages, ${conv.done.length} tokens kept`);
  } else {
    loaded.state.free();
    console.error(
      `k3: chat: ${path} holds ${
        ok ? "another conversation" : "no chat state"
      }; prefilling the history instead (it is replaced after the next turn)`,
    );
  }
}
