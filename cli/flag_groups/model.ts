/**
 * The model flags (`--tok`, `--threads`, `--layers`, `--chunk`) of the commands that open
 * a model, and `--threads`' one rule: at most the cores, in every command.
 *
 * @module
 */

import type { FlagGroup } from "../flags.ts";
import { intFlag } from "../common.ts";
import type { ChunkRequest } from "../../engine/weights/plan_segment.ts";
import { MAX_PROMPT_IDS } from "../run_options.ts";

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

/** `--chunk`'s value: `auto` (also when absent), or a whole number of tokens from 1 to
 * MAX_PROMPT_IDS (a usage error otherwise). `auto` lets the memory plan choose the segment:
 * the whole prompt when the memory holds it (engine/weights/plan_segment.ts). */
export function chunkFlag(value: string | undefined): ChunkRequest {
  if (value === undefined || value.trim() === "auto") return "auto";
  return intFlag("chunk", value, 1, 1, MAX_PROMPT_IDS);
}
