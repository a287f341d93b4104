/**
 * The model flags (`--tok`, `--threads`, `--layers`, `--chunk`) of the commands that open
 * a model, and `--threads`' one rule: at most the cores, in every command.
 *
 * @module
 */

import type { FlagGroup } from "../flags.ts";
import { intFlag } from "../common.ts";

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
    chunk: { type: "string", value: "N", help: "prefill tokens per forward call (default 16, 1..256)" },
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
  /** Prefill tokens per forward call. */
  chunk: number;
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
    chunk: intFlag("chunk", values.chunk as string | undefined, 16, 1, 256),
    tokDir: values.tok as string | undefined,
    threads: threadCount(values.threads as string | undefined),
  };
}
