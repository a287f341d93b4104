/**
 * The budgets a plan is made for: the trunk and expert-cache budgets the memory flags give,
 * and with `--preset auto` the ones sized from the available memory. Auto spends 90% of what
 * is left after the fixed parts (embedding and head, finals, state, drafts, scratch, the
 * fixed overhead), streaming the embedding and head if needed: with measured rates on the
 * split with the best predicted tokens/s (plan_predict.ts), without them trunk first (a
 * pinned trunk beats an expert cache) and the rest to experts.
 *
 * @module
 */

import { K3Error } from "../errors.ts";
import { embedHeadBytes } from "./plan_embed_head.ts";
import { expertSlotBytes, routedExperts } from "./plan_experts.ts";
import { FIXED_OVERHEAD_BYTES, GB, type PlanInput } from "./plan_input.ts";
import { streamedPredictor } from "./plan_predict.ts";
import { pinBudgets, pinLayersOnce, trunkBytes } from "./plan_trunk.ts";

/** The budgets the trunk and experts terms are planned for. */
export interface PlanBudgets {
  /** Bytes of trunk to pin and ring (undefined: every layer pinned). */
  trunk?: number;
  /** Bytes of expert cache (undefined: a slot for every expert). */
  cache?: number;
  /** Stream the embedding rows and lm_head chunks. */
  streamEmbed: boolean;
}

/**
 * The budgets for `sequences` whose states take `stateBytes` and speculation records
 * `draftBytes`. Throws K3Error (exit 1) when `--preset auto` cannot know the available
 * memory or the model does not fit in it; a note says what auto chose.
 */
export function planBudgets(
  input: PlanInput,
  streaming: boolean,
  sequences: number,
  fixed: { stateBytes: number; draftBytes: number; scratchBytes: number },
  notes: string[],
): PlanBudgets {
  const mem = input.mem;
  let streamEmbed = !!mem.streamEmbed;
  let trunkBudget = mem.trunkGB === undefined ? undefined : mem.trunkGB * GB;
  let cacheBudget = mem.cacheGB === undefined ? undefined : mem.cacheGB * GB;
  if (!streaming || mem.preset !== "auto" || (trunkBudget !== undefined && cacheBudget !== undefined)) {
    return { trunk: trunkBudget, cache: cacheBudget, streamEmbed };
  }
  const avail = input.available;
  if (avail === undefined) {
    throw new K3Error(
      "memory plan: --preset auto needs to know the available memory (MemAvailable), and this system does not say",
    );
  }
  const slotBytes = expertSlotBytes(input.expertBytes);
  const totalExperts = routedExperts(input.cfg);
  const trunkTotal = trunkBytes(input.layerBytes);
  const minCache = (input.cfg.moe.topK + 1) * slotBytes;
  const largest = Math.max(...input.layerBytes);
  // 90% of what is left after the fixed parts; stream the embedding and head if needed.
  const usableWith = (se: boolean) =>
    0.9 *
    (avail -
      (embedHeadBytes(input, se) + input.finalsBytes + fixed.stateBytes + fixed.draftBytes +
        fixed.scratchBytes + FIXED_OVERHEAD_BYTES));
  const trunkMin = input.packed ? Math.min(trunkTotal, 2 * largest) : trunkTotal;
  if (!streamEmbed && usableWith(false) < trunkMin + minCache) streamEmbed = true;
  const usable = usableWith(streamEmbed);
  const floor = (input.packed ? largest : trunkTotal) + minCache;
  if (usable < floor) {
    const need = floor / 0.9 + (avail - usable / 0.9);
    throw new K3Error(
      `memory plan: --preset auto: ${(avail / GB).toFixed(2)} GB available, this model needs at least ${
        (need / GB).toFixed(2)
      } GB` +
        (input.packed ? "" : " without a packed trunk; --trunk needs far less"),
    );
  }
  let byRate = false;
  if (input.rates && input.packed && trunkBudget === undefined && cacheBudget === undefined) {
    // Weigh every pin count (and streaming the embedding and head or not) by predicted
    // tokens/s; the cache gets what the pins leave. Ties go to more pins.
    const predict = streamedPredictor(input, sequences);
    let best = -1;
    for (const se of mem.streamEmbed ? [true] : [false, true]) {
      const room = usableWith(se);
      for (const t of [...pinBudgets(input.layerBytes)].reverse()) {
        if (t + minCache > room) continue;
        const cache = Math.max(minCache, Math.min(totalExperts * slotBytes, room - t));
        const { pinned, ring } = pinLayersOnce(input.layerBytes, t);
        const tps = predict(pinned, ring, Math.min(totalExperts, Math.floor(cache / slotBytes)), se).tokensPerSecond;
        if (tps > best * (1 + 1e-9)) {
          best = tps;
          [trunkBudget, cacheBudget, streamEmbed] = [t, cache, se];
        }
      }
    }
    byRate = best > 0;
  }
  // Without rates: pinned trunk beats expert cache: the trunk first, the rest to experts.
  trunkBudget ??= input.packed
    ? Math.max(Math.min(trunkTotal, usable - minCache), Math.min(trunkMin, usable - minCache))
    : trunkTotal;
  cacheBudget ??= Math.max(minCache, Math.min(totalExperts * slotBytes, usable - trunkBudget));
  notes.push(
    `auto: ${(avail / GB).toFixed(2)} GB available -> trunk ${(trunkBudget / GB).toFixed(3)} GB, expert cache ${
      (cacheBudget / GB).toFixed(3)
    } GB${streamEmbed && !mem.streamEmbed ? ", embedding and head streamed" : ""}${
      byRate ? " (the split with the best predicted tokens/s)" : ""
    }`,
  );
  return { trunk: trunkBudget, cache: cacheBudget, streamEmbed };
}
