/**
 * Named model shapes: configs of models known by their shape alone, beside the config
 * reader (config.ts), for plans of models that are not on disk (`k3 presets`).
 *
 * @module
 */

import type { K3Config } from "./config.ts";

/** The released Kimi K3 shape (for `k3 presets`). */
export function releasedK3(): K3Config {
  const layerKinds = Array.from(
    { length: 93 },
    (_, L) => (L % 4 === 3 || L === 92 ? "mla" : "kda") as "mla" | "kda",
  );
  return {
    hiddenSize: 7168,
    numLayers: 93,
    vocabSize: 163840,
    rmsNormEps: 1e-5,
    layerKinds,
    kda: { numHeads: 96, headDim: 128, convKernel: 4, gateLowerBound: -5 },
    mla: { numHeads: 96, qLoraRank: 1536, kvLoraRank: 512, nopeDim: 128, ropeDim: 64, vDim: 128 },
    moe: {
      numExperts: 896,
      topK: 16,
      numShared: 2,
      latent: 3584,
      intermediate: 3072,
      routedScaling: 1,
    },
    firstKDense: 1,
    denseIntermediate: 33792,
    attnResBlock: 12,
    situBeta: 4,
    situLinearBeta: 25,
    bosId: 163584,
    eosId: 163586,
    quantGroup: 32,
  };
}
