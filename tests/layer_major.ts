/**
 * The long prompt of the layer-major tests (tests/e2e/layer_major_test.ts, and its float64
 * comparison in tests/oracle/layer_major_reference_test.ts) and greedy decoding after it.
 *
 * @module
 */

import { generate } from "../engine/generate/generate.ts";
import { openModel, type OpenOptions } from "../engine/open.ts";
import { TINY } from "./helpers.ts";

/** 600 ids on the tiny model: many AttnRes blocks, KDA chunks and MLA layers. */
export const PROMPT = Array.from({ length: 600 }, (_, i) => ((i * 7) % 700) + 1);
export const GEN = 3;
export const CAPACITY = PROMPT.length + GEN + 1;

/** The tokens and the logit bits of each token of `gen` greedy steps after `prompt`. */
export interface Run {
  tokens: number[];
  logits: Float32Array[];
}

export async function greedy(opts: Partial<OpenOptions>, prompt = PROMPT, gen = GEN): Promise<Run> {
  const opened = await openModel(TINY, { capacity: CAPACITY, ...opts });
  try {
    const logits: Float32Array[] = [];
    const steps = await generate(opened.model, prompt, {
      gen,
      incremental: true,
      onLogits: (l) => void logits.push(l.slice()),
    });
    return { tokens: steps.map((s) => s.token), logits };
  } finally {
    await opened.close();
  }
}
