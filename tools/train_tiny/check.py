#!/usr/bin/env python3
"""The trained model is the model the engine runs: the PyTorch forward (k3torch.py),
run in float64 on a checkpoint's own weights as read by the oracle (BF16 widened, MXFP4
dequantised), against the float64 reference (tests/oracle/k3ref.py).

  /usr/bin/python3 tools/train_tiny/check.py MODEL_DIR [--ids 1,2,...] [--len N]

Prints the largest |logit difference| over every position and exits 1 above 1e-9 (the
two are the same arithmetic in a different order, so they agree to rounding). Any
K3 checkpoint of the released format works (the random tests/fixtures/tiny too).
"""

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "oracle"))
from k3ref import K3Model  # noqa: E402
from k3torch import K3, PREFIX, Shape  # noqa: E402

TOLERANCE = 1e-9


def torch_model(ref):
    """A float64 k3torch model holding exactly the oracle's weights."""
    import json
    with open(os.path.join(ref.model_dir, "config.json")) as f:
        raw = json.load(f)
    shape = Shape(raw.get("text_config", raw))
    p = {}
    for name, a in ref.w.items():
        if name == "language_model.lm_head.weight":
            p["lm_head.weight"] = torch.from_numpy(a)
        elif name.startswith(PREFIX) and ".experts." not in name:
            short = name[len(PREFIX):]
            t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
            if short.endswith("A_log"):
                t = t[:shape.kda_heads]
            p[short] = t
    for L in range(1, shape.layers):
        ws = [ref.expert(L, e) for e in range(shape.experts)]
        for i, n in enumerate(("w1", "w3", "w2")):
            p[f"layers.{L}.block_sparse_moe.{n}"] = torch.from_numpy(np.stack([w[i] for w in ws]))
    return K3(shape, p)


def max_logit_difference(model_dir, ids):
    ref = K3Model(model_dir)
    ref.model_dir = model_dir
    want = ref.forward(ids)
    with torch.no_grad():
        got = torch_model(ref).forward(torch.tensor([ids])).numpy()[0]
    return float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))


def main(argv=None):
    ap = argparse.ArgumentParser(description="k3torch against the float64 oracle")
    ap.add_argument("model_dir")
    ap.add_argument("--ids", default=None, help="comma-separated token ids")
    ap.add_argument("--len", type=int, default=40, help="with no --ids: ids 3, 10, 17, ...")
    a = ap.parse_args(argv)
    ids = ([int(x) for x in a.ids.split(",")] if a.ids
           else [(3 + 7 * i) % 768 for i in range(a.len)])
    diff, scale = max_logit_difference(a.model_dir, ids)
    print(f"k3torch vs k3ref, {len(ids)} positions: max |logit difference| {diff:.3e} "
          f"(largest |logit| {scale:.2f})")
    if not diff <= TOLERANCE:
        sys.exit(1)


if __name__ == "__main__":
    main()
