"""Float64 reference ("oracle") for Kimi K3, written from the model's definition only (docs/math.md).

Two layers of API:
  * per-op functions (rmsnorm, situ_glu, short_conv, kda_step, mla_attend, router_topk,
    attnres, dequant_mxfp4, ...) that mirror the math of docs/math.md and the kernel
    contracts, reused by make_ops.py to produce kernel fixtures;
  * K3Model: loads a checkpoint in the released format (nested config, one-based layer
    lists, BF16/F16/F32 widened, MXFP4 dequantised exactly) and runs a full-sequence
    forward pass in float64.

Clarity over speed: the forward recomputes the whole sequence; KDA runs its recurrence
token by token in the step form; MLA materialises the expanded keys/values.
"""

import glob
import json
import os

import numpy as np

from safetensors_io import load_file, read_header

# E2M1 value by nibble 0..15 (sign bit 3, then exponent/mantissa): docs/math.md section 10.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                dtype=np.float64)

# --------------------------------------------------------------------------------------
# Elementary ops


def sigmoid(x):
    """Logistic sigmoid, written via tanh so it never overflows for large |x|."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def silu(x):
    return x * sigmoid(x)


def rmsnorm(x, w=None, eps=1e-5):
    """RMSNorm over the last axis: w * x / sqrt(mean(x^2) + eps); w=None means no gain."""
    x = np.asarray(x, dtype=np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def situ_glu(g, u, b1=4.0, b2=25.0):
    """SiTU-GLU: b1*tanh(g/b1)*sigmoid(g) * b2*tanh(u/b2). The sigmoid sees the UNCAPPED g."""
    return b1 * np.tanh(g / b1) * sigmoid(g) * (b2 * np.tanh(u / b2))


def l2norm(x, eps=1e-6):
    """Per-head L2 normalisation over the last axis: x / sqrt(sum(x^2) + eps)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def dequant_mxfp4(packed, scales):
    """MXFP4 -> float64 [rows][cols]. packed [rows][cols/2]: the LOW nibble of each byte
    is the even element, the high nibble the odd one. scales [rows][cols/32]: one byte per
    32 consecutive elements, value = E2M1[nibble] * 2^(scale-127); byte 255 zeroes the
    group (it is NaN in the OCP spec; the checkpoint uses it as 'empty')."""
    packed = np.asarray(packed, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    rows, half = packed.shape
    cols = half * 2
    if cols % 32 or scales.shape != (rows, cols // 32):
        raise ValueError(f"bad MXFP4 shapes {packed.shape} {scales.shape}")
    nib = np.empty((rows, cols), dtype=np.uint8)
    nib[:, 0::2] = packed & 0x0F
    nib[:, 1::2] = packed >> 4
    vals = E2M1[nib]
    s = scales.astype(np.int64)
    mult = np.where(s == 255, 0.0, np.ldexp(1.0, s - 127))  # exact powers of two
    return vals * np.repeat(mult, 32, axis=1)


def short_conv(state, w, x):
    """One token of the causal depthwise conv (kernel K) followed by SiLU, all channels.
    state [C][K-1] previous inputs oldest first; w [C][K], tap K-1 multiplies the current
    input. Returns (y, new_state) with the state shifted to include x."""
    window = np.concatenate([state, x[:, None]], axis=1)  # [C][K], oldest first
    y = np.sum(window * w, axis=1)
    return silu(y), window[:, 1:].copy()


def kda_decay(f, a_log, dt_bias, lb=-5.0):
    """alpha[h, i] = exp(lb * sigmoid(exp(a_log[h]) * (f[h, i] + dt_bias[h, i]))).
    f, dt_bias [nheads][d]; a_log: at least nheads values, only the first nheads used."""
    nh = f.shape[0]
    a = np.exp(np.asarray(a_log, dtype=np.float64)[:nh])[:, None]
    return np.exp(lb * sigmoid(a * (f + dt_bias)))


def kda_step(S, q, k, v, beta, alpha):
    """One delta-rule step, all heads, step form of docs/math.md section 6. Shapes: S [nh][d][d]
    (keys x values), q/k/v/alpha [nh][d], beta [nh]. Returns (o [nh][d], new S).
    S = Diag(alpha) S; u = S^T k; S = S + k (beta (v - u))^T; o = S^T (q / sqrt(d))."""
    d = q.shape[-1]
    S = S * alpha[:, :, None]
    u = np.einsum("hkv,hk->hv", S, k)
    S = S + k[:, :, None] * (beta[:, None] * (v - u))[:, None, :]
    o = np.einsum("hkv,hk->hv", S, q / np.sqrt(d))
    return o, S


def kda_step_closed(S, q, k, v, beta, alpha):
    """Closed form of the same step, used only to cross-check kda_step:
    S_t = (I - beta k k^T) Diag(alpha) S_{t-1} + beta k v^T, o = S_t^T q / sqrt(d)."""
    nh, d = q.shape
    out_S = np.empty_like(S)
    o = np.empty((nh, d))
    for h in range(nh):
        P = np.eye(d) - beta[h] * np.outer(k[h], k[h])
        out_S[h] = P @ np.diag(alpha[h]) @ S[h] + beta[h] * np.outer(k[h], v[h])
        o[h] = out_S[h].T @ q[h] / np.sqrt(d)
    return o, out_S


def mla_attend(q, knope, krope, v, scale):
    """One query over positions 0..npos-1, all heads.
    q [nh][dn+dr]; knope [npos][nh][dn]; krope [npos][dr] shared by heads; v [npos][nh][dv].
    score = (q_nope.k_nope + q_rope.k_rope) * scale; softmax over positions."""
    dn = knope.shape[2]
    s = (np.einsum("hd,phd->hp", q[:, :dn], knope) + np.einsum("hd,pd->hp", q[:, dn:], krope))
    s = s * scale
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=1, keepdims=True)
    return np.einsum("hp,phd->hd", p, v)


def topk_lowest_index(score, k):
    """Indices of the k largest scores, descending, ties to the lowest index."""
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")
    return order[:k]


def router_topk(logits, bias, k, scale=1.0):
    """Sigmoid router with noaux_tc selection (spec 2/LatentMoE/1).
    Returns (ids in descending selection-score order, weights, unbiased ids)."""
    s = sigmoid(logits)
    ids = topk_lowest_index(s + bias, k)
    w = s[ids] / (np.sum(s[ids]) + 1e-20) * scale
    return ids, w, topk_lowest_index(s, k)


def attnres(srcs, norm_w, proj_w, eps=1e-5):
    """Attention Residuals over a list of sources (each [..., n]): scores from RMS-normalised
    sources against fold = norm_w * proj_w, softmax over sources, mix of RAW sources."""
    fold = norm_w * proj_w
    V = np.stack(srcs, axis=0)  # [nsrc, ..., n]
    scores = np.sum(rmsnorm(V, None, eps) * fold, axis=-1)  # [nsrc, ...]
    scores = scores - scores.max(axis=0, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=0, keepdims=True)
    return np.sum(p[..., None] * V, axis=0), p


def argmax_lowest(x):
    """Argmax with ties to the lowest index; NaN never wins."""
    x = np.where(np.isnan(x), -np.inf, np.asarray(x, dtype=np.float64))
    return int(np.argmax(x))


# --------------------------------------------------------------------------------------
# Config and checkpoint


def one_based_to_mla_set(full_attn_layers):
    """Zero-based MLA layer indices from the one-based config list (layer L is MLA iff
    L+1 is listed)."""
    return {int(i) - 1 for i in full_attn_layers}


class K3Config:
    def __init__(self, raw):
        t = raw.get("text_config", raw)
        la = t["linear_attn_config"]
        self.hidden = t["hidden_size"]
        self.layers = t["num_hidden_layers"]
        self.vocab = t["vocab_size"]
        self.eps = t.get("rms_norm_eps", 1e-5)
        self.mla_heads = t["num_attention_heads"]
        self.q_lora = t["q_lora_rank"]
        self.kv_lora = t["kv_lora_rank"]
        self.nope = t["qk_nope_head_dim"]
        self.rope = t["qk_rope_head_dim"]
        self.v_head = t["v_head_dim"]
        self.output_gate = t.get("mla_use_output_gate", True)
        self.experts = t["num_experts"]
        self.topk = t["num_experts_per_token"]
        self.shared = t["num_shared_experts"]
        self.latent = t["routed_expert_hidden_size"]
        self.moe_inter = t["moe_intermediate_size"]
        self.scaling = t.get("routed_scaling_factor", 1.0)
        self.first_dense = t.get("first_k_dense_replace", 1)
        self.dense_inter = t["intermediate_size"]
        self.block = t["attn_res_block_size"]
        self.b1 = t.get("activation_situ_beta", 4.0)
        self.b2 = t.get("activation_situ_linear_beta", 25.0)
        self.kda_heads = la["num_heads"]
        self.kda_dim = la["head_dim"]
        self.conv_k = la.get("short_conv_kernel_size", 4)
        self.lb = la.get("gate_lower_bound", -5.0)
        self.mla_layers = one_based_to_mla_set(la["full_attn_layers"])
        self.bos = raw.get("bos_token_id", t.get("bos_token_id"))
        self.eos = raw.get("eos_token_id", t.get("eos_token_id"))
        self.quant = t.get("quantization_config", raw.get("quantization_config"))

    def is_mla(self, layer):
        return layer in self.mla_layers


class K3Model:
    """Float64 weights of a K3 checkpoint directory (released format)."""

    PREFIX = "language_model.model."

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = K3Config(json.load(f))
        self.w = {}
        shards = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not shards:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        for path in shards:
            hdr, _, _ = read_header(path)
            names = {n for n in hdr if n.startswith("language_model.")}
            for n, a in load_file(path, names).items():
                if n in self.w:
                    raise ValueError(f"duplicate tensor {n}")
                self.w[n] = a
        self._experts = {}

    def t(self, name):
        return self.w[self.PREFIX + name]

    def vec(self, name):
        return self.t(name).reshape(-1)

    def expert(self, layer, e):
        """Dequantised (w1, w3, w2) of one routed expert, cached."""
        key = (layer, e)
        if key not in self._experts:
            p = f"layers.{layer}.block_sparse_moe.experts.{e}."
            self._experts[key] = tuple(
                dequant_mxfp4(self.t(p + m + ".weight_packed"), self.t(p + m + ".weight_scale"))
                for m in ("w1", "w3", "w2"))
        return self._experts[key]

    # ----------------------------------------------------------------------------------
    # sub-layers, full sequence: x [T][hidden] -> [T][hidden]

    def kda(self, L, x):
        c = self.cfg
        nh, d = c.kda_heads, c.kda_dim
        p = f"layers.{L}.self_attn."
        T = x.shape[0]
        proj = {n: x @ self.t(p + f"{n}_proj.weight").T for n in "qkv"}
        # causal depthwise conv + SiLU, token by token with an explicit state
        conv = {}
        for n in "qkv":
            w = self.t(p + f"{n}_conv1d.weight").reshape(nh * d, -1)
            state = np.zeros((nh * d, w.shape[1] - 1))
            out = np.empty((T, nh * d))
            for t in range(T):
                out[t], state = short_conv(state, w, proj[n][t])
            conv[n] = out.reshape(T, nh, d)
        q = l2norm(conv["q"])
        k = l2norm(conv["k"])
        v = conv["v"]
        beta = sigmoid(x @ self.t(p + "b_proj.weight").T)  # [T][nh]
        f = (x @ self.t(p + "f_a_proj.weight").T) @ self.t(p + "f_b_proj.weight").T
        f = f.reshape(T, nh, d)
        a_log = self.vec(p + "A_log")
        dt_bias = self.vec(p + "dt_bias").reshape(nh, d)
        S = np.zeros((nh, d, d))
        o = np.empty((T, nh, d))
        for t in range(T):
            alpha = kda_decay(f[t], a_log, dt_bias, c.lb)
            o[t], S = kda_step(S, q[t], k[t], v[t], beta[t], alpha)
        o = rmsnorm(o, self.vec(p + "o_norm.weight"), c.eps)  # per head, then gate
        o = o.reshape(T, nh * d) * sigmoid(x @ self.t(p + "g_proj.weight").T)
        return o @ self.t(p + "o_proj.weight").T

    def mla(self, L, x):
        c = self.cfg
        nh, dn, dr, dv = c.mla_heads, c.nope, c.rope, c.v_head
        p = f"layers.{L}.self_attn."
        T = x.shape[0]
        qa = rmsnorm(x @ self.t(p + "q_a_proj.weight").T, self.vec(p + "q_a_layernorm.weight"),
                     c.eps)
        q = (qa @ self.t(p + "q_b_proj.weight").T).reshape(T, nh, dn + dr)
        ckv = x @ self.t(p + "kv_a_proj_with_mqa.weight").T  # [T][kv_lora + dr]
        lat = rmsnorm(ckv[:, :c.kv_lora], self.vec(p + "kv_a_layernorm.weight"), c.eps)
        krope = ckv[:, c.kv_lora:]  # raw, unrotated, shared by all heads
        kv = (lat @ self.t(p + "kv_b_proj.weight").T).reshape(T, nh, dn + dv)
        knope, v = kv[:, :, :dn], kv[:, :, dn:]
        scale = 1.0 / np.sqrt(dn + dr)
        o = np.empty((T, nh, dv))
        for t in range(T):  # causal: query t sees positions 0..t
            o[t] = mla_attend(q[t], knope[:t + 1], krope[:t + 1], v[:t + 1], scale)
        o = o.reshape(T, nh * dv)
        if c.output_gate:
            o = o * sigmoid(x @ self.t(p + "g_proj.weight").T)
        return o @ self.t(p + "o_proj.weight").T

    def dense_mlp(self, L, x):
        p = f"layers.{L}.mlp."
        h = situ_glu(x @ self.t(p + "gate_proj.weight").T, x @ self.t(p + "up_proj.weight").T,
                     self.cfg.b1, self.cfg.b2)
        return h @ self.t(p + "down_proj.weight").T

    def moe(self, L, x, stats):
        c = self.cfg
        p = f"layers.{L}.block_sparse_moe."
        logits = x @ self.t(p + "gate.weight").T  # [T][E]
        bias = self.vec(p + "gate.e_score_correction_bias")
        z = x @ self.t(p + "routed_expert_down_proj.weight").T  # [T][latent]
        acc = np.zeros_like(z)
        for t in range(x.shape[0]):
            ids, wts, unbiased = router_topk(logits[t], bias, c.topk, c.scaling)
            if set(ids.tolist()) != set(unbiased.tolist()):
                stats["bias_changed_routing"] += 1
            for e, wj in zip(ids, wts):  # fixed order: descending selection score
                w1, w3, w2 = self.expert(L, int(e))
                acc[t] += wj * (w2 @ situ_glu(w1 @ z[t], w3 @ z[t], c.b1, c.b2))
        acc = rmsnorm(acc, self.vec(p + "routed_expert_norm.weight"), c.eps)
        r = acc @ self.t(p + "routed_expert_up_proj.weight").T
        s = p + "shared_experts."
        h = situ_glu(x @ self.t(s + "gate_proj.weight").T, x @ self.t(s + "up_proj.weight").T,
                     c.b1, c.b2)
        return r + h @ self.t(s + "down_proj.weight").T

    def attnres(self, name, srcs):
        return attnres(srcs, self.vec(name + "_norm.weight"), self.vec(name + "_proj.weight"),
                       self.cfg.eps)[0]

    # ----------------------------------------------------------------------------------

    def forward(self, ids, stats=None, trace=None):
        """Logits [T][vocab] (float64) for every position of ids.
        Follows docs/math.md section 5 'One decoder layer' literally: `partial` is the running sum since
        the last block boundary (initially the embedding), `blocks` the snapshots.
        trace: optional dict, filled with intermediate [T][n] arrays for debugging ports:
        L{i}.attn_in (x after AttnRes, before input_layernorm), L{i}.attn (sub-layer
        output), L{i}.mlp_in (y), L{i}.mlp, final (after model.norm)."""
        c = self.cfg
        if stats is None:
            stats = {"bias_changed_routing": 0}
        tr = trace if trace is not None else {}
        ids = np.asarray(ids, dtype=np.int64)
        partial = self.t("embed_tokens.weight")[ids]
        blocks = []
        for L in range(c.layers):
            lp = f"layers.{L}."
            if blocks:
                x = self.attnres(lp + "self_attention_res", blocks + [partial])
            else:
                x = partial
            if L % c.block == 0:
                blocks.append(partial)
                partial = None
            h = rmsnorm(x, self.vec(lp + "input_layernorm.weight"), c.eps)
            a = self.mla(L, h) if c.is_mla(L) else self.kda(L, h)
            partial = a if partial is None else partial + a
            y = self.attnres(lp + "mlp_res", blocks + [partial])
            h = rmsnorm(y, self.vec(lp + "post_attention_layernorm.weight"), c.eps)
            m = self.dense_mlp(L, h) if L < c.first_dense else self.moe(L, h, stats)
            partial = partial + m
            tr[f"L{L}.attn_in"], tr[f"L{L}.attn"], tr[f"L{L}.mlp_in"], tr[f"L{L}.mlp"] = x, a, y, m
        f = self.attnres("output_attn_res", blocks + [partial])
        f = rmsnorm(f, self.vec("norm.weight"), c.eps)
        tr["final"] = f
        return f @ self.w["language_model.lm_head.weight"].T
