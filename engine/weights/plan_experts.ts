/**
 * The plan's experts term: the routed-expert cache.
 *
 *   experts = slots x slot bytes   (slot = one expert rounded up to 4096, + 4096 for O_DIRECT
 *             alignment); slots = floor(cache budget / slot), at least top-k + 1, at most
 *             every expert; no --cache-gb: every expert gets a slot; no streaming: every
 *             expert resident
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { ALIGN, alignUp, GB, type PlanInput } from "./plan_input.ts";

/** The routed-expert cache's part of the plan. */
export interface ExpertsPlan {
  /** Every expert resident (no streaming). */
  resident: boolean;
  /** Cache slots (every expert when resident). */
  slots: number;
  /** Bytes of one slot. */
  slotBytes: number;
  /** Bytes of one routed expert. */
  expertBytes: number;
  /** Routed experts of the model. */
  total: number;
  /** Experts each token routes to. */
  topK: number;
  /** Bytes of the term. */
  bytes: number;
}

/** Bytes of a routed expert (MXFP4 packed + scales of w1, w3, w2). */
export function expertBytesOf(cfg: K3Config): number {
  const { latent, intermediate: I } = cfg.moe;
  return 2 * (I * latent / 2 + I * latent / 32) + (latent * I / 2 + latent * I / 32);
}

/** One expert-cache slot: room for an O_DIRECT read that starts up to 4095 bytes early. */
export function expertSlotBytes(expertBytes: number): number {
  return alignUp(expertBytes) + ALIGN;
}

/** Routed experts of the whole model (every MoE layer's). */
export function routedExperts(cfg: K3Config): number {
  return Math.max(0, cfg.numLayers - cfg.firstKDense) * cfg.moe.numExperts;
}

/**
 * The experts term for a cache budget (undefined: a slot for every expert). Throws K3Error
 * (exit 1) when the budget holds fewer than top-k + 1 slots.
 */
export function planExperts(
  input: PlanInput,
  streaming: boolean,
  cacheBudget: number | undefined,
  notes: string[],
): ExpertsPlan {
  const topK = input.cfg.moe.topK;
  const totalExperts = routedExperts(input.cfg);
  const slotBytes = expertSlotBytes(input.expertBytes);
  let slots: number;
  let expertsResident = false;
  if (!streaming) {
    slots = totalExperts;
    expertsResident = true;
  } else if (cacheBudget === undefined) {
    slots = totalExperts;
    notes.push("no --cache-gb: every expert gets a slot (read once, never evicted)");
  } else {
    slots = Math.min(totalExperts, Math.floor(cacheBudget / slotBytes));
    if (slots < Math.min(topK + 1, totalExperts)) {
      throw new K3Error(
        `memory plan: --cache-gb ${(cacheBudget / GB).toFixed(4)} holds ${slots} experts of ${
          (slotBytes / 1e6).toFixed(2)
        } MB; the expert cache needs at least top-k + 1 = ${topK + 1} slots (${
          ((topK + 1) * slotBytes / GB).toFixed(4)
        } GB)`,
      );
    }
  }
  return {
    resident: expertsResident,
    slots,
    slotBytes,
    expertBytes: input.expertBytes,
    total: totalExperts,
    topK,
    bytes: expertsResident ? totalExperts * input.expertBytes : slots * slotBytes,
  };
}
