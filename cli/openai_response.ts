/**
 * The response side of the OpenAI wire format `k3 serve` and `k3 batch` speak: the response,
 * chunk and model-list bodies of `/v1/chat/completions`, `/v1/completions` and
 * `/v1/models`, and the token counts and log probabilities they carry.
 *
 * Pure functions building JSON values; the request side (validation) is cli/openai.ts.
 *
 * @module
 */

/** Token counts of a response. */
export interface Usage {
  /** Tokens of the prompt (the rendered chat, for chat). */
  prompt_tokens: number;
  /** Tokens generated, a final stop id included. */
  completion_tokens: number;
  /** The sum. */
  total_tokens: number;
  /** Of the completion tokens, those of the think channel. */
  completion_tokens_details?: { reasoning_tokens: number };
  /** Of the prompt tokens, those served from the state cache instead of prefilled. */
  prompt_tokens_details?: { cached_tokens: number };
}

/** Usage from prompt and completion token counts (`reasoning`: think-channel tokens, when
 * known; `cached`: prompt tokens served from the state cache, OpenAI's `prompt_tokens_details`). */
export function usage(prompt: number, completion: number, reasoning?: number, cached?: number): Usage {
  const u: Usage = { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
  if (reasoning !== undefined) u.completion_tokens_details = { reasoning_tokens: reasoning };
  if (cached !== undefined) u.prompt_tokens_details = { cached_tokens: cached };
  return u;
}

/** OpenAI's finish reasons; an interrupted sequence is never answered as finished. */
export type OpenAIFinish = "stop" | "length" | "tool_calls";

/** The OpenAI finish reason of a finished (not interrupted) sequence; a turn that ended
 * with tool calls finished with "tool_calls". */
export function finishReason(r: "stop" | "length" | "interrupted", toolCalls = false): OpenAIFinish {
  if (r === "interrupted") throw new Error("an interrupted sequence has no OpenAI finish reason");
  return r === "stop" && toolCalls ? "tool_calls" : r;
}

/** One tool call of an answer, OpenAI's shape. */
export interface ToolCallBody {
  /** The call's id. */
  id: string;
  /** Always "function". */
  type: "function";
  /** What is called. */
  function: { name: string; arguments: string };
}

/** A tool call as OpenAI answers it. */
export function toolCallBody(c: { id: string; name: string; arguments: string }): ToolCallBody {
  return { id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } };
}

/** One token's log probability entry, OpenAI's chat shape. */
export interface LogprobEntry {
  /** The token's text (its bytes decoded alone; `bytes` has them exactly). */
  token: string;
  /** Its log probability. */
  logprob: number;
  /** Its UTF-8 bytes. */
  bytes: number[];
}

/** Chat `logprobs`: per content token, its entry and the most likely alternatives'. */
export interface ChatLogprobs {
  /** One per token of the response channel. */
  content: (LogprobEntry & { top_logprobs: LogprobEntry[] })[];
  /** Always null. */
  refusal: null;
}

/** Completions `logprobs`: the legacy shape, one element per generated token. */
export interface CompletionLogprobs {
  /** The tokens' texts. */
  tokens: string[];
  /** Their log probabilities. */
  token_logprobs: number[];
  /** Per token, the alternatives as text to log probability. */
  top_logprobs: Record<string, number>[];
  /** Where each token's text starts in the completion (UTF-16 code units). */
  text_offset: number[];
}

/** What identifies one response and its chunks. */
export interface ResponseHead {
  /** chatcmpl-... or cmpl-..., the same in every chunk. */
  id: string;
  /** Unix seconds. */
  created: number;
  /** The served model name. */
  model: string;
  /** What identifies the server's build and model (OpenAI's `system_fingerprint`). */
  system_fingerprint?: string;
}

/** `chat.completion`: a whole chat answer. */
export interface ChatCompletion extends ResponseHead {
  /** Always "chat.completion". */
  object: "chat.completion";
  /** The one choice. */
  choices: {
    index: 0;
    message: {
      role: "assistant";
      content: string | null;
      reasoning_content: string | null;
      /** The same text under the name newer vLLM clients read. */
      reasoning: string | null;
      refusal: null;
      tool_calls?: ToolCallBody[];
    };
    logprobs: ChatLogprobs | null;
    finish_reason: OpenAIFinish;
  }[];
  /** Token counts. */
  usage: Usage;
}

/** `chat.completion.chunk`: one server-sent event of a streamed chat answer. */
export interface ChatChunk extends ResponseHead {
  /** Always "chat.completion.chunk". */
  object: "chat.completion.chunk";
  /** The one choice's delta (none in the usage chunk). */
  choices: { index: 0; delta: ChatDelta; logprobs: ChatLogprobs | null; finish_reason: OpenAIFinish | null }[];
  /** null on every chunk but the last when stream_options.include_usage; absent otherwise. */
  usage?: Usage | null;
}

/** `text_completion`: a whole completion, or one chunk of a streamed one. */
export interface Completion extends ResponseHead {
  /** Always "text_completion". */
  object: "text_completion";
  /** The one choice (none in the usage chunk). */
  choices: { index: 0; text: string; logprobs: CompletionLogprobs | null; finish_reason: OpenAIFinish | null }[];
  /** Token counts (null or absent on stream chunks before the last). */
  usage?: Usage | null;
}

/** `GET /v1/models`: every name served, the first one first. */
export interface ModelList {
  /** Always "list". */
  object: "list";
  /** The one served model. */
  data: { id: string; object: "model"; created: number; owned_by: string }[];
}

/** The fields every response and chunk opens with, in the order OpenAI sends them. */
function headFields<O extends string>(h: ResponseHead, object: O) {
  return { id: h.id, object, created: h.created, model: h.model, system_fingerprint: h.system_fingerprint };
}

/** A non-streamed chat completion. */
export function chatCompletion(
  h: ResponseHead,
  out: {
    content: string;
    reasoning: string | null;
    finish: OpenAIFinish;
    usage: Usage;
    toolCalls?: ToolCallBody[];
    logprobs?: ChatLogprobs | null;
  },
): ChatCompletion {
  const calls = out.toolCalls ?? [];
  return {
    ...headFields(h, "chat.completion"),
    choices: [{
      index: 0,
      message: {
        role: "assistant" as const,
        // With tool calls and no text, content is null, as OpenAI answers.
        content: calls.length > 0 && out.content === "" ? null : out.content,
        reasoning_content: out.reasoning,
        reasoning: out.reasoning,
        refusal: null,
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
      },
      logprobs: out.logprobs ?? null,
      finish_reason: out.finish,
    }],
    usage: out.usage,
  };
}

/** The delta of one chat chunk. */
export interface ChatDelta {
  /** "assistant", on the first chunk only. */
  role?: "assistant";
  /** Response-channel text. */
  content?: string;
  /** Think-channel text. */
  reasoning_content?: string;
  /** The same text under the name newer vLLM clients read. */
  reasoning?: string;
  /** Tool calls: the first delta of a call has its id, type and name, later ones more arguments. */
  tool_calls?: {
    index: number;
    id?: string;
    type?: "function";
    function: { name?: string; arguments: string };
  }[];
}

/** One streamed chat chunk; `usage` is null on every chunk but the last when usage was asked. */
export function chatChunk(
  h: ResponseHead,
  delta: ChatDelta,
  finish: OpenAIFinish | null,
  includeUsage: boolean,
  logprobs: ChatLogprobs | null = null,
): ChatChunk {
  return {
    ...headFields(h, "chat.completion.chunk"),
    choices: [{ index: 0, delta, logprobs, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
  };
}

/** The last chunk of a stream that asked for usage: no choices, the usage. */
export function usageChunk(
  h: ResponseHead,
  object: "chat.completion.chunk" | "text_completion",
  u: Usage,
): ChatChunk | Completion {
  return {
    ...headFields(h, object),
    choices: [],
    usage: u,
  };
}

/** A non-streamed completion. */
export function completion(
  h: ResponseHead,
  out: { text: string; finish: OpenAIFinish; usage: Usage; logprobs?: CompletionLogprobs | null },
): Completion {
  return {
    ...headFields(h, "text_completion"),
    choices: [{ index: 0, text: out.text, logprobs: out.logprobs ?? null, finish_reason: out.finish }],
    usage: out.usage,
  };
}

/** One streamed completion chunk. */
export function completionChunk(
  h: ResponseHead,
  text: string,
  finish: OpenAIFinish | null,
  includeUsage: boolean,
  logprobs: CompletionLogprobs | null = null,
): Completion {
  return {
    ...headFields(h, "text_completion"),
    choices: [{ index: 0, text, logprobs, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
  };
}

/** `GET /v1/models`: every name served, the first one first. */
export function modelList(names: readonly string[], created: number): ModelList {
  return {
    object: "list" as const,
    data: names.map((id) => ({ id, object: "model" as const, created, owned_by: "k3" })),
  };
}
