/**
 * The plan's embed/head term: the embedding and the lm_head, both resident, or (ultra)
 * streamed through one embedding-row buffer and two lm_head chunks (head_stream.ts).
 *
 * @module
 */

import { ALIGN, alignUp, type PlanInput } from "./plan_input.ts";

/** lm_head chunk streamed at a time in ultra (two are allocated: one read while one computes). */
export const HEAD_CHUNK_BYTES = 32 * 1024 * 1024;

/** The embedding and lm_head's part of the plan. */
export interface EmbedHeadPlan {
  /** Streamed (rows and chunks) rather than resident. */
  streamed: boolean;
  /** Bytes of the term. */
  bytes: number;
}

/** Bytes of the embedding and lm_head: both matrices, or streamed, one row buffer (plus
 * alignment room) and two lm_head chunks of whole rows. */
export function embedHeadBytes(input: Pick<PlanInput, "cfg" | "embedBytes" | "headBytes">, streamed: boolean): number {
  const V = input.cfg.vocabSize;
  const headRow = input.headBytes / V;
  return streamed
    ? alignUp(input.embedBytes / V) + 2 * ALIGN +
      2 *
        (alignUp(
          Math.min(
            input.headBytes,
            Math.max(1, Math.floor(HEAD_CHUNK_BYTES / headRow)) * headRow,
          ),
        ) + ALIGN)
    : input.embedBytes + input.headBytes;
}

/** The embed/head term. */
export function planEmbedHead(input: PlanInput, streamed: boolean): EmbedHeadPlan {
  return { streamed, bytes: embedHeadBytes(input, streamed) };
}
