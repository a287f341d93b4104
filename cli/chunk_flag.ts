/**
 * `--chunk N|auto`: the prefill segment, prompt tokens one forward pass runs. `auto` (the
 * default) lets the memory plan choose: the whole prompt when the memory holds it
 * (engine/weights/plan_segment.ts).
 *
 * @module
 */

import type { ChunkRequest } from "../engine/weights/plan_segment.ts";
import { intFlag } from "./common.ts";

/** The help lines of `--chunk` (the first without its two-space indent). */
export const CHUNK_HELP = `--chunk N|auto    prompt tokens per forward pass, each a read of the model
                    (default auto: the whole prompt when the memory holds it)`;

/** `--chunk`'s value: `auto` (also when absent), or a whole number of tokens from 1 to `max`
 * (a usage error otherwise). */
export function chunkFlag(value: string | undefined, max: number): ChunkRequest {
  if (value === undefined || value.trim() === "auto") return "auto";
  return intFlag("chunk", value, 1, 1, max);
}
