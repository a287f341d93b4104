/**
 * A real-width slice of Kimi K3 for benchmarks, written at disk speed: the released widths
 * (hidden 7168, 96 KDA heads of 128, MLA with 96 heads, 3584-wide latent experts of 3072),
 * a few layers, the released router width (896 experts, top-16) and a smaller vocabulary.
 * Correctness does not depend on the values, only the bytes read and the time, so the
 * values are random but valid and of sensible scale: bf16 matrices uniform in
 * +-sqrt(3 / cols) (outputs keep the input's scale), norms 1, MXFP4 nibbles random with
 * group scales near 2^-7. Each matrix repeats a 16 MB pool of random values from a random
 * offset, which keeps writing at disk speed.
 *
 * The slice is cached in a folder outside the repository and reused while its recipe
 * matches (`slice.json`); `--clean` deletes it.
 *
 *   deno run -A bench/slice.ts [--dir DIR] [--layers 3] [--experts 896] [--clean]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { parseConfig } from "../engine/model/config.ts";
import { readManifest, VERSION as TRUNK_VERSION } from "../engine/weights/manifest.ts";
import { EXPERTS_FILE, parseExpertTable } from "../engine/weights/expert_table.ts";
import { packTrunk } from "../pack/pack.ts";
import { hashExperts } from "../pack/experts.ts";
import { expertTensors, globalTensors, HEAD_NAME, layerTensors, PREFIX } from "../engine/model/tensors.ts";

/** Where benchmark data lives (outside the repo). */
export const BENCH_CACHE = Deno.env.get("K3_BENCH_CACHE") ?? "/var/tmp/k3-bench";

/** What a slice is made of. */
export interface SliceRecipe {
  layers: number;
  experts: number;
  topK: number;
  vocab: number;
  /** One-based MLA layers (the rest are KDA); layer 0 is the dense one. */
  fullAttn: number[];
}

/** The batching bench's slice: dense+KDA, MoE+KDA, MoE+MLA with all 896 experts (~36 GB). */
export const ROUTER_SLICE: SliceRecipe = { layers: 3, experts: 896, topK: 16, vocab: 32768, fullAttn: [3] };

/** The decode slice of bench/limits.ts and bench/prefill.ts: the same layers with 32 experts
 * per MoE layer (~6.5 GB). */
export const LIMITS_SLICE: SliceRecipe = { layers: 3, experts: 32, topK: 16, vocab: 32768, fullAttn: [3] };

const VERSION = 1;
const POOL_BYTES = 16 << 20;

/** The slice's config.json, in the released nested format. */
export function sliceConfig(r: SliceRecipe): Record<string, unknown> {
  const kdaLayers = Array.from({ length: r.layers }, (_, i) => i + 1).filter((l) => !r.fullAttn.includes(l));
  const bos = r.vocab - 256;
  const text = {
    model_type: "kimi_k3",
    hidden_size: 7168,
    num_hidden_layers: r.layers,
    vocab_size: r.vocab,
    rms_norm_eps: 1e-5,
    num_attention_heads: 96,
    num_key_value_heads: 96,
    q_lora_rank: 1536,
    kv_lora_rank: 512,
    qk_nope_head_dim: 128,
    qk_rope_head_dim: 64,
    v_head_dim: 128,
    mla_use_nope: true,
    mla_use_output_gate: true,
    num_experts: r.experts,
    num_experts_per_token: r.topK,
    num_shared_experts: 2,
    routed_expert_hidden_size: 3584,
    moe_intermediate_size: 3072,
    routed_scaling_factor: 1.0,
    moe_renormalize: true,
    latent_moe_use_norm: true,
    first_k_dense_replace: 1,
    intermediate_size: 33792,
    attn_res_block_size: 12,
    activation_situ_beta: 4.0,
    activation_situ_linear_beta: 25.0,
    num_nextn_predict_layers: 0,
    moe_router_activation_func: "sigmoid",
    topk_method: "noaux_tc",
    num_expert_group: 1,
    topk_group: 1,
    tie_word_embeddings: false,
    torch_dtype: "bfloat16",
    bos_token_id: bos,
    eos_token_id: bos + 2,
    pad_token_id: r.vocab - 1,
    linear_attn_config: {
      num_heads: 96,
      head_dim: 128,
      short_conv_kernel_size: 4,
      gate_lower_bound: -5.0,
      full_attn_layers: r.fullAttn,
      kda_layers: kdaLayers,
    },
    quantization_config: {
      quant_method: "compressed-tensors",
      format: "mxfp4-pack-quantized",
      quantization_status: "compressed",
      config_groups: {
        group_0: {
          format: "mxfp4-pack-quantized",
          targets: ["Linear"],
          weights: {
            num_bits: 4,
            type: "float",
            strategy: "group",
            group_size: 32,
            symmetric: true,
            dynamic: false,
            scale_dtype: "uint8",
          },
        },
      },
    },
  };
  return {
    architectures: ["KimiK3ForConditionalGeneration"],
    model_type: "kimi_k3_vl",
    bos_token_id: bos,
    eos_token_id: bos + 2,
    pad_token_id: r.vocab - 1,
    text_config: text,
  };
}

/** A tensor to write: name, dtype, shape and how to fill it. */
interface Planned {
  name: string;
  dtype: "BF16" | "F32" | "U8";
  shape: number[];
  fill: Fill;
}
type Fill = { kind: "pool"; pool: Uint8Array } | { kind: "const"; bytes: Uint8Array };

const F32_VECTORS = /(conv1d\.weight|A_log|dt_bias|o_norm\.weight|e_score_correction_bias)$/;

/** xorshift32: cheap, seeded, good enough for weights nobody reads for meaning. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 4294967296;
  };
}

function bf16Pool(amplitude: number, seed: number): Uint8Array {
  const r = rng(seed);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  const out = new Uint16Array(POOL_BYTES / 2);
  for (let i = 0; i < out.length; i++) {
    f[0] = (2 * r() - 1) * amplitude;
    out[i] = u[0] >>> 16;
  }
  return new Uint8Array(out.buffer);
}

function f32Pool(lo: number, hi: number, seed: number): Uint8Array {
  const r = rng(seed);
  const out = new Float32Array(POOL_BYTES / 4);
  for (let i = 0; i < out.length; i++) out[i] = lo + (hi - lo) * r();
  return new Uint8Array(out.buffer);
}

function bytePool(lo: number, hi: number, seed: number): Uint8Array {
  const r = rng(seed);
  const out = new Uint8Array(POOL_BYTES);
  for (let i = 0; i < out.length; i++) out[i] = lo + Math.floor((hi - lo + 1) * r());
  return out;
}

function constant(dtype: "BF16" | "F32", v: number): Fill {
  const bytes = dtype === "F32" ? new Uint8Array(new Float32Array([v]).buffer) : (() => {
    const u = new Uint32Array(new Float32Array([v]).buffer)[0] >>> 16;
    return new Uint8Array([u & 0xff, u >> 8]);
  })();
  return { kind: "const", bytes };
}

/** Every tensor of the slice, by shard: the trunk and head first, then each MoE layer's experts. */
function planTensors(r: SliceRecipe): Planned[][] {
  const cfg = parseConfig(sliceConfig(r), "slice config");
  const pools = new Map<string, Uint8Array>();
  let seed = 1;
  const pool = (key: string, make: () => Uint8Array) => {
    if (!pools.has(key)) pools.set(key, make());
    return pools.get(key)!;
  };
  const matrix = (name: string, shape: number[]): Planned => ({
    name,
    dtype: "BF16",
    shape,
    fill: { kind: "pool", pool: pool(`bf16:${shape[1]}`, () => bf16Pool(Math.sqrt(3 / shape[1]), seed++)) },
  });
  const vector = (name: string, shape: number[]): Planned => {
    if (F32_VECTORS.test(name)) {
      const fill: Fill = /A_log$/.test(name)
        ? { kind: "pool", pool: pool("alog", () => f32Pool(-1, 1, seed++)) }
        : /conv1d/.test(name)
        ? { kind: "pool", pool: pool("conv", () => f32Pool(-0.5, 0.5, seed++)) }
        : /o_norm/.test(name)
        ? constant("F32", 1)
        : /e_score_correction_bias/.test(name)
        ? { kind: "pool", pool: pool("bias", () => f32Pool(-0.05, 0.05, seed++)) }
        : constant("F32", 0);
      return { name, dtype: "F32", shape, fill };
    }
    const fill: Fill = /res_proj/.test(name)
      ? { kind: "pool", pool: pool("resproj", () => bf16Pool(0.05, seed++)) }
      : constant("BF16", 1);
    return { name, dtype: "BF16", shape, fill };
  };
  const trunk: Planned[] = [];
  for (let L = 0; L < cfg.numLayers; L++) {
    for (const t of layerTensors(cfg, L)) {
      const name = PREFIX + t.name;
      trunk.push(t.keep === "matrix" ? matrix(name, t.shape) : vector(name, t.shape));
    }
  }
  for (const t of globalTensors(cfg)) trunk.push(vector(PREFIX + t.name, t.shape));
  const V = cfg.vocabSize, D = cfg.hiddenSize;
  trunk.push({
    name: PREFIX + "embed_tokens.weight",
    dtype: "BF16",
    shape: [V, D],
    fill: { kind: "pool", pool: pool("embed", () => bf16Pool(1, seed++)) },
  });
  trunk.push(matrix(HEAD_NAME, [V, D]));
  const packed = pool("nibbles", () => bytePool(0, 255, seed++));
  const scales = pool("scales", () => bytePool(119, 120, seed++));
  const shards = [trunk];
  for (let L = cfg.firstKDense; L < cfg.numLayers; L++) {
    const experts: Planned[] = [];
    for (let E = 0; E < cfg.moe.numExperts; E++) {
      for (const t of expertTensors(cfg, L, E)) {
        experts.push({
          name: PREFIX + t.name,
          dtype: "U8",
          shape: t.shape,
          fill: { kind: "pool", pool: t.name.endsWith("_scale") ? scales : packed },
        });
      }
    }
    shards.push(experts);
  }
  return shards;
}

const SIZE = { BF16: 2, F32: 4, U8: 1 };

/** Writes one shard: header, then each tensor from its pool, in 64 MB writes. */
async function writeShard(
  path: string,
  tensors: Planned[],
  progress: (bytes: number) => void,
): Promise<void> {
  const header: Record<string, unknown> = {};
  let off = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1) * SIZE[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + json.length) % 8)) % 8);
  const head = new Uint8Array(8 + json.length);
  new DataView(head.buffer).setBigUint64(0, BigInt(json.length), true);
  head.set(new TextEncoder().encode(json), 8);
  const tmp = `${path}.partial`;
  const f = await Deno.open(tmp, { write: true, create: true, truncate: true });
  try {
    const STAGE = 64 << 20;
    const stage = new Uint8Array(STAGE);
    let used = 0;
    const flush = async () => {
      let w = 0;
      while (w < used) w += await f.write(stage.subarray(w, used));
      progress(used);
      used = 0;
    };
    stage.set(head);
    used = head.length;
    const r = rng(7);
    for (const t of tensors) {
      let left = t.shape.reduce((a, b) => a * b, 1) * SIZE[t.dtype];
      const src = t.fill.kind === "pool" ? t.fill.pool : t.fill.bytes;
      // Constants repeat their element; pools start at a random element-aligned offset.
      let at = t.fill.kind === "pool" ? Math.floor(r() * (src.length / 4)) * 4 : 0;
      while (left > 0) {
        if (used === STAGE) await flush();
        const n = Math.min(left, STAGE - used, src.length - at);
        stage.set(src.subarray(at, at + n), used);
        used += n;
        left -= n;
        at = (at + n) % src.length;
      }
    }
    await flush();
    await f.syncData();
  } finally {
    f.close();
  }
  await Deno.rename(tmp, path);
}

/** The slice's directory for `recipe`: made when missing or stale, else reused. */
export async function ensureSlice(
  recipe: SliceRecipe,
  dir = `${BENCH_CACHE}/slice-${recipe.layers}l-${recipe.experts}e`,
  log: (s: string) => void = (s) => console.error(`slice: ${s}`),
): Promise<string> {
  const stamp = JSON.stringify({ version: VERSION, ...recipe });
  try {
    if ((await Deno.readTextFile(`${dir}/slice.json`)) === stamp) return dir;
  } catch { /* not there yet */ }
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  await Deno.mkdir(dir, { recursive: true });
  const shards = planTensors(recipe);
  const total = shards.flat().reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1) * SIZE[t.dtype], 0);
  log(`writing ${(total / 1e9).toFixed(1)} GB to ${dir}`);
  const t0 = performance.now();
  let done = 0, lastLog = 0;
  const progress = (n: number) => {
    done += n;
    const s = (performance.now() - t0) / 1000;
    if (s - lastLog > 5) {
      lastLog = s;
      const rate = done / s;
      log(
        `${(done / 1e9).toFixed(1)} / ${(total / 1e9).toFixed(1)} GB, ${(rate / 1e9).toFixed(2)} GB/s, ETA ${
          ((total - done) / rate).toFixed(0)
        } s`,
      );
    }
  };
  for (const [i, tensors] of shards.entries()) {
    const name = `model-${String(i + 1).padStart(5, "0")}-of-${String(shards.length).padStart(5, "0")}.safetensors`;
    await writeShard(`${dir}/${name}`, tensors, progress);
  }
  await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(sliceConfig(recipe), null, 2) + "\n");
  const s = (performance.now() - t0) / 1000;
  log(`wrote ${(total / 1e9).toFixed(1)} GB in ${s.toFixed(1)} s (${(total / 1e9 / s).toFixed(2)} GB/s)`);
  await Deno.writeTextFile(`${dir}/slice.json`, stamp);
  return dir;
}

/**
 * The packed trunk of a slice, with its expert table: `<slice>-trunk`, re-packed when it is
 * missing or of an older trunk version (the manifest's version is part of the cache key),
 * left alone when current (packTrunk checks it is this slice's); the table is made when
 * missing or not this trunk's.
 */
export async function ensureTrunk(
  model: string,
  dir = `${model}-trunk`,
  log: (s: string) => void = (s) => console.error(`slice: ${s}`),
): Promise<string> {
  const m = await readManifest(dir).catch(() => undefined);
  const current = m?.version === TRUNK_VERSION;
  if (!current) log(`packing ${dir} (${m ? `version ${m.version}` : "none or unreadable"}, want ${TRUNK_VERSION})`);
  const packed = await packTrunk(model, dir, { force: !current, log });
  let tableOk = false;
  try {
    const t = parseExpertTable(await Deno.readTextFile(`${dir}/${EXPERTS_FILE}`), EXPERTS_FILE);
    tableOk = t.fingerprint === packed.manifest.fingerprint && t.sample === packed.manifest.sample;
  } catch { /* missing or stale: made below */ }
  if (!tableOk) await hashExperts(model, dir, log);
  return dir;
}

if (import.meta.main) {
  const { values } = benchArgs(
    "usage: deno run -A bench/slice.ts [--dir DIR] [--layers N] [--experts N] [--clean]",
    { dir: { type: "string" }, layers: { type: "string" }, experts: { type: "string" }, clean: { type: "boolean" } },
  );
  const recipe = {
    ...ROUTER_SLICE,
    layers: Number(values.layers ?? ROUTER_SLICE.layers),
    experts: Number(values.experts ?? ROUTER_SLICE.experts),
  };
  const dir = values.dir ?? `${BENCH_CACHE}/slice-${recipe.layers}l-${recipe.experts}e`;
  if (values.clean) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    console.error(`slice: removed ${dir}`);
  } else {
    console.log(await ensureSlice(recipe, dir));
  }
}
