#!/usr/bin/env python3
"""Write a synthetic Kimi K3 checkpoint in the exact released on-disk format, at any size.

Why: the real checkpoint is 1.56 TB; tests need a model that exercises every code path
(KDA and MLA layers in the released one-based map, the dense layer 0, Stable LatentMoE
with MXFP4 experts stored out of order, AttnRes block bookkeeping over several blocks)
but fits in a couple of MB, and benchmarks need the real widths with few layers/experts.

Everything follows the released format (docs/formats.md, docs/math.md section 1): nested config.json
(text_config + text_config.linear_attn_config, one-based layer lists), tensor names under
`language_model.model.`, BF16 (or --float-dtype) for matrices and norm/AttnRes vectors,
F32 for conv weights, A_log, dt_bias, o_norm and the correction bias, U8 for MXFP4.

Each tensor gets its own RNG seeded from (seed, crc32(name)), so the values do not
depend on the shard layout or on the order tensors are written. Tensors are generated and
written one at a time (big ones in row chunks), so the `real` preset streams.

Usage: gen_model.py OUT_DIR [--preset tiny|real] [--seed 0] [--layers N] ... (see --help)
"""

import argparse
import json
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import ELEM_SIZE, StreamWriter, numel  # noqa: E402

PRESETS = {
    "tiny": dict(layers=13, hidden=128, vocab=1024, block=3, kda_heads=2, kda_head_dim=32,
                 mla_heads=2, q_lora=48, kv_lora=32, nope=16, rope=8, v_head=16, experts=8,
                 topk=2, shared=2, latent=64, moe_inter=32, dense_inter=192, shards=3,
                 bos=768, eos=770, pad=1023),
    # Released widths; layers/experts default small since this is for benchmarks.
    "real": dict(layers=2, hidden=7168, vocab=163840, block=12, kda_heads=96, kda_head_dim=128,
                 mla_heads=96, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128,
                 experts=32, topk=16, shared=2, latent=3584, moe_inter=3072,
                 dense_inter=33792, shards=2, bos=163584, eos=163586, pad=163839),
}

PREFIX = "language_model.model."
CHUNK_ELEMS = 1 << 22  # rows are generated in chunks of about this many elements


def default_full_attn(layers):
    """Released pattern, one-based: every 4th layer is MLA, and the last layer is MLA too
    (93 layers -> 4, 8, ..., 92, 93; 13 layers -> 4, 8, 12, 13)."""
    full = [i for i in range(1, layers + 1) if i % 4 == 0]
    if layers not in full:
        full.append(layers)
    return full


def tensor_rng(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


# --------------------------------------------------------------------------------------
# Tensor generators. Each returns a function gen(rng) -> iterator of row chunks.


def gen_normal(shape, std, mean=0.0):
    """Gaussian matrix, rows produced in chunks (float32)."""
    rows = shape[0]
    per_row = max(1, numel(shape[1:]))
    step = max(1, CHUNK_ELEMS // per_row)

    def gen(rng):
        for r in range(0, rows, step):
            n = min(step, rows - r)
            a = rng.standard_normal((n,) + tuple(shape[1:]), dtype=np.float32)
            a *= np.float32(std)
            if mean:
                a += np.float32(mean)
            yield a
    return gen


def gen_const(arr):
    def gen(_rng):
        yield np.asarray(arr)
    return gen


def gen_a_log(length, nheads):
    """A_log ships longer than num_heads (128 floats for 96 heads in the release):
    per-head values first, then zeros. exp(A_log) in [1, 4] like a typical init."""
    def gen(rng):
        a = np.zeros(length, np.float32)
        a[:nheads] = np.log(rng.uniform(1.0, 4.0, nheads)).astype(np.float32)
        yield a
    return gen


def gen_dt_bias(n):
    """dt_bias mostly negative so that most channels decay slowly (alpha near 1) while
    some decay fast: the state has to carry information across tokens."""
    def gen(rng):
        yield (rng.standard_normal(n) * 1.5 - 3.0).astype(np.float32)
    return gen


def gen_conv(channels, kernel):
    def gen(rng):
        w = rng.standard_normal((channels, 1, kernel)).astype(np.float32) * np.float32(0.5)
        w[:, 0, kernel - 1] += np.float32(0.6)  # current input dominates a little
        yield w
    return gen


def gen_mxfp4_pair(rows, cols, zero_group_p=0.02):
    """Packed E2M1 nibbles [rows][cols/2] and scale bytes [rows][cols/32].

    Nibbles are uniform over 0..15 (RMS of |E2M1| ~= 2.93). The scale exponent is
    centred so the element std is ~1/sqrt(cols), with a spread of -2..+1 around it, and
    a few groups get scale 255 (the whole group reads as zero)."""
    if cols % 32:
        raise SystemExit(f"MXFP4 row width {cols} is not a multiple of 32")
    target = 1.0 / np.sqrt(cols) / 2.93
    base = 127 + int(np.round(np.log2(target)))

    def gen_packed(rng):
        step = max(1, CHUNK_ELEMS // (cols // 2))
        for r in range(0, rows, step):
            n = min(step, rows - r)
            yield rng.integers(0, 256, (n, cols // 2), dtype=np.uint8)

    def gen_scales(rng):
        s = base + rng.integers(-2, 2, (rows, cols // 32))
        s = s.astype(np.uint8)
        s[rng.random((rows, cols // 32)) < zero_group_p] = 255
        yield s
    return gen_packed, gen_scales


# --------------------------------------------------------------------------------------


def build_plan(d, seed, fdt):
    """Return the list of units; a unit is a list of (name, dtype, shape, gen) that must
    stay together in one shard (one routed expert = one unit of six tensors)."""
    H = d["hidden"]
    units = []
    order_rng = np.random.default_rng([seed, 12345])

    def T(name, dtype, shape, gen):
        return (name, dtype, tuple(int(s) for s in shape), gen)

    def mat(name, rows, cols, gain=1.0):
        return T(name, fdt, (rows, cols), gen_normal((rows, cols), gain / np.sqrt(cols)))

    def normw(name, n, noise=0.1):
        return T(name, fdt, (n,), gen_normal((n,), noise, mean=1.0))

    def resproj(name):
        # AttnRes score = dot(v/rms(v), norm*proj) has std ~ sqrt(H)*std(proj): std
        # 1/sqrt(H) gives mixture logits of O(1), so the mixture is far from uniform.
        return T(name, fdt, (1, H), gen_normal((1, H), 1.0 / np.sqrt(H)))

    # vision tensors the text model must ignore
    units.append([T("vision_tower.patch_embed.proj.weight", fdt, (32, 3, 2, 2),
                    gen_normal((32, 3, 2, 2), 0.1))])
    units.append([T("mm_projector.pre_norm.weight", fdt, (32,), gen_normal((32,), 0.1, 1.0))])
    units.append([T(PREFIX + "embed_tokens.weight", fdt, (d["vocab"], H),
                    gen_normal((d["vocab"], H), 1.0))])

    nh, dk = d["kda_heads"], d["kda_head_dim"]
    C = nh * dk
    mh = d["mla_heads"]
    full = set(d["full_attn"])
    for L in range(d["layers"]):
        p = f"{PREFIX}layers.{L}."
        trunk = [normw(p + "input_layernorm.weight", H),
                 normw(p + "post_attention_layernorm.weight", H),
                 normw(p + "self_attention_res_norm.weight", H),
                 resproj(p + "self_attention_res_proj.weight"),
                 normw(p + "mlp_res_norm.weight", H),
                 resproj(p + "mlp_res_proj.weight")]
        a = p + "self_attn."
        if (L + 1) in full:  # MLA
            qd = d["nope"] + d["rope"]
            trunk += [mat(a + "q_a_proj.weight", d["q_lora"], H),
                      normw(a + "q_a_layernorm.weight", d["q_lora"]),
                      mat(a + "q_b_proj.weight", mh * qd, d["q_lora"]),
                      mat(a + "kv_a_proj_with_mqa.weight", d["kv_lora"] + d["rope"], H),
                      normw(a + "kv_a_layernorm.weight", d["kv_lora"]),
                      mat(a + "kv_b_proj.weight", mh * (d["nope"] + d["v_head"]), d["kv_lora"]),
                      mat(a + "g_proj.weight", mh * d["v_head"], H),
                      mat(a + "o_proj.weight", H, mh * d["v_head"])]
        else:  # KDA
            trunk += [mat(a + "q_proj.weight", C, H), mat(a + "k_proj.weight", C, H),
                      mat(a + "v_proj.weight", C, H)]
            for c in "qkv":
                trunk.append(T(a + f"{c}_conv1d.weight", "F32", (C, 1, 4), gen_conv(C, 4)))
            trunk += [mat(a + "f_a_proj.weight", dk, H),
                      mat(a + "f_b_proj.weight", C, dk, gain=0.5),
                      mat(a + "b_proj.weight", nh, H),
                      T(a + "A_log", "F32", (max(nh, dk),), gen_a_log(max(nh, dk), nh)),
                      T(a + "dt_bias", "F32", (C,), gen_dt_bias(C)),
                      T(a + "o_norm.weight", "F32", (dk,), gen_normal((dk,), 0.1, 1.0)),
                      mat(a + "g_proj.weight", C, H),
                      mat(a + "o_proj.weight", H, C)]
        if L == 0:
            I = d["dense_inter"]
            trunk += [mat(p + "mlp.gate_proj.weight", I, H), mat(p + "mlp.up_proj.weight", I, H),
                      mat(p + "mlp.down_proj.weight", H, I)]
            units.append(trunk)
            continue
        m = p + "block_sparse_moe."
        E, Z, I, S = d["experts"], d["latent"], d["moe_inter"], d["shared"] * d["moe_inter"]
        trunk += [mat(m + "gate.weight", E, H, gain=2.0),
                  # std 0.15 against sigmoid scores spread ~0.2: changes some selections
                  T(m + "gate.e_score_correction_bias", "F32", (E,), gen_normal((E,), 0.15)),
                  mat(m + "routed_expert_down_proj.weight", Z, H),
                  mat(m + "routed_expert_up_proj.weight", H, Z),
                  normw(m + "routed_expert_norm.weight", Z),
                  mat(m + "shared_experts.gate_proj.weight", S, H),
                  mat(m + "shared_experts.up_proj.weight", S, H),
                  mat(m + "shared_experts.down_proj.weight", H, S)]
        units.append(trunk)
        for e in order_rng.permutation(E):  # experts stored out of id order
            q = f"{m}experts.{e}."
            six = []
            for w, (rows, cols) in (("w1", (I, Z)), ("w3", (I, Z)), ("w2", (Z, I))):
                gp, gs = gen_mxfp4_pair(rows, cols)
                six.append(T(q + w + ".weight_packed", "U8", (rows, cols // 2), gp))
                six.append(T(q + w + ".weight_scale", "U8", (rows, cols // 32), gs))
            perm = order_rng.permutation(6)  # order inside the run varies too
            units.append([six[i] for i in perm])

    units.append([normw(PREFIX + "norm.weight", H),
                  normw(PREFIX + "output_attn_res_norm.weight", H),
                  resproj(PREFIX + "output_attn_res_proj.weight")])
    units.append([T("mm_projector.proj.0.weight", fdt, (H, 32), gen_normal((H, 32), 0.1))])
    # logits std ~2 so top-1/top-2 gaps are comfortably above rounding noise
    units.append([mat("language_model.lm_head.weight", d["vocab"], H, gain=2.0)])
    return units


def split_shards(units, nshards):
    """Cut the unit list into nshards consecutive runs of roughly equal byte size. A
    layer may straddle two shards (as in the release); an expert never does."""
    size = [sum(numel(t[2]) * ELEM_SIZE[t[1]] for t in u) for u in units]
    total = sum(size)
    shards = [[] for _ in range(nshards)]
    acc = 0
    k = 0
    for i, u in enumerate(units):
        remaining_units = len(units) - i
        # move on when this shard has its share, keeping at least one unit per shard left
        if shards[k] and k < nshards - 1 and (acc >= total * (k + 1) / nshards
                                               or remaining_units <= nshards - 1 - k):
            k += 1
        shards[k].extend(u)
        acc += size[i]
    return shards


def make_config(d, fdt, quant_at_root):
    full = sorted(d["full_attn"])
    kda = [i for i in range(1, d["layers"] + 1) if i not in full]
    quant = {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "format": "mxfp4-pack-quantized",
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                        "symmetric": True, "dynamic": False, "scale_dtype": "uint8"},
            "input_activations": None, "output_activations": None}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
                   "re:.*gate$", "re:.*routed_expert_(down|up)_proj$", "re:vision_tower.*",
                   "re:mm_projector.*"],
    }
    torch_dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[fdt]
    text = {
        "model_type": "kimi_k3",
        "hidden_size": d["hidden"],
        "num_hidden_layers": d["layers"],
        "vocab_size": d["vocab"],
        "rms_norm_eps": 1e-5,
        "num_attention_heads": d["mla_heads"],
        "num_key_value_heads": d["mla_heads"],
        "q_lora_rank": d["q_lora"],
        "kv_lora_rank": d["kv_lora"],
        "qk_nope_head_dim": d["nope"],
        "qk_rope_head_dim": d["rope"],
        "v_head_dim": d["v_head"],
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "num_experts": d["experts"],
        "num_experts_per_token": d["topk"],
        "num_shared_experts": d["shared"],
        "routed_expert_hidden_size": d["latent"],
        "moe_intermediate_size": d["moe_inter"],
        "routed_scaling_factor": 1.0,
        "moe_renormalize": True,
        "latent_moe_use_norm": True,
        "first_k_dense_replace": 1,
        "intermediate_size": d["dense_inter"],
        "attn_res_block_size": d["block"],
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "num_nextn_predict_layers": 0,
        "moe_router_activation_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_expert_group": 1,
        "topk_group": 1,
        "tie_word_embeddings": False,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "torch_dtype": torch_dtype,
        "bos_token_id": d["bos"],
        "eos_token_id": d["eos"],
        "pad_token_id": d["pad"],
        "linear_attn_config": {
            "num_heads": d["kda_heads"],
            "head_dim": d["kda_head_dim"],
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "full_attn_layers": full,
            "kda_layers": kda,
        },
    }
    cfg = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3_vl",
        "bos_token_id": d["bos"],
        "eos_token_id": d["eos"],
        "pad_token_id": d["pad"],
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "text_config": text,
        "vision_config": {"model_type": "kimi_k3_vision", "num_hidden_layers": 27,
                          "hidden_size": 32, "patch_size": 2, "in_channels": 3},
    }
    if quant_at_root:
        cfg["quantization_config"] = quant
    else:
        text["quantization_config"] = quant
    return cfg


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for k in ["layers", "hidden", "vocab", "block", "kda-heads", "kda-head-dim", "mla-heads",
              "q-lora", "kv-lora", "nope", "rope", "v-head", "experts", "topk", "shared",
              "latent", "moe-inter", "dense-inter", "shards"]:
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--full-attn", default=None,
                    help="ONE-based MLA layer list, e.g. 4,8,12,13 (default: every 4th + last)")
    ap.add_argument("--float-dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--quant-at-root", action="store_true",
                    help="put quantization_config at the config root instead of text_config")
    ap.add_argument("--no-index", action="store_true", help="skip model.safetensors.index.json")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    d = dict(PRESETS[args.preset])
    for k in list(d):
        v = getattr(args, k.replace("-", "_"), None)
        if v is not None:
            d[k] = v
    d["full_attn"] = ([int(x) for x in args.full_attn.split(",") if x.strip()]
                      if args.full_attn else default_full_attn(d["layers"]))
    if any(not 1 <= i <= d["layers"] for i in d["full_attn"]):
        raise SystemExit("--full-attn entries must be one-based layer numbers")
    if d["latent"] % 32 or d["moe_inter"] % 32:
        raise SystemExit("latent and moe_inter must be multiples of 32 (MXFP4 groups)")
    if d["topk"] > d["experts"]:
        raise SystemExit("topk > experts")
    fdt = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[args.float_dtype]
    d["seed"] = args.seed

    units = build_plan(d, args.seed, fdt)
    write_checkpoint(args.out_dir, d, units, d["shards"], fdt, args.quant_at_root,
                     index=not args.no_index)


def write_checkpoint(out_dir, d, units, nshards, fdt, quant_at_root=False, index=True):
    """Write `units` (build_plan's list, each tensor's gen yielding its rows) as
    nshards safetensors shards plus config.json and, if `index`, the index. Also used by
    tools/train_tiny/train.py to write trained values in this same layout."""
    os.makedirs(out_dir, exist_ok=True)
    # remove only what we own from a previous run (never the tokenizer files)
    for f in os.listdir(out_dir):
        if (f.startswith("model-") and f.endswith(".safetensors")) or f in (
                "model.safetensors.index.json", "config.json"):
            os.remove(os.path.join(out_dir, f))
    nsh = max(1, min(nshards, len(units)))
    shards = split_shards(units, nsh)
    weight_map = {}
    total = 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{nsh:05d}.safetensors"
        w = StreamWriter(os.path.join(out_dir, fname), [t[:3] for t in tensors],
                         metadata={"format": "pt"})
        for name, dtype, shape, gen in tensors:
            for chunk in gen(tensor_rng(d["seed"], name)):
                w.write(name, chunk)
            weight_map[name] = fname
            total += numel(shape) * ELEM_SIZE[dtype]
        w.close()
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(make_config(d, fdt, quant_at_root), f, indent=2)
        f.write("\n")
    if index:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}, f, indent=2)
            f.write("\n")

if __name__ == "__main__":
    main()
