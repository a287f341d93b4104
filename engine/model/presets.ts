/**
 * The named memory budgets (`--preset NAME`, the README's table): how much trunk to pin and
 * how much expert cache to keep, in GB, for the released model's shape (shapes.ts). The
 * memory plan (weights/plan.ts) turns one into pinned layers, a ring and cache slots.
 *
 * @module
 */

/** A named memory budget, in GB (1e9 bytes). */
export interface Preset {
  /** Name (--preset NAME). */
  name: string;
  /** GB of trunk to pin (NaN: auto). */
  trunkGB: number;
  /** GB of expert cache (NaN: auto). */
  cacheGB: number;
  /** Stream embedding rows and lm_head chunks instead of keeping them resident. */
  streamEmbed: boolean;
  /** What it does. */
  about: string;
}

/** The presets (trunk / expert cache GB, the README's table), plus `auto`, sized from MemAvailable. */
export const PRESETS: Preset[] = [
  {
    name: "ultra",
    trunkGB: 2.5,
    cacheGB: 0.31,
    streamEmbed: true,
    about: "smallest: also streams embedding rows and lm_head chunks",
  },
  {
    name: "laptop",
    trunkGB: 3,
    cacheGB: 1,
    streamEmbed: false,
    about: "trunk streamed, embedding and lm_head resident",
  },
  { name: "desktop", trunkGB: 16, cacheGB: 10, streamEmbed: false, about: "a tenth of the trunk pinned" },
  { name: "workstation", trunkGB: 60, cacheGB: 30, streamEmbed: false, about: "half the trunk pinned" },
  { name: "server", trunkGB: 110, cacheGB: 13, streamEmbed: false, about: "trunk resident" },
  {
    name: "max",
    trunkGB: 110,
    cacheGB: 109,
    streamEmbed: false,
    about: "trunk resident, large expert cache",
  },
  {
    name: "auto",
    trunkGB: NaN,
    cacheGB: NaN,
    streamEmbed: false,
    about: "sized from MemAvailable at start-up",
  },
];
