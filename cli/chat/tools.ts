/**
 * `k3 chat`'s tool files: `--tools` (an OpenAI `tools` array, validated as serve validates
 * one) and `--tool-results` (canned results, one per line).
 *
 * @module
 */

import { EXIT, usageError } from "../../engine/errors.ts";
import { readInputText } from "../../engine/native/files.ts";
import type { ToolDecl } from "../../engine/text/chat.ts";
import { parseTools } from "../openai.ts";
import { ApiError } from "../openai_error.ts";

/** The largest --tools or --tool-results file read. */
const MAX_TOOL_FILE_BYTES = 16 << 20;

/** Reads --tools: an OpenAI `tools` array, validated as serve validates one; usage error (exit 2) otherwise. */
export function readTools(path: string): ToolDecl[] {
  const text = readInputText(path, { what: "--tools", maxBytes: MAX_TOOL_FILE_BYTES, exitCode: EXIT.usage });
  let v: unknown;
  try {
    v = JSON.parse(text);
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
export function readToolResults(path: string): string[] {
  const text = readInputText(path, { what: "--tool-results", maxBytes: MAX_TOOL_FILE_BYTES, exitCode: EXIT.usage });
  return text.split("\n").filter((l) => l.trim() !== "").map((l, i) => {
    try {
      const v = JSON.parse(l);
      return typeof v === "string" ? v : JSON.stringify(v);
    } catch {
      throw usageError(`--tool-results: ${path}:${i + 1}: not JSON`);
    }
  });
}
