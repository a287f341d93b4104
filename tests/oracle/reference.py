#!/usr/bin/env python3
"""Float64 reference forward + greedy decode of a K3 checkpoint (released format).

  python3 tests/oracle/reference.py MODEL_DIR --ids 1,2,3 --gen N --out OUT.json \
      [--logits OUT.f32]

Greedy decoding takes the argmax (ties to the lowest id) N times, recomputing the whole
sequence each step (it is the reference; clarity beats speed). Then one more forward over
prompt + generated[:-1] gives the logits of every position; its argmaxes at the generated
positions are checked against the greedy tokens (causality check).

OUT.json:
  prompt_ids, generated_ids     the token ids
  argmax                        argmax of the logits at every position of
                                prompt + generated[:-1] (so argmax[len(prompt)-1+i] ==
                                generated_ids[i])
  top2_gap                      per position: top-1 minus top-2 logit
  min_top2_gap                  min of top2_gap (how robust greedy tokens are to rounding)
  logit_std, logit_absmax       scale of the logits
  bias_changed_routing          number of (token, MoE layer) pairs whose top-k set with
                                e_score_correction_bias differs from the unbiased top-k
  prompt_text                   with --text: the text the prompt ids encode (recorded, not
                                encoded here: the engine's tokenizer test checks it)
--logits writes float32 little-endian [positions][vocab] for the same positions.
--trace DIR writes, for the same positions, float32 LE [positions][hidden] files
  L{i}.attn_in.f32, L{i}.attn.f32, L{i}.mlp_in.f32, L{i}.mlp.f32 and final.f32
  (see K3Model.forward), to find the first sub-layer where a port diverges.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3ref import K3Model, argmax_lowest  # noqa: E402


def run(model_dir, prompt, ngen, trace=None):
    model = K3Model(model_dir)
    seq = list(prompt)
    gen = []
    for _ in range(ngen):
        logits = model.forward(seq)
        tok = argmax_lowest(logits[-1])
        gen.append(tok)
        seq.append(tok)
    positions = list(prompt) + gen[:-1] if gen else list(prompt)
    stats = {"bias_changed_routing": 0}
    logits = model.forward(positions, stats, trace)
    am = [argmax_lowest(r) for r in logits]
    for i, tok in enumerate(gen):
        if am[len(prompt) - 1 + i] != tok:
            raise AssertionError("full-sequence argmax disagrees with greedy token")
    srt = np.sort(logits, axis=1)
    gaps = (srt[:, -1] - srt[:, -2]).tolist()
    out = {
        "prompt_ids": list(map(int, prompt)),
        "generated_ids": list(map(int, gen)),
        "argmax": am,
        "top2_gap": gaps,
        "min_top2_gap": float(min(gaps)),
        "logit_std": float(np.std(logits)),
        "logit_absmax": float(np.max(np.abs(logits))),
        "bias_changed_routing": int(stats["bias_changed_routing"]),
    }
    return out, logits


def main(argv=None):
    ap = argparse.ArgumentParser(description="K3 float64 reference forward / greedy decode")
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--gen", type=int, default=0, help="number of greedy tokens")
    ap.add_argument("--out", required=True, help="output JSON path")
    ap.add_argument("--logits", default=None, help="write float32 LE logits here")
    ap.add_argument("--trace", default=None, help="directory for per-sub-layer dumps")
    ap.add_argument("--text", default=None, help="record the prompt's text as prompt_text")
    a = ap.parse_args(argv)
    prompt = [int(x) for x in a.ids.split(",") if x.strip()]
    if not prompt:
        raise SystemExit("--ids must not be empty")
    trace = {} if a.trace else None
    out, logits = run(a.model_dir, prompt, a.gen, trace)
    if a.text is not None:
        out = {"prompt_text": a.text, **out}
    if a.trace:
        os.makedirs(a.trace, exist_ok=True)
        for k, v in trace.items():
            np.asarray(v).astype("<f4").tofile(os.path.join(a.trace, k + ".f32"))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if a.logits:
        logits.astype("<f4").tofile(a.logits)


if __name__ == "__main__":
    main()
