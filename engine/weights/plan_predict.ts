/**
 * The plan's prediction of decode tokens/s (throughput.ts) for a way of spending memory:
 * which trunk layers are pinned, the ring, the expert-cache slots, the embedding and head
 * streamed or not. `--preset auto` weighs its choices by it (plan_auto.ts) and the plan
 * prints the one it made.
 *
 * @module
 */

import { DEFAULT_DRAFTING, type PassShape, type Prediction, predictPass } from "./throughput.ts";
import type { PlanInput } from "./plan_input.ts";
import { trunkBytes } from "./plan_trunk.ts";

/** A plan's prediction: with every sequence decoding, at the disk's measured rate. */
export type PlanPrediction = Prediction & { sequences: number; diskBytesPerSecond: number };

/** The pass throughput.ts predicts for a plan's input. */
export function passShape(input: PlanInput): PassShape {
  const cfg = input.cfg;
  return {
    trunkBytes: trunkBytes(input.layerBytes),
    headBytes: input.headBytes,
    moeLayers: Math.max(0, cfg.numLayers - cfg.firstKDense),
    experts: cfg.moe.numExperts,
    topK: cfg.moe.topK,
    expertBytes: input.expertBytes,
    layers: input.layerBytes,
    streamLayers: input.layerStreamBytes,
    codedLayers: input.layerCodedBytes,
    guessRight: input.guessRight,
  };
}

/** What a streamed plan is predicted to do with these layers pinned, this ring and cache slots. */
export type StreamedPredictor = (
  pinned: number[],
  ringBytes: number,
  slots: number,
  headStreamed: boolean,
) => Prediction;

/** The predictor of streamed plans for `sequences` (needs `input.rates`). */
export function streamedPredictor(input: PlanInput, sequences: number): StreamedPredictor {
  const shape = passShape(input);
  return (pinned, ringBytes, slots, headStreamed) =>
    predictPass(shape, {
      sequences,
      streamedBytes: (input.layerStreamBytes ?? input.layerBytes).reduce(
        (a, b, L) => a + (pinned.includes(L) ? 0 : b),
        0,
      ),
      streamedLayers: input.layerBytes.map((_, L) => L).filter((L) => !pinned.includes(L)),
      ringBytes,
      headStreamed,
      slots,
      ...(input.drafts ? DEFAULT_DRAFTING : {}),
    }, input.rates!);
}

/** The plan's prediction (null: no rates given): streamed with its pins, ring, slots and
 * embedding choice, or everything resident. */
export function planPrediction(
  input: PlanInput,
  sequences: number,
  streamed: { pinned: number[]; ringBytes: number; slots: number; headStreamed: boolean } | null,
  totalExperts: number,
): PlanPrediction | null {
  if (!input.rates) return null;
  const p = streamed
    ? streamedPredictor(input, sequences)(streamed.pinned, streamed.ringBytes, streamed.slots, streamed.headStreamed)
    : predictPass(passShape(input), { sequences, streamedBytes: 0, slots: totalExperts, resident: true }, input.rates);
  return { ...p, sequences, diskBytesPerSecond: input.rates.disk };
}
