/**
 * `k3 chat`'s tool files: `--tools` (an OpenAI `tools` array, validated as serve validates
 * one) and `--tool-results` (canned results, one per line).
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { ToolDecl } from "../../engine/text/chat.ts";
import { parseTools } from "../openai.ts";
import { ApiError } from "../openai_error.ts";

/** Reads --tools: an OpenAI `tools` array, validated as serve validates one; usage error (exit 2) otherwise. */
export async function readTools(path: string): Promise<ToolDecl[]> {
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
export async function readToolResults(path: string): Promise<string[]> {
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
