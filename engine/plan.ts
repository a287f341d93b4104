/**
 * Memory budgets: the presets and the options that choose how much of the trunk is pinned
 * and how many expert slots are cached. More memory buys speed, never a different token.
 *
 * @module
 */

/** A named memory budget, in GB (1e9 bytes). */
export interface Preset {
  name: string;
  trunkGB: number;
  cacheGB: number;
  /** Stream embedding rows and lm_head chunks instead of keeping them resident. */
  streamEmbed: boolean;
  about: string;
}

/** The anchor's presets (trunk / expert cache), plus `auto`, sized from MemAvailable. */
export const PRESETS: Preset[] = [
  { name: "ultra", trunkGB: 2.5, cacheGB: 0.31, streamEmbed: true, about: "smallest: also streams embedding rows and lm_head chunks" },
  { name: "laptop", trunkGB: 3, cacheGB: 1, streamEmbed: false, about: "8 GB machines" },
  { name: "desktop", trunkGB: 16, cacheGB: 10, streamEmbed: false, about: "32 GB machines" },
  { name: "workstation", trunkGB: 60, cacheGB: 30, streamEmbed: false, about: "128 GB machines" },
  { name: "server", trunkGB: 110, cacheGB: 13, streamEmbed: false, about: "trunk resident" },
  { name: "max", trunkGB: 110, cacheGB: 109, streamEmbed: false, about: "trunk resident, large expert cache" },
  { name: "auto", trunkGB: NaN, cacheGB: NaN, streamEmbed: false, about: "sized from MemAvailable at start-up" },
];

/** What the memory flags asked for (undefined: everything resident, no trunk file). */
export interface MemoryOptions {
  /** Directory of a packed trunk (`k3 pack`); without it the trunk is read from the checkpoint. */
  trunkDir?: string;
  /** Bytes of trunk layers to pin; the rest is streamed through a ring. */
  trunkGB?: number;
  /** Bytes of expert cache. */
  cacheGB?: number;
  /** Stream embedding rows and lm_head chunks. */
  streamEmbed?: boolean;
  /** The preset last named, if any. */
  preset?: string;
}
