/**
 * The chat REPL's ollama-style commands on the session's settings: `/set` (sampling
 * parameters, the reply length, the system message, thinking on or off), `/show` (what
 * the session runs with), `/clear` (start over) and `/load FILE` (a conversation saved
 * with /save). A change that alters the prompt's tokens (system, thinking) drops the kept
 * state, so the next turn prefills the conversation again.
 *
 * @module
 */

import { K3Error, usageError } from "../../engine/errors.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { intFlag } from "../common.ts";
import { samplingOptions } from "../flag_groups/sampling.ts";
import { readHistory } from "./conversation.ts";
import type { ChatSession } from "./turn.ts";

/** What /set and /show say about themselves in /help. */
export const SETTINGS_HELP = `/set parameter NAME VALUE (temperature, top_p, top_k, min_p, seed, num_predict)
/set system TEXT  /set think  /set nothink  /show [info|parameters|system]
/clear (start over)  /load FILE (a conversation saved with /save)`;

/** ollama's parameter names (and k3's flag names) to k3's sampling flags. */
const SAMPLING_NAMES: Record<string, string> = {
  temperature: "temperature",
  top_p: "top-p",
  "top-p": "top-p",
  top_k: "top-k",
  "top-k": "top-k",
  min_p: "min-p",
  "min-p": "min-p",
  seed: "seed",
};

/** Replaces the system message (or removes it, for empty text); the kept state goes. */
function setSystem(s: ChatSession, text: string): void {
  const rest = s.conv.messages[0]?.role === "system" ? s.conv.messages.slice(1) : s.conv.messages;
  s.conv.messages = text ? [{ role: "system", content: text }, ...rest] : rest;
  s.conv.forget();
}

/** `/set ...`: returns the confirmation line. Throws K3Error for a bad name or value. */
export function setCommand(s: ChatSession, args: string): string {
  const [what, ...rest] = args.trim().split(/\s+/);
  if (what === "parameter") {
    const [name, value] = rest;
    if (name === undefined || value === undefined || rest.length !== 2) {
      throw usageError("/set parameter NAME VALUE");
    }
    if (name === "num_predict" || name === "gen") {
      s.o.gen = intFlag("gen", value, s.o.gen, 1, s.context);
      return `reply length at most ${s.o.gen} tokens`;
    }
    const flag = SAMPLING_NAMES[name];
    if (!flag) {
      throw usageError(
        `/set parameter: no parameter ${JSON.stringify(name)} (${Object.keys(SAMPLING_NAMES).join(", ")}, num_predict)`,
      );
    }
    s.o.sampling = samplingOptions({ [flag]: value }, s.o.sampling);
    s.sampler = makeSampler(s.o.sampling);
    return `${name} ${value}`;
  }
  if (what === "system") {
    const text = args.trim().slice("system".length).trim();
    setSystem(s, text);
    return text ? "system message set" : "system message removed";
  }
  if (what === "think" || what === "nothink") {
    s.o.thinking = what === "think";
    s.files.thinking = s.o.thinking;
    s.conv.forget();
    return `thinking ${s.o.thinking ? "on" : "off"}`;
  }
  throw usageError("/set parameter NAME VALUE | /set system TEXT | /set think | /set nothink");
}

/** `/show [info|parameters|system]`: the text to print. */
export function showCommand(s: ChatSession, args: string): string {
  const what = args.trim() || "all";
  const p = s.o.sampling;
  const parts: Record<string, string> = {
    info: `model ${s.o.dir}; context ${s.o.context} positions; ${s.conv.messages.length} messages; thinking ${
      s.o.thinking ? "on" : "off"
    }`,
    parameters: `temperature ${p.temperature}, top_p ${p.topP}, top_k ${p.topK}, min_p ${p.minP}, seed ${p.seed}, ` +
      `num_predict ${s.o.gen}`,
    system: s.conv.messages[0]?.role === "system" ? `system: ${s.conv.messages[0].content}` : "no system message",
  };
  if (what === "all") return Object.values(parts).join("\n");
  if (!Object.hasOwn(parts, what)) throw usageError("/show [info|parameters|system]");
  return parts[what];
}

/** `/load FILE`: the conversation saved there replaces this one. Returns the confirmation. */
export async function loadCommand(s: ChatSession, path: string): Promise<string> {
  if (!path) throw usageError("/load FILE (a conversation saved with /save)");
  let isDir = false;
  try {
    isDir = Deno.statSync(path).isDirectory;
  } catch { /* readHistory says what is wrong */ }
  if (isDir) throw usageError(`/load: ${path} is a directory; a chat opens one model (k3 chat ${path} for that one)`);
  const messages = await readHistory(path);
  if (messages === undefined) throw new K3Error(`/load: ${path} does not exist`);
  s.conv.forget();
  s.conv.messages = messages;
  s.conv.left = { open: [], ended: true };
  return `loaded ${messages.length} messages from ${path}`;
}
