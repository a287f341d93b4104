/**
 * Binding checkpoint tensors to typed views in native memory: every tensor the model binds
 * checked before anything is allocated, then read and bound. Matrices stay BF16 or F32 as
 * stored (F16 is widened to F32, exactly); vectors are widened to F32. Routed experts stay
 * packed MXFP4 (experts.ts).
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { EXIT, K3Error } from "../errors.ts";
import { type Kernels, WTYPE } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { F32, Matrix } from "../native/tensors.ts";
import {
  boundBytes,
  checkTensor,
  expertTensors,
  globalTensors,
  HEAD_NAME,
  layerTensors,
  PREFIX,
  type TensorSpec,
} from "../model/tensors.ts";
import { type LayerWeights, layerWeights, type NamedTensors } from "../model/layer_weights.ts";
import type { Checkpoint } from "./safetensors.ts";

/**
 * Checks that every tensor the model binds is present with the right shape and dtype,
 * before anything is allocated, so a bad checkpoint fails fast with the tensor named.
 */
export function checkCheckpoint(cfg: K3Config, ckpt: Checkpoint): void {
  const D = cfg.hiddenSize, V = cfg.vocabSize;
  const check = (specs: TensorSpec[]) => {
    for (const spec of specs) checkTensor(ckpt.get(PREFIX + spec.name), spec);
  };
  check(globalTensors(cfg));
  check([{ name: "embed_tokens.weight", shape: [V, D], keep: "matrix" }]);
  checkTensor(ckpt.get(HEAD_NAME), { name: HEAD_NAME, shape: [V, D], keep: "matrix" });
  for (let L = 0; L < cfg.numLayers; L++) {
    check(layerTensors(cfg, L));
    if (L >= cfg.firstKDense) {
      for (let E = 0; E < cfg.moe.numExperts; E++) check(expertTensors(cfg, L, E));
    }
  }
}

/** The part of the checkpoint that is the language model (vision tensors are ignored). */
const LM_PREFIX = "language_model.";

/**
 * Refuses (exit 2) a config that leaves a language-model tensor of the checkpoint unused
 * (e.g. `num_shared_experts: 0` beside shared-expert tensors, or too few layers): the
 * engine would run a different model than the checkpoint holds. `cfg` is the whole
 * model's config (not a --layers prefix).
 */
export function checkAccounted(cfg: K3Config, ckpt: Checkpoint, source = `${ckpt.dir}/config.json`): void {
  const used = new Set<string>([PREFIX + "embed_tokens.weight", HEAD_NAME]);
  for (const t of globalTensors(cfg)) used.add(PREFIX + t.name);
  for (let L = 0; L < cfg.numLayers; L++) {
    for (const t of layerTensors(cfg, L)) used.add(PREFIX + t.name);
    if (L >= cfg.firstKDense) {
      for (let E = 0; E < cfg.moe.numExperts; E++) for (const t of expertTensors(cfg, L, E)) used.add(PREFIX + t.name);
    }
  }
  const unused: string[] = [];
  for (const name of ckpt.tensors.keys()) {
    if (name.startsWith(LM_PREFIX) && !used.has(name)) unused.push(name);
  }
  if (unused.length > 0) {
    throw new K3Error(
      `${source}: cannot read the model config with confidence: the checkpoint has ${unused.length} language-model tensor${
        unused.length > 1 ? "s" : ""
      } this config does not use (first: ${
        JSON.stringify(unused.sort()[0])
      }); check num_hidden_layers, num_shared_experts, num_experts and first_k_dense_replace`,
      EXIT.usage,
    );
  }
}

/** Bytes of the trunk's parts once bound from the checkpoint, for the plan without --trunk. */
export function boundSizes(
  cfg: K3Config,
  ckpt: Checkpoint,
): { layerBytes: number[]; embedBytes: number; headBytes: number; finalsBytes: number } {
  const bound = (name: string, keep: "matrix" | "vector") => boundBytes(ckpt.get(name), keep);
  const layerBytes = Array.from(
    { length: cfg.numLayers },
    (_, L) =>
      layerTensors(cfg, L).reduce(
        (a, s) => a + bound(PREFIX + s.name, s.keep as "matrix" | "vector"),
        0,
      ),
  );
  return {
    layerBytes,
    embedBytes: bound(PREFIX + "embed_tokens.weight", "matrix"),
    headBytes: bound(HEAD_NAME, "matrix"),
    finalsBytes: globalTensors(cfg).reduce((a, s) => a + bound(PREFIX + s.name, "vector"), 0),
  };
}

/** Widens n BF16 or F16 elements at `src` to F32 at `dst`. */
function widen(k: Kernels, dtype: string, src: Deno.PointerValue, dst: Deno.PointerValue, n: number): void {
  if (dtype === "BF16") k.k3_bf16_to_f32(src, dst, n);
  else k.k3_f16_to_f32(src, dst, n);
}

/** A set of bound tensors of one layer (or of the globals), by short name. */
export class BoundTensors implements NamedTensors {
  private record?: LayerWeights;

  /** Tensors bound by name, freed together. */
  constructor(
    readonly matrices: Map<string, Matrix>,
    readonly vectors: Map<string, F32>,
    readonly owned: NativeBuffer[],
  ) {}

  /** These tensors as layer L's typed record: built on the first call, then kept with them. */
  layerWeights(cfg: K3Config, L: number): LayerWeights {
    return this.record ??= layerWeights(cfg, L, this);
  }

  /** The matrix `name`; throws when it was not bound as one. */
  matrix(name: string): Matrix {
    const m = this.matrices.get(name);
    if (!m) throw new Error(`internal: matrix ${name} not bound`);
    return m;
  }

  /** The vector `name`; throws when it was not bound as one. */
  vector(name: string): F32 {
    const v = this.vectors.get(name);
    if (!v) throw new Error(`internal: vector ${name} not bound`);
    return v;
  }

  /** Frees every bound tensor. */
  free(): void {
    for (const b of this.owned) b.free();
  }
}

/**
 * Reads and binds the given tensors from the checkpoint, one native buffer each (tensors
 * that need widening are read into a temporary buffer first). `prefix` is prepended to
 * spec names.
 */
export async function loadTensors(
  k: Kernels,
  ckpt: Checkpoint,
  specs: TensorSpec[],
  prefix = PREFIX,
): Promise<BoundTensors> {
  const matrices = new Map<string, Matrix>();
  const vectors = new Map<string, F32>();
  const owned: NativeBuffer[] = [];
  try {
    // Every tensor is checked before anything is allocated; then all are read together
    // (readTensors: deep direct reads) and each is bound as soon as its bytes are in.
    const tensors = specs.map((spec) => {
      const t = ckpt.get(prefix + spec.name);
      checkTensor(t, spec);
      return t;
    });
    await ckpt.readTensors(k, tensors, (i, { buf, delta }) => {
      const t = tensors[i], spec = specs[i];
      owned.push(buf);
      let ptr = buf.at(delta);
      const widened = boundBytes(t, spec.keep) !== t.bytes;
      if (widened) {
        const elems = t.bytes / 2;
        const wide = NativeBuffer.alloc(k, elems * 4, t.name);
        owned.push(wide);
        widen(k, t.dtype, ptr, wide.ptr, elems);
        owned.splice(owned.indexOf(buf), 1);
        buf.free();
        ptr = wide.ptr;
      }
      if (spec.keep === "matrix") {
        const wtype = widened || t.dtype === "F32" ? WTYPE.f32 : WTYPE.bf16;
        matrices.set(spec.name, { ptr, wtype, rows: spec.shape[0], cols: spec.shape[1] });
      } else if (spec.keep === "vector") {
        vectors.set(spec.name, {
          ptr,
          f: new Float32Array(Deno.UnsafePointerView.getArrayBuffer(ptr, boundBytes(t, spec.keep))),
        });
      }
    });
  } catch (e) {
    for (const b of owned) b.free();
    throw e;
  }
  return new BoundTensors(matrices, vectors, owned);
}
