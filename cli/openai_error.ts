/**
 * OpenAI's error as `k3 serve` and `k3 batch` answer it: ApiError (an HTTP status, a message,
 * the request field at fault) and its JSON body, and the 400s of request validation: how a
 * request field is read (engine/json_fields.ts) and what a field that is not what it must be,
 * missing, or not supported is answered with.
 *
 * @module
 */

import {
  describeValue,
  type FieldOptions,
  type FieldProblem,
  type JsonFields,
  type JsonKey,
} from "../engine/json_fields.ts";

/** An error answered as `{"error": {message, type, param, code}}` with an HTTP status. */
export class ApiError extends Error {
  /** An error with its HTTP status, the request field at fault, and OpenAI's code and type. */
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly type: string = status >= 500 ? "server_error" : "invalid_request_error",
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** OpenAI's error body. */
export function errorBody(
  e: ApiError,
): { error: { message: string; type: string; param: string | null; code: string | null } } {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

/** How a request is read: absent and null fields are undefined; a bad one is a 400 naming it. */
export const REQUEST: FieldOptions = {
  absent: "optional",
  report: (p) => {
    throw requestError(p);
  },
};

/** The 400 for a field that is not what it must be: `'temperature' must be a number in [0, 2], got 3`. */
export function requestError(p: FieldProblem): ApiError {
  if (p.field === "") return new ApiError(400, `the request body must be a JSON object, got ${describeValue(p.got)}`);
  if (p.missing) return bad(p.field, `'${p.field}' is required (${p.expected})`);
  return bad(p.field, `'${p.field}' must be ${p.expected}, got ${describeValue(p.got)}`);
}

/** A 400 naming request field `param` (`code`: OpenAI's, e.g. "unsupported_parameter"). */
export function bad(param: string, message: string, code: string | null = null): ApiError {
  return new ApiError(400, message, param, code);
}

/** `v`, or a 400 saying field `k` of `f` must be `expected`. */
export function need<T>(f: JsonFields, k: JsonKey, v: T | undefined, expected: string): T {
  if (v === undefined) throw requestError(f.problemOf(k, expected));
  return v;
}

/** Refuses a field k3 does not implement, unless it holds one of the `harmless` values. */
export function refuse(f: JsonFields, k: string, why: string, harmless: unknown[] = []): void {
  const v = f.get(k);
  if (!f.has(k) || harmless.some((h) => h === v)) return;
  const empty = (x: unknown) => typeof x === "object" && x !== null && Object.keys(x).length === 0;
  if (empty(v) && harmless.some((h) => empty(h) && Array.isArray(h) === Array.isArray(v))) return;
  throw bad(f.name(k), `'${f.name(k)}' is not supported by k3 serve: ${why}`, "unsupported_parameter");
}
