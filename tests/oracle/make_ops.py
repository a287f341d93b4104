#!/usr/bin/env python3
"""Write tests/fixtures/ops.json: per-op fixtures for the C kernels of kernels/k3.h.

Inputs are random float32 values (fixed seed) written exactly; expected outputs are
computed in float64 from those float32 values with the oracle functions of k3ref.py, so a
kernel test compares with a tolerance (the kernels run in float32).

Format: {"<op>": [{"params": {k3.h scalar names}, "inputs": {name: flat list},
                   "expected": {name: flat list}, "note": "..."}]}
Conventions:
  * arrays are flat, row-major in the layout k3.h documents;
  * outputs with a row/head range ([r0, r1) or [h0, h1)): entries outside the range are
    0 in "expected" (the caller zero-fills the output buffer before the call), and an
    in/out state (kda_step S) outside the range equals its input;
  * rmsnorm without gain simply has no "w" input (pass NULL);
  * matmul_bf16 gives the weights as uint16 bit patterns "w_bits";
  * router_topk expected: "ids", "weights" (first k entries) and "ret" (the return value);
  * argmax expected: "index".
Sizes avoid multiples of 16 where the op allows it, so SIMD remainders get exercised.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3ref  # noqa: E402
from safetensors_io import bf16_bits_to_f32, f32_to_bf16_bits  # noqa: E402

rng = np.random.default_rng(20261129)


def f32(*shape, std=1.0, mean=0.0):
    return (rng.standard_normal(shape) * std + mean).astype(np.float32)


def flat_in(a):
    """float32 (or int) array -> list of exact JSON numbers."""
    a = np.asarray(a).reshape(-1)
    if a.dtype.kind == "f":
        return [float(v) for v in a.astype(np.float32)]
    return [int(v) for v in a]


def flat_out(a):
    """float64 expected values, 10 significant digits (far below float32 resolution)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    return [float("%.10g" % v) for v in a]


def w64(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def E(eps):
    """The float eps parameter as the kernel sees it (float32), widened."""
    return float(np.float32(eps))


ops = {}


def case(op, params, inputs, expected, note=""):
    c = {"params": params, "inputs": inputs, "expected": expected}
    if note:
        c["note"] = note
    ops.setdefault(op, []).append(c)


# ---- matmul (f32, bf16, mxfp4) --------------------------------------------------------

RANGE_NOTE = "y rows outside [r0,r1) are 0 (caller zero-fills y)"


def ranged_matmul(W, x, ntok, rows, r0, r1):
    y = np.zeros((ntok, rows))
    y[:, r0:r1] = x.reshape(ntok, -1) @ W[r0:r1].T
    return y


for ntok, rows, cols, r0, r1 in [(1, 5, 37, 0, 5), (3, 7, 67, 2, 6), (2, 4, 16, 0, 4)]:
    W = f32(rows, cols, std=0.3)
    x = f32(ntok, cols)
    case("matmul_f32", dict(ntok=ntok, rows=rows, cols=cols, r0=r0, r1=r1),
         {"w": flat_in(W), "x": flat_in(x)},
         {"y": flat_out(ranged_matmul(w64(W), w64(x), ntok, rows, r0, r1))}, RANGE_NOTE)

for ntok, rows, cols, r0, r1 in [(1, 6, 35, 0, 6), (3, 5, 129, 1, 4)]:
    bits = f32_to_bf16_bits(f32(rows, cols, std=0.3))
    W = bf16_bits_to_f32(bits).astype(np.float64)
    x = f32(ntok, cols)
    case("matmul_bf16", dict(ntok=ntok, rows=rows, cols=cols, r0=r0, r1=r1),
         {"w_bits": flat_in(bits), "x": flat_in(x)},
         {"y": flat_out(ranged_matmul(W, w64(x), ntok, rows, r0, r1))}, RANGE_NOTE)

for ntok, rows, cols, r0, r1 in [(1, 3, 32, 0, 3), (3, 5, 96, 1, 5)]:
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scales = rng.integers(118, 132, (rows, cols // 32)).astype(np.uint8)
    scales[1, 0] = 255  # a zero group
    W = k3ref.dequant_mxfp4(packed, scales)
    x = f32(ntok, cols)
    case("matmul_mxfp4", dict(ntok=ntok, rows=rows, cols=cols, r0=r0, r1=r1),
         {"packed": flat_in(packed), "scales": flat_in(scales), "x": flat_in(x)},
         {"y": flat_out(ranged_matmul(W, w64(x), ntok, rows, r0, r1))},
         "scales[1][0] = 255: row 1, elements 0..31 are zero. " + RANGE_NOTE)

# ---- rmsnorm -------------------------------------------------------------------------

for n, ngroups, with_w, eps in [(37, 1, True, 1e-5), (16, 3, False, 1e-5), (130, 2, True, 1e-6)]:
    x = f32(ngroups, n, std=2.0)
    inputs = {"x": flat_in(x)}
    w = None
    if with_w:
        wv = f32(n, std=0.2, mean=1.0)
        inputs["w"] = flat_in(wv)
        w = w64(wv)
    case("rmsnorm", dict(n=n, ngroups=ngroups, eps=eps), inputs,
         {"y": flat_out(k3ref.rmsnorm(w64(x), w, E(eps)))},
         "" if with_w else "w = NULL (no gain)")

# ---- situ_glu ------------------------------------------------------------------------

for n, gs, us in [(37, 3.0, 10.0), (20, 8.0, 60.0)]:  # second case saturates both caps
    g, u = f32(n, std=gs), f32(n, std=us)
    case("situ_glu", dict(n=n, b1=4.0, b2=25.0), {"g": flat_in(g), "u": flat_in(u)},
         {"out": flat_out(k3ref.situ_glu(w64(g), w64(u), 4.0, 25.0))})

# ---- short_conv ----------------------------------------------------------------------

for channels, zero_state in [(37, False), (5, True)]:
    state = np.zeros((channels, 3), np.float32) if zero_state else f32(channels, 3)
    w, x = f32(channels, 4, std=0.5), f32(channels)
    y, st = k3ref.short_conv(w64(state), w64(w), w64(x))
    case("short_conv", dict(channels=channels),
         {"state": flat_in(state), "w": flat_in(w), "x": flat_in(x)},
         {"y": flat_out(y), "state": flat_out(st)},
         "state is in/out: expected.state is the shifted state")

# ---- l2norm --------------------------------------------------------------------------

for d, nheads in [(37, 1), (16, 3)]:
    x = f32(nheads, d)
    case("l2norm", dict(d=d, nheads=nheads, eps=1e-6), {"x": flat_in(x)},
         {"x": flat_out(k3ref.l2norm(w64(x), E(1e-6)))}, "in place")

# ---- kda_decay -----------------------------------------------------------------------

for nheads, d, alen in [(2, 37, 37), (3, 8, 16)]:
    f = f32(nheads, d)
    a_log = np.zeros(alen, np.float32)
    a_log[:nheads] = np.log(rng.uniform(1, 8, nheads)).astype(np.float32)
    dt = f32(nheads, d, std=1.5, mean=-2.0)
    case("kda_decay", dict(nheads=nheads, d=d, lb=-5.0),
         {"f": flat_in(f), "a_log": flat_in(a_log), "dt_bias": flat_in(dt)},
         {"alpha": flat_out(k3ref.kda_decay(w64(f), w64(a_log), w64(dt), -5.0))},
         "a_log is longer than nheads (per-head values then zeros); only the first nheads used")

# ---- kda_step ------------------------------------------------------------------------

for nheads, d, h0, h1 in [(1, 8, 0, 1), (3, 20, 1, 3), (2, 32, 0, 2)]:
    S = f32(nheads, d, d, std=0.3)
    q = k3ref.l2norm(f32(nheads, d).astype(np.float64)).astype(np.float32)
    k = k3ref.l2norm(f32(nheads, d).astype(np.float64)).astype(np.float32)
    v = f32(nheads, d)
    beta = rng.uniform(0.05, 0.95, nheads).astype(np.float32)
    alpha = np.exp(rng.uniform(-5, 0, (nheads, d))).astype(np.float32)
    o_all, S_all = k3ref.kda_step(w64(S), w64(q), w64(k), w64(v), w64(beta), w64(alpha))
    So = w64(S).copy()
    So[h0:h1] = S_all[h0:h1]
    o = np.zeros((nheads, d))
    o[h0:h1] = o_all[h0:h1]
    case("kda_step", dict(nheads=nheads, d=d, h0=h0, h1=h1),
         {"S": flat_in(S), "q": flat_in(q), "k": flat_in(k), "v": flat_in(v),
          "beta": flat_in(beta), "alpha": flat_in(alpha)},
         {"S": flat_out(So), "o": flat_out(o)},
         "S in/out; heads outside [h0,h1) keep S and have o = 0")

# ---- mla_attend ----------------------------------------------------------------------

for npos, nheads, dn, dr, dv, h0, h1 in [(1, 2, 16, 8, 16, 0, 2), (5, 3, 5, 3, 7, 1, 3),
                                         (9, 2, 16, 8, 16, 0, 1)]:
    q = f32(nheads, dn + dr)
    kn, kr, v = f32(npos, nheads, dn), f32(npos, dr), f32(npos, nheads, dv)
    scale = float(np.float32(1.0 / np.sqrt(dn + dr)))
    out_all = k3ref.mla_attend(w64(q), w64(kn), w64(kr), w64(v), scale)
    out = np.zeros((nheads, dv))
    out[h0:h1] = out_all[h0:h1]
    case("mla_attend", dict(npos=npos, nheads=nheads, dn=dn, dr=dr, dv=dv, scale=scale,
                            h0=h0, h1=h1),
         {"q": flat_in(q), "knope": flat_in(kn), "krope": flat_in(kr), "v": flat_in(v)},
         {"out": flat_out(out)}, "heads outside [h0,h1) have out = 0")

# ---- router_topk ---------------------------------------------------------------------


def router_case(logits, bias, k, scale, note):
    ids, w, unbiased = k3ref.router_topk(w64(logits), w64(bias), k, scale)
    case("router_topk", dict(nexperts=len(logits), k=k, scale=scale),
         {"logits": flat_in(logits), "bias": flat_in(bias)},
         {"ids": [int(i) for i in ids], "weights": flat_out(w), "ret": k},
         note + f" (unbiased choice would be {sorted(int(i) for i in unbiased)})")


# bias changes the choice: expert 2 has the best raw score but a big negative bias
router_case(np.array([0.5, 0.1, 2.0, -1.0, 1.0, 0.0, -0.5], np.float32),
            np.array([0.0, 0.3, -0.6, 0.5, 0.0, 0.0, 0.0], np.float32), 3, 1.0,
            "bias changes the chosen set")
# exact tie at the boundary (experts 1 and 3 identical): the lower index wins
router_case(np.array([2.0, 1.0, 0.2, 1.0, -1.0, 0.0], np.float32),
            np.array([0.1, 0.05, 0.0, 0.05, 0.0, 0.0], np.float32), 2, 1.0,
            "tie between experts 1 and 3 at the k boundary: lowest index wins")
router_case(f32(37, std=2.0), f32(37, std=0.15), 8, 2.5, "random, scale 2.5")

# ---- attnres -------------------------------------------------------------------------

for nsrc, n in [(1, 16), (3, 37), (5, 130)]:
    src = f32(nsrc, n, std=1.5)
    nw = f32(n, std=0.1, mean=1.0)
    pw = f32(n, std=1.0 / np.sqrt(n))
    out, _ = k3ref.attnres(list(w64(src)), w64(nw), w64(pw), E(1e-5))
    case("attnres", dict(nsrc=nsrc, n=n, eps=1e-5),
         {"src": flat_in(src), "norm_w": flat_in(nw), "proj_w": flat_in(pw)},
         {"out": flat_out(out)})

# ---- sigmoid_mul ---------------------------------------------------------------------

for n in [37, 8]:
    y, g = f32(n), f32(n, std=4.0)
    case("sigmoid_mul", dict(n=n), {"y": flat_in(y), "g": flat_in(g)},
         {"y": flat_out(w64(y) * k3ref.sigmoid(w64(g)))}, "in place on y")

# ---- argmax --------------------------------------------------------------------------

for x, note in [(np.array([1, 3, 3, 2], np.float32), "tie: lowest index"),
                (np.full(19, -2.5, np.float32), "all equal"),
                (None, "random with a duplicated maximum")]:
    if x is None:
        x = f32(37)
        x[30] = x.max() + 1
        x[33] = x[30]
    case("argmax", dict(n=len(x)), {"x": flat_in(x)},
         {"index": k3ref.argmax_lowest(w64(x))}, note)


def main():
    out = os.path.join(HERE, "..", "fixtures", "ops.json")
    if len(sys.argv) > 1:
        out = sys.argv[1]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(ops, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
