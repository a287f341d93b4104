"""The Kimi K3 forward pass in PyTorch, for training the tiny English model.

It computes what tests/oracle/k3ref.py computes (docs/math.md), batched and
differentiable: the same decoder layer (Attention Residuals over block snapshots with
block size `block`, KDA or gated MLA, the dense layer 0, Stable LatentMoE with a sigmoid
noaux_tc router), the same parameter names and shapes as the released checkpoint. Two
things differ from the reference only in how they are computed, never in what:

  * the routed experts are evaluated for every token and mixed with a weight matrix that
    is zero outside the top-k (8 tiny experts: cheaper than gathering);
  * the KDA recurrence runs in chunks of 16 tokens (delta_rule_chunked), the batch at
    once.

`check.py` runs this module in float64 on an exported checkpoint and compares its
logits with k3ref.py's: the model that was trained is the model the engine runs.
"""

import math

import torch
import torch.nn.functional as F

PREFIX = "language_model.model."
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class Shape:
    """The widths of a K3 model, from the `text_config` of a released config.json."""

    def __init__(self, text):
        la = text["linear_attn_config"]
        self.hidden = text["hidden_size"]
        self.layers = text["num_hidden_layers"]
        self.vocab = text["vocab_size"]
        self.eps = text["rms_norm_eps"]
        self.mla_heads = text["num_attention_heads"]
        self.q_lora = text["q_lora_rank"]
        self.kv_lora = text["kv_lora_rank"]
        self.nope = text["qk_nope_head_dim"]
        self.rope = text["qk_rope_head_dim"]
        self.v_head = text["v_head_dim"]
        self.experts = text["num_experts"]
        self.topk = text["num_experts_per_token"]
        self.shared = text["num_shared_experts"]
        self.latent = text["routed_expert_hidden_size"]
        self.moe_inter = text["moe_intermediate_size"]
        self.scaling = text["routed_scaling_factor"]
        self.dense_inter = text["intermediate_size"]
        self.block = text["attn_res_block_size"]
        self.b1 = text["activation_situ_beta"]
        self.b2 = text["activation_situ_linear_beta"]
        self.kda_heads = la["num_heads"]
        self.kda_dim = la["head_dim"]
        self.conv_k = la["short_conv_kernel_size"]
        self.lb = la["gate_lower_bound"]
        self.mla = {i - 1 for i in la["full_attn_layers"]}
        if text["first_k_dense_replace"] != 1:
            raise ValueError("only first_k_dense_replace 1 (the released value)")


def rmsnorm(x, w, eps):
    y = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps)
    return y if w is None else y * w


def situ_glu(g, u, b1, b2):
    return b1 * torch.tanh(g / b1) * torch.sigmoid(g) * (b2 * torch.tanh(u / b2))


def l2norm(x, eps=1e-6):
    return x / torch.sqrt(torch.sum(x * x, dim=-1, keepdim=True) + eps)


def quantize_mxfp4(w):
    """MXFP4 of a float matrix [rows][cols]: (values, nibbles, scale bytes).

    Per group of 32 consecutive elements of a row the scale is a power of two 2^(s-127);
    two candidates are tried, s = ceil(log2(amax / 6)) + 127 (nothing clips) and one
    smaller (the largest values clip to +-6), and the one with the smaller squared error
    is kept (ties to the first). Each element is rounded to the nearest E2M1 magnitude
    (ties to the smaller one), sign kept; nibble = magnitude index | 8 if negative (never
    -0). A group of zeros gets scale byte 255 (the checkpoint's 'empty'). Deterministic."""
    rows, cols = w.shape
    g = w.detach().to(torch.float64).reshape(rows, cols // 32, 32)
    amax = g.abs().amax(dim=-1)
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    e_hi = torch.ceil(torch.log2(safe / 6.0))
    best_err = best_val = best_idx = best_e = None
    for e in (e_hi, e_hi - 1):
        scale = torch.pow(2.0, e)[..., None]
        a = (g.abs() / scale)[..., None]
        idx = torch.argmin((a - mags).abs(), dim=-1)  # first minimum: ties to smaller
        val = torch.sign(g) * mags[idx] * scale
        err = ((val - g) ** 2).sum(dim=-1)
        if best_err is None:
            best_err, best_val, best_idx, best_e = err, val, idx, e
        else:
            take = err < best_err
            best_val = torch.where(take[..., None], val, best_val)
            best_idx = torch.where(take[..., None], idx, best_idx)
            best_e = torch.where(take, e, best_e)
            best_err = torch.minimum(err, best_err)
    nib = best_idx + 8 * ((g < 0) & (best_idx > 0)).to(best_idx.dtype)
    scale_byte = torch.where(amax > 0, best_e + 127, torch.full_like(best_e, 255))
    if bool(((scale_byte < 0) | (scale_byte > 255)).any()):
        raise ValueError("MXFP4 scale out of range")
    values = torch.where(amax[..., None] > 0, best_val, torch.zeros_like(best_val))
    return (values.reshape(rows, cols).to(w.dtype), nib.reshape(rows, cols).to(torch.uint8),
            scale_byte.to(torch.uint8))


def pack_nibbles(nib):
    """[rows][cols] nibbles -> [rows][cols/2] bytes, the even element in the low nibble."""
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)


CHUNK = 16  # tokens per chunk of the KDA recurrence


def delta_rule_chunked(q, k, v, beta, log_alpha, chunk):
    """KDA's gated delta rule over a whole sequence, `chunk` tokens at a time.

    Shapes [B][h][T][d] (beta [B][h][T]); q already scaled by 1/sqrt(d). The step form
    (k3ref.kda_step) is S_t = (I - b_t k_t k_t^T) Diag(a_t) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T q_t, from S_0 = 0. Within a chunk, with g_t = prod_{s<=t} a_s and the
    chunk's entry state S0, S_t = Diag(g_t) S0 + sum_{j<=t} Diag(g_t / g_j) k_j w_j^T where
    the update rows w_j = b_j (v_j - u_j) solve the unit lower triangular system
    (I + Diag(b) A) W = Diag(b) (V - (g*K) S0), A[t, j] = k_t^T Diag(g_t / g_j) k_j (j < t);
    then o_t = S0^T (g_t * q_t) + sum_{j<=t} (q_t^T Diag(g_t / g_j) k_j) w_j. The decay
    ratios are formed per pair as exp(G_t - G_j) (G = running sum of log a), so nothing
    overflows. Same values as the step form, a few dozen operations per chunk instead of
    per token."""
    B, h, T, d = q.shape
    S = q.new_zeros(B, h, d, d)
    outs = []
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        n = c1 - c0
        qc, kc, vc, bc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], beta[:, :, c0:c1]
        G = torch.cumsum(log_alpha[:, :, c0:c1], dim=2)  # [B][h][n][d]
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]  # [t][j]: G_t - G_j
        incl = torch.ones(n, n, dtype=torch.bool).tril()
        R = torch.exp(torch.where(incl[:, :, None], diff, torch.full_like(diff, -math.inf)))
        A = (R * (kc[:, :, :, None, :] * kc[:, :, None, :, :])).sum(-1).tril(-1)
        Qk = (R * (qc[:, :, :, None, :] * kc[:, :, None, :, :])).sum(-1)  # zero above the diagonal
        g = torch.exp(G)
        rhs = bc[..., None] * (vc - (g * kc) @ S)
        Tm = torch.eye(n, dtype=q.dtype) + bc[..., None] * A
        W = torch.linalg.solve_triangular(Tm, rhs, upper=False, unitriangular=True)
        outs.append((g * qc) @ S + Qk @ W)
        last = torch.exp(G[:, :, -1:, :] - G)  # g_n / g_j, [B][h][n][d]
        S = g[:, :, -1, :, None] * S + (last * kc).transpose(-1, -2) @ W
    return torch.cat(outs, dim=2)


class K3:
    """Parameters (a dict of tensors named as in the checkpoint, without the prefix) and
    the forward pass. Routed experts are kept as `layers.L.block_sparse_moe.w1` [E][I][Z],
    `w3` [E][I][Z], `w2` [E][Z][I] (expert e's w1 is w1[e]); `quantized` makes the forward
    see them through MXFP4 with a straight-through gradient (training aware of it)."""

    def __init__(self, shape, params):
        self.s = shape
        self.p = params
        self.quantized = False

    # ---------------------------------------------------------------------------------

    @staticmethod
    def init(shape, generator):
        """Fresh parameters (float32), drawn in a fixed order from `generator`."""
        s = shape
        H = s.hidden
        p = {}

        def normal(shape_, std):
            return torch.randn(shape_, generator=generator) * std

        def mat(rows, cols, gain=1.0):
            return normal((rows, cols), gain / math.sqrt(cols))

        out_gain = 1.0 / math.sqrt(2 * s.layers)
        p["embed_tokens.weight"] = normal((s.vocab, H), 1.0)
        nh, dk = s.kda_heads, s.kda_dim
        C = nh * dk
        for L in range(s.layers):
            q = f"layers.{L}."
            for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                      "mlp_res_norm"):
                p[q + n + ".weight"] = torch.ones(H)
            # AttnRes pseudo-queries start at zero: a uniform mix of the sources
            p[q + "self_attention_res_proj.weight"] = torch.zeros(1, H)
            p[q + "mlp_res_proj.weight"] = torch.zeros(1, H)
            a = q + "self_attn."
            if L in s.mla:
                qd = s.nope + s.rope
                p[a + "q_a_proj.weight"] = mat(s.q_lora, H)
                p[a + "q_a_layernorm.weight"] = torch.ones(s.q_lora)
                p[a + "q_b_proj.weight"] = mat(s.mla_heads * qd, s.q_lora)
                p[a + "kv_a_proj_with_mqa.weight"] = mat(s.kv_lora + s.rope, H)
                p[a + "kv_a_layernorm.weight"] = torch.ones(s.kv_lora)
                p[a + "kv_b_proj.weight"] = mat(s.mla_heads * (s.nope + s.v_head), s.kv_lora)
                p[a + "g_proj.weight"] = mat(s.mla_heads * s.v_head, H)
                p[a + "o_proj.weight"] = mat(H, s.mla_heads * s.v_head, out_gain)
            else:
                for c in "qkv":
                    p[a + f"{c}_proj.weight"] = mat(C, H)
                for c in "qkv":
                    w = normal((C, 1, s.conv_k), 0.2)
                    w[:, 0, s.conv_k - 1] += 1.0  # start near the identity
                    p[a + f"{c}_conv1d.weight"] = w
                p[a + "f_a_proj.weight"] = mat(dk, H)
                p[a + "f_b_proj.weight"] = mat(C, dk, 0.5)
                p[a + "b_proj.weight"] = mat(nh, H)
                p[a + "A_log"] = torch.log(torch.rand(nh, generator=generator) * 3.0 + 1.0)
                p[a + "dt_bias"] = normal((C,), 1.5) - 3.0
                p[a + "o_norm.weight"] = torch.ones(dk)
                p[a + "g_proj.weight"] = mat(C, H)
                p[a + "o_proj.weight"] = mat(H, C, out_gain)
            if L == 0:
                I = s.dense_inter
                p[q + "mlp.gate_proj.weight"] = mat(I, H)
                p[q + "mlp.up_proj.weight"] = mat(I, H)
                p[q + "mlp.down_proj.weight"] = mat(H, I, out_gain)
                continue
            m = q + "block_sparse_moe."
            E, Z, I, S = s.experts, s.latent, s.moe_inter, s.shared * s.moe_inter
            p[m + "gate.weight"] = mat(E, H)
            p[m + "gate.e_score_correction_bias"] = torch.zeros(E)
            p[m + "routed_expert_down_proj.weight"] = mat(Z, H)
            p[m + "routed_expert_up_proj.weight"] = mat(H, Z, out_gain)
            p[m + "routed_expert_norm.weight"] = torch.ones(Z)
            p[m + "shared_experts.gate_proj.weight"] = mat(S, H)
            p[m + "shared_experts.up_proj.weight"] = mat(S, H)
            p[m + "shared_experts.down_proj.weight"] = mat(H, S, out_gain)
            p[m + "w1"] = normal((E, I, Z), 1.0 / math.sqrt(Z))
            p[m + "w3"] = normal((E, I, Z), 1.0 / math.sqrt(Z))
            p[m + "w2"] = normal((E, Z, I), 1.0 / math.sqrt(I))
        p["norm.weight"] = torch.ones(H)
        p["output_attn_res_norm.weight"] = torch.ones(H)
        p["output_attn_res_proj.weight"] = torch.zeros(1, H)
        p["lm_head.weight"] = mat(s.vocab, H)
        return p

    # ---------------------------------------------------------------------------------

    def kda(self, L, x):
        s, p = self.s, self.p
        a = f"layers.{L}.self_attn."
        B, T, _ = x.shape
        nh, d = s.kda_heads, s.kda_dim
        C = nh * d

        def conv(n):
            y = x @ p[a + f"{n}_proj.weight"].T  # [B][T][C]
            y = F.pad(y.transpose(1, 2), (s.conv_k - 1, 0))
            y = F.conv1d(y, p[a + f"{n}_conv1d.weight"], groups=C).transpose(1, 2)
            return F.silu(y).reshape(B, T, nh, d)

        q = l2norm(conv("q")) / math.sqrt(d)  # kda_step's q / sqrt(d), folded in
        k = l2norm(conv("k"))
        v = conv("v")
        beta = torch.sigmoid(x @ p[a + "b_proj.weight"].T)  # [B][T][nh]
        f = ((x @ p[a + "f_a_proj.weight"].T) @ p[a + "f_b_proj.weight"].T).reshape(B, T, nh, d)
        rate = torch.exp(p[a + "A_log"][:nh])[:, None]
        log_alpha = s.lb * torch.sigmoid(rate * (f + p[a + "dt_bias"].reshape(nh, d)))
        o = delta_rule_chunked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               beta.transpose(1, 2), log_alpha.transpose(1, 2), CHUNK)
        o = o.transpose(1, 2)  # [B][T][nh][d]
        o = rmsnorm(o, p[a + "o_norm.weight"], s.eps).reshape(B, T, C)
        o = o * torch.sigmoid(x @ p[a + "g_proj.weight"].T)
        return o @ p[a + "o_proj.weight"].T

    def mla(self, L, x):
        s, p = self.s, self.p
        a = f"layers.{L}.self_attn."
        B, T, _ = x.shape
        nh, dn, dr, dv = s.mla_heads, s.nope, s.rope, s.v_head
        qa = rmsnorm(x @ p[a + "q_a_proj.weight"].T, p[a + "q_a_layernorm.weight"], s.eps)
        q = (qa @ p[a + "q_b_proj.weight"].T).reshape(B, T, nh, dn + dr)
        ckv = x @ p[a + "kv_a_proj_with_mqa.weight"].T
        lat = rmsnorm(ckv[..., :s.kv_lora], p[a + "kv_a_layernorm.weight"], s.eps)
        krope = ckv[..., s.kv_lora:]  # [B][T][dr], shared by the heads, not rotated
        kv = (lat @ p[a + "kv_b_proj.weight"].T).reshape(B, T, nh, dn + dv)
        knope, v = kv[..., :dn], kv[..., dn:]
        score = (torch.einsum("bthd,bphd->bhtp", q[..., :dn], knope)
                 + torch.einsum("bthd,bpd->bhtp", q[..., dn:], krope)) / math.sqrt(dn + dr)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        score = score.masked_fill(~causal, float("-inf"))
        o = torch.einsum("bhtp,bphd->bthd", torch.softmax(score, dim=-1), v).reshape(B, T, nh * dv)
        o = o * torch.sigmoid(x @ p[a + "g_proj.weight"].T)
        return o @ p[a + "o_proj.weight"].T

    def dense_mlp(self, L, x):
        p, s = self.p, self.s
        m = f"layers.{L}.mlp."
        h = situ_glu(x @ p[m + "gate_proj.weight"].T, x @ p[m + "up_proj.weight"].T, s.b1, s.b2)
        return h @ p[m + "down_proj.weight"].T

    def expert_weights(self, L):
        m = f"layers.{L}.block_sparse_moe."
        ws = [self.p[m + n] for n in ("w1", "w3", "w2")]
        if not self.quantized:
            return ws
        out = []
        for w in ws:
            E, r, c = w.shape
            q = quantize_mxfp4(w.reshape(E * r, c))[0].reshape(E, r, c)
            out.append(w + (q - w).detach())  # straight-through
        return out

    def moe(self, L, x, load):
        s, p = self.s, self.p
        m = f"layers.{L}.block_sparse_moe."
        scores = torch.sigmoid(x @ p[m + "gate.weight"].T)  # [B][T][E]
        biased = scores.detach() + p[m + "gate.e_score_correction_bias"]
        ids = torch.topk(biased, s.topk, dim=-1).indices
        chosen = torch.gather(scores, -1, ids)
        weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * s.scaling
        mix = torch.zeros_like(scores).scatter(-1, ids, weights)  # [B][T][E]
        if load is not None:
            load[L] = torch.zeros(s.experts).scatter_add(
                0, ids.reshape(-1), torch.ones(ids.numel())).to(torch.float64)
        z = x @ p[m + "routed_expert_down_proj.weight"].T  # [B][T][Z]
        w1, w3, w2 = self.expert_weights(L)
        E, I, Z = w1.shape
        # every expert at once: sum_e mix_e * w2_e h_e = [mix_e h_e]_e @ [w2_e^T]_e
        h = situ_glu(z @ w1.reshape(E * I, Z).T, z @ w3.reshape(E * I, Z).T, s.b1, s.b2)
        h = (h.reshape(*h.shape[:-1], E, I) * mix[..., None]).reshape(*h.shape[:-1], E * I)
        routed = h @ w2.transpose(1, 2).reshape(E * I, Z)
        routed = rmsnorm(routed, p[m + "routed_expert_norm.weight"], s.eps)
        r = routed @ p[m + "routed_expert_up_proj.weight"].T
        sh = m + "shared_experts."
        g = situ_glu(x @ p[sh + "gate_proj.weight"].T, x @ p[sh + "up_proj.weight"].T, s.b1, s.b2)
        return r + g @ p[sh + "down_proj.weight"].T

    def attnres(self, name, srcs):
        fold = self.p[name + "_norm.weight"] * self.p[name + "_proj.weight"].reshape(-1)
        V = torch.stack(srcs, dim=0)
        w = torch.softmax(torch.sum(rmsnorm(V, None, self.s.eps) * fold, dim=-1), dim=0)
        return torch.sum(w[..., None] * V, dim=0)

    def forward(self, ids, load=None):
        """Logits [B][T][vocab] of token ids [B][T]; `load`, if a dict, receives per MoE
        layer the number of times each expert was chosen."""
        s, p = self.s, self.p
        partial = p["embed_tokens.weight"][ids]
        blocks = []
        for L in range(s.layers):
            q = f"layers.{L}."
            x = self.attnres(q + "self_attention_res", blocks + [partial]) if blocks else partial
            if L % s.block == 0:
                blocks.append(partial)
                partial = None
            h = rmsnorm(x, p[q + "input_layernorm.weight"], s.eps)
            a = self.mla(L, h) if L in s.mla else self.kda(L, h)
            partial = a if partial is None else partial + a
            y = self.attnres(q + "mlp_res", blocks + [partial])
            h = rmsnorm(y, p[q + "post_attention_layernorm.weight"], s.eps)
            partial = partial + (self.dense_mlp(L, h) if L == 0 else self.moe(L, h, load))
        f = self.attnres("output_attn_res", blocks + [partial])
        f = rmsnorm(f, p["norm.weight"], s.eps)
        return f @ p["lm_head.weight"].T
