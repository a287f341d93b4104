/**
 * The model flags (`--tok`, `--threads`, `--layers`, `--chunk`) of the commands that open
 * a model, and `--threads`' one rule: at most the cores, in every command.
 *
 * @module
 */

import type { FlagGroup } from "../flags.ts";
import { intFlag } from "../common.ts";
import type { ChunkRequest } from "../../engine/weights/plan_segment.ts";
import { type K3Config, MAX_CONTEXT, modelWindow } from "../../engine/model/config.ts";
import { usageError } from "../../engine/errors.ts";
import type { OpenOptions } from "../../engine/open.ts";

/** The model group. */
export const MODEL_GROUP: FlagGroup = {
  name: "model",
  title: "model",
  flags: {
    tok: {
      type: "string",
      value: "DIR",
      help: "tokenizer directory (default: the model directory when it has\ntiktoken.model)",
    },
    threads: {
      type: "string",
      short: "t",
      value: "N",
      help: "compute threads (default and most: the cores; never changes a token)",
    },
    layers: { type: "string", value: "N", help: "diagnostics: bind and run only the first N layers" },
    chunk: {
      type: "string",
      value: "N|auto",
      help:
        "prompt tokens per forward pass, each a read of the model\n(default auto: the whole prompt when the memory holds it)",
    },
  },
};

/** What the model flags asked for. */
export interface ModelFlags {
  /** Tokenizer directory (--tok). */
  tokDir?: string;
  /** Compute threads (capped at the cores). */
  threads: number;
  /** Bind and run only the first N layers. */
  layers?: number;
  /** Prompt tokens per forward pass (a segment), or `auto`: the plan's. */
  chunk: ChunkRequest;
}

/** --threads, capped at this machine's cores: more workers than cores only contend (and a
 * thread count never changes a token), so the cap is said on stderr, not refused. */
export function threadCount(value: string | undefined, cores = navigator.hardwareConcurrency): number {
  const n = intFlag("threads", value, cores, 1, 256);
  if (n <= cores) return n;
  console.error(`k3: --threads ${n}: this machine has ${cores} cores; using ${cores}`);
  return cores;
}

/** Reads the model group from parseArgs values. */
export function modelFlags(values: Record<string, unknown>): ModelFlags {
  return {
    layers: values.layers === undefined ? undefined : intFlag("layers", values.layers as string, 0, 1, 100000),
    chunk: chunkFlag(values.chunk as string | undefined),
    tokDir: values.tok as string | undefined,
    threads: threadCount(values.threads as string | undefined),
  };
}

/** The largest `--chunk N`: longer prompts run in segments of N (and `auto` sizes the segment
 * by the memory instead). */
export const MAX_CHUNK = 8192;

/** `--chunk`'s value: `auto` (also when absent), or a whole number of tokens from 1 to
 * MAX_CHUNK (a usage error otherwise). `auto` lets the memory plan choose the segment:
 * the whole prompt when the memory holds it (engine/weights/plan_segment.ts). */
export function chunkFlag(value: string | undefined): ChunkRequest {
  if (value === undefined || value.trim() === "auto") return "auto";
  return intFlag("chunk", value, 1, 1, MAX_CHUNK);
}

/** A `--context` request (serve, chat): N positions a sequence, or `auto`. */
export type ContextRequest = number | "auto";

/** `--context`'s value: `auto` (also when absent), or a whole number of positions from `min`
 * to MAX_CONTEXT (a usage error otherwise). */
export function contextFlag(value: string | undefined, min: number): ContextRequest {
  if (value === undefined || value.trim() === "auto") return "auto";
  return intFlag("context", value, min, min, MAX_CONTEXT);
}

/** The help of `--context N|auto` for `what` ("positions per sequence, ..."). */
export function contextHelp(what: string): string {
  return `${what}, or auto (the default): the most the memory\nplan holds, up to the model's window`;
}

/**
 * How a model opens for a `--context` request with `sequences` sequences: `auto` asks for
 * the most positions the plan holds up to the model's window (engine/open.ts
 * fitCapacity); N beyond the window is a usage error, and N the memory cannot hold is
 * refused naming the most it can (exit 2).
 */
export function contextOpenOptions(
  context: ContextRequest,
  cfg: K3Config,
  sequences: number,
): Pick<OpenOptions, "capacity" | "autoCapacity" | "capacityRefusal"> {
  const window = modelWindow(cfg);
  if (context === "auto") return { capacity: window, autoCapacity: true };
  if (context > window) {
    throw usageError(`--context ${context}: the model's window is ${window} positions (max_position_embeddings)`);
  }
  return {
    capacity: context,
    capacityRefusal: (most) =>
      `--context ${context} does not fit the memory plan at this budget: it holds at most ${most} positions${
        sequences > 1 ? ` a sequence for ${sequences} sequences (or lower --parallel)` : ""
      }; lower --context, use --context auto, or raise the budget (--preset, --trunk-gb, --cache-gb)`,
  };
}
