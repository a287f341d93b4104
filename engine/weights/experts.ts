/**
 * Routed experts: where their bytes are in the checkpoint, and how one is read into a slot.
 *
 * An expert's six tensors normally form one contiguous run in one shard, so one read
 * fetches it; otherwise each tensor is read into its place in the slot.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import type { NativeBuffer } from "../native/memory.ts";
import type { Checkpoint, TensorInfo } from "./safetensors.ts";
import type { Expert } from "../native/tensors.ts";
import { checkTensor, expertTensors, PREFIX } from "../model/tensors.ts";

/** Where one expert's bytes are, and where each tensor lands inside a slot. */
export interface ExpertLocation {
  /** Layer index. */
  layer: number;
  /** Expert index. */
  expert: number;
  /** Shard file. */
  file: string;
  /** Set when the six tensors are one contiguous run: one read of `bytes` at `offset`. */
  contiguous: boolean;
  /** Offset of its first byte in the file. */
  offset: number;
  /** Bytes to read. */
  bytes: number;
  /** The six tensors (w1 packed, w1 scale, w3 packed, w3 scale, w2 packed, w2 scale). */
  tensors: TensorInfo[];
  /** Byte offset of each tensor inside the slot. */
  slotOffsets: number[];
}

/** Bytes of one expert slot. */
export function expertBytes(cfg: K3Config): number {
  const { latent, intermediate: I } = cfg.moe;
  return 2 * (I * latent / 2 + I * latent / 32) + (latent * I / 2 + latent * I / 32);
}

/** Finds and checks expert E of layer L. */
export function locateExpert(cfg: K3Config, ckpt: Checkpoint, L: number, E: number): ExpertLocation {
  const specs = expertTensors(cfg, L, E);
  const tensors = specs.map((s) => {
    const t = ckpt.get(PREFIX + s.name);
    checkTensor(t, s);
    return t;
  });
  const total = tensors.reduce((a, t) => a + t.bytes, 0);
  const start = Math.min(...tensors.map((t) => t.offset));
  const end = Math.max(...tensors.map((t) => t.offset + t.bytes));
  const sameFile = tensors.every((t) => t.file === tensors[0].file);
  const contiguous = sameFile && end - start === total;
  let slotOffsets: number[];
  if (contiguous) {
    slotOffsets = tensors.map((t) => t.offset - start);
  } else {
    let at = 0;
    slotOffsets = tensors.map((t) => (at += t.bytes) - t.bytes);
  }
  return { layer: L, expert: E, file: tensors[0].file, contiguous, offset: start, bytes: total, tensors, slotOffsets };
}

/** Reads an expert into `slot` (at least loc.bytes long). */
export async function readExpert(ckpt: Checkpoint, loc: ExpertLocation, slot: NativeBuffer): Promise<void> {
  try {
    if (loc.contiguous) {
      await ckpt.readAt(loc.file, loc.offset, slot.u8.subarray(0, loc.bytes));
    } else {
      for (let i = 0; i < 6; i++) {
        const t = loc.tensors[i];
        await ckpt.read(t, slot.u8.subarray(loc.slotOffsets[i], loc.slotOffsets[i] + t.bytes));
      }
    }
  } catch (e) {
    throw new K3Error(`layer ${loc.layer} expert ${loc.expert}: read failed: ${(e as Error).message}`);
  }
}

/** The expert's matrices as pointers into its slot. */
export function expertView(cfg: K3Config, loc: ExpertLocation, slot: NativeBuffer): Expert {
  const { latent, intermediate: I } = cfg.moe;
  const p = (i: number) => slot.at(loc.slotOffsets[i]);
  return {
    w1: { packed: p(0), scales: p(1), rows: I, cols: latent },
    w3: { packed: p(2), scales: p(3), rows: I, cols: latent },
    w2: { packed: p(4), scales: p(5), rows: latent, cols: I },
  };
}
