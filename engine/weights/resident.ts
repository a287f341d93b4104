/**
 * The simplest WeightSource: every tensor read from the checkpoint into memory at start-up,
 * experts included. Right for small models and for the oracle tests; the streamed trunk and
 * the expert cache give the same tokens with bounded memory.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { expertView, locateExpert, readExpert } from "./experts.ts";
import type { Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { WeightSource } from "../model/weight_source.ts";
import type { LayerWeights } from "../model/layer_weights.ts";
import type { Compute } from "../native/pool.ts";
import type { Checkpoint } from "./safetensors.ts";
import type { Expert, F32, Matrix } from "../native/tensors.ts";
import { globalTensors, HEAD_NAME, layerTensors, PREFIX, type TensorSpec } from "../model/tensors.ts";
import { type BoundTensors, loadTensors } from "./bind.ts";

/** Embedding and lm_head bound as matrices, plus the final vectors. */
export interface Globals {
  /** The embedding. */
  embed: Matrix;
  /** The lm_head. */
  head: Matrix;
  /** The final vectors. */
  tensors: BoundTensors;
}

/** Loads embed_tokens, lm_head and the final norm / AttnRes vectors. */
export async function loadGlobals(k: Kernels, cfg: K3Config, ckpt: Checkpoint): Promise<Globals> {
  const V = cfg.vocabSize, D = cfg.hiddenSize;
  const specs: TensorSpec[] = [
    ...globalTensors(cfg).map((t) => ({ ...t, name: PREFIX + t.name })),
    { name: PREFIX + "embed_tokens.weight", shape: [V, D], keep: "matrix" },
    { name: HEAD_NAME, shape: [V, D], keep: "matrix" },
  ];
  const tensors = await loadTensors(k, ckpt, specs, "");
  return {
    embed: tensors.matrix(PREFIX + "embed_tokens.weight"),
    head: tensors.matrix(HEAD_NAME),
    tensors,
  };
}

/** Writes row `id` of an embedding matrix as f32. */
export function embedRow(k: Kernels, embed: Matrix, id: number, dst: NonNullable<Deno.PointerValue>): void {
  const D = embed.cols;
  if (embed.wtype === 1) {
    k.k3_bf16_to_f32(Deno.UnsafePointer.offset(embed.ptr, id * D * 2), dst, D);
  } else {
    const src = new Float32Array(Deno.UnsafePointerView.getArrayBuffer(embed.ptr, D * 4, id * D * 4));
    new Float32Array(Deno.UnsafePointerView.getArrayBuffer(dst, D * 4)).set(src);
  }
}

/** Every weight in RAM. */
export class ResidentWeights implements WeightSource {
  readonly finalNorm: F32;
  /** output_attn_res_norm. */
  readonly outputResNorm: F32;
  /** output_attn_res_proj. */
  readonly outputResProj: F32;

  private constructor(
    private readonly k: Kernels,
    private readonly cfg: K3Config,
    private readonly globals: Globals,
    private readonly layers: BoundTensors[],
    private readonly expertsByLayer: Map<number, Expert[]>,
    private readonly buffers: NativeBuffer[],
  ) {
    const g = globals.tensors;
    this.finalNorm = g.vector(PREFIX + "norm.weight");
    this.outputResNorm = g.vector(PREFIX + "output_attn_res_norm.weight");
    this.outputResProj = g.vector(PREFIX + "output_attn_res_proj.weight");
  }

  /** Reads the whole model. `onLayer` reports progress. */
  static async load(
    k: Kernels,
    cfg: K3Config,
    ckpt: Checkpoint,
    opts: { layers?: number; onLayer?: (done: number, total: number) => void } = {},
  ): Promise<ResidentWeights> {
    const nLayers = opts.layers ?? cfg.numLayers;
    const globals = await loadGlobals(k, cfg, ckpt);
    const layers: BoundTensors[] = [];
    const expertsByLayer = new Map<number, Expert[]>();
    const buffers: NativeBuffer[] = [];
    for (let L = 0; L < nLayers; L++) {
      const bound = await loadTensors(k, ckpt, layerTensors(cfg, L));
      bound.layerWeights(cfg, L); // the typed record, built once with the layer
      layers.push(bound);
      if (L >= cfg.firstKDense) {
        const locs = Array.from({ length: cfg.moe.numExperts }, (_, E) => locateExpert(cfg, ckpt, L, E));
        const list: Expert[] = new Array(locs.length);
        // Contiguous experts (the usual layout) are read together, deep and direct; an expert
        // whose tensors are scattered is read tensor by tensor into one slot.
        const runs = locs.filter((loc) => loc.contiguous);
        await ckpt.readTensors(
          k,
          runs.map((loc) => ({
            name: `layer ${L} expert ${loc.expert}`,
            file: loc.file,
            offset: loc.offset,
            bytes: loc.bytes,
          })),
          (i, { buf, delta }) => {
            buffers.push(buf);
            const loc = runs[i];
            list[loc.expert] = expertView(cfg, { ...loc, slotOffsets: loc.slotOffsets.map((o) => o + delta) }, buf);
          },
        );
        for (const loc of locs.filter((loc) => !loc.contiguous)) {
          const slot = NativeBuffer.alloc(k, loc.bytes, `expert ${L}.${loc.expert}`);
          buffers.push(slot);
          await readExpert(ckpt, loc, slot);
          list[loc.expert] = expertView(cfg, loc, slot);
        }
        expertsByLayer.set(L, list);
      }
      opts.onLayer?.(L + 1, nLayers);
    }
    return new ResidentWeights(k, cfg, globals, layers, expertsByLayer, buffers);
  }

  layer(L: number): LayerWeights {
    return this.layers[L].layerWeights(this.cfg, L);
  }

  experts(L: number, ids: number[]): Map<number, Expert> {
    const list = this.expertsByLayer.get(L)!;
    return new Map(ids.map((e) => [e, list[e]]));
  }

  embed(id: number, dst: NonNullable<Deno.PointerValue>): void {
    embedRow(this.k, this.globals.embed, id, dst);
  }

  head(x: NonNullable<Deno.PointerValue>, y: NonNullable<Deno.PointerValue>, ntok: number, compute: Compute): void {
    compute.matmul(this.globals.head, x, y, ntok);
  }

  /** Frees every tensor. */
  free(): void {
    this.globals.tensors.free();
    for (const l of this.layers) l.free();
    for (const b of this.buffers) b.free();
  }
}
