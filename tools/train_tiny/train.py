#!/usr/bin/env python3
"""Train the tiny English K3 (tests/fixtures/tiny-en) and export it in the released format.

  /usr/bin/python3 tools/train_tiny/train.py DATA_DIR OUT_DIR [--steps N] [--seed S] ...

DATA_DIR holds train.ids / heldout.ids (uint16 LE, tools/train_tiny/vocab.ts), OUT_DIR
the tokenizer files vocab.ts wrote; this adds config.json, the safetensors shards and
their index. The whole pipeline is tools/train_tiny/run.sh.

The model has the tiny fixture's shape exactly (tests/oracle/gen_model.py preset tiny:
13 layers, hidden 128, vocab 1024, KDA with MLA at one-based 4, 8, 12, 13, Attention
Residuals with block size 3, a dense layer 0, LatentMoE with 8 MXFP4 experts, top-2 and
2 shared). Training: AdamW on random windows of the training tokens, the noaux_tc router
balanced by its correction bias (raised for under-used experts, lowered for over-used
ones, no auxiliary loss), the last `--qat-steps` steps with the routed experts seen
through MXFP4 (straight-through), so the quantised export loses little.

Reproducible: one thread, deterministic algorithms, every random draw from generators
seeded by --seed; the same torch build on the same CPU gives the same bytes (prints
the sha256 of each shard). Prints the loss curve, the held-out perplexity of the float
weights and of the exported ones (BF16 trunk, MXFP4 experts) and the unigram baseline.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "oracle"))
import gen_model  # noqa: E402
from k3torch import K3, PREFIX, Shape, pack_nibbles, quantize_mxfp4  # noqa: E402

ORDINARY = 768  # ids below are BPE ranks; 768..1023 are the added tokens


def read_ids(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def tiny_dims():
    d = dict(gen_model.PRESETS["tiny"])
    d["full_attn"] = gen_model.default_full_attn(d["layers"])
    return d


def heldout_windows(ids, seq, count):
    """`count` consecutive, non-overlapping windows of seq+1 tokens from the start."""
    n = min(count, (len(ids) - 1) // seq)
    return torch.stack([ids[i * seq:i * seq + seq + 1] for i in range(n)])


@torch.no_grad()
def perplexity(model, windows, batch=16):
    """exp(mean cross-entropy) over every predicted position of the windows."""
    total, n = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits = model.forward(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        n += w[:, 1:].numel()
    return math.exp(total / n)


def unigram_perplexity(train, held):
    """Held-out perplexity of add-one unigram frequencies over the ordinary ids."""
    counts = np.bincount(train.numpy(), minlength=ORDINARY)[:ORDINARY] + 1.0
    logp = np.log(counts / counts.sum())
    return math.exp(-float(np.mean(logp[held.numpy()])))


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def export_tensors(model):
    """name -> (dtype, numpy array) of every language-model tensor of the checkpoint."""
    s = model.s
    out = {}
    f32 = ("_conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "e_score_correction_bias")
    for name, t in model.p.items():
        if name.endswith((".w1", ".w3", ".w2")):
            continue
        full = "language_model.lm_head.weight" if name == "lm_head.weight" else PREFIX + name
        a = t.detach().to(torch.float32)
        if name.endswith("A_log"):  # released length: max(heads, head_dim), zeros after
            a = torch.cat([a, torch.zeros(max(s.kda_heads, s.kda_dim) - s.kda_heads)])
        if name.endswith(f32):
            out[full] = ("F32", a.numpy())
        else:
            out[full] = ("BF16", a.numpy())
    for L in range(1, s.layers):
        m = f"layers.{L}.block_sparse_moe."
        for wn in ("w1", "w3", "w2"):
            w = model.p[m + wn].detach()
            for e in range(s.experts):
                _, nib, scales = quantize_mxfp4(w[e])
                q = f"{PREFIX}{m}experts.{e}.{wn}."
                out[q + "weight_packed"] = ("U8", pack_nibbles(nib.to(torch.int64)).numpy())
                out[q + "weight_scale"] = ("U8", scales.numpy())
    return out


def exported_model(model, tensors):
    """A K3 whose float32 parameters are what the engine reads back from `tensors`:
    BF16 rounded, MXFP4 dequantised (the model whose perplexity is 'after export')."""
    from safetensors_io import bf16_bits_to_f32, f32_to_bf16_bits
    p = {}
    for name, t in model.p.items():
        if name.endswith((".w1", ".w3", ".w2")):
            p[name] = quantize_mxfp4(t.detach().reshape(-1, t.shape[-1]))[0].reshape(t.shape)
            continue
        full = "language_model.lm_head.weight" if name == "lm_head.weight" else PREFIX + name
        dtype, a = tensors[full]
        if dtype == "BF16":
            a = bf16_bits_to_f32(f32_to_bf16_bits(a))
        if name.endswith("A_log"):
            a = a[:t.numel()]
        p[name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(t.shape)
    return K3(model.s, p)


def write_checkpoint(out_dir, tensors, seed):
    """Shards, index and config.json in gen_model's layout for preset tiny (same units,
    same expert order, same vision tensors), the trained values in place of random ones."""
    d = tiny_dims()
    d["seed"] = seed
    units = gen_model.build_plan(d, seed, "BF16")
    filled = []
    for unit in units:
        new = []
        for name, dtype, shape, gen in unit:
            if name in tensors:
                tdtype, arr = tensors[name]
                if tdtype != dtype or tuple(arr.shape) != shape:
                    raise SystemExit(f"{name}: trained {tdtype}{arr.shape} vs plan {dtype}{shape}")
                gen = gen_model.gen_const(arr)
            elif name.startswith("language_model."):
                raise SystemExit(f"{name}: not trained")
            new.append((name, dtype, shape, gen))
        filled.append(new)
    gen_model.write_checkpoint(out_dir, d, filled, d["shards"], "BF16")


def main(argv=None):
    ap = argparse.ArgumentParser(description="train the tiny English K3")
    ap.add_argument("data_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--qat-steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--save-float", default=None, help="also torch.save the float weights")
    a = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    train = read_ids(os.path.join(a.data_dir, "train.ids"))
    held = read_ids(os.path.join(a.data_dir, "heldout.ids"))
    windows = heldout_windows(held, a.seq, a.eval_windows)
    print(f"tokens: train {len(train)}, held-out {len(held)} ({windows[:, 1:].numel()} scored)")
    print(f"unigram baseline: held-out perplexity {unigram_perplexity(train, held):.2f}")

    d = tiny_dims()
    cfg = gen_model.make_config(d, "BF16", False)
    shape = Shape(cfg["text_config"])
    model = K3(shape, K3.init(shape, gen))
    for t in model.p.values():
        t.requires_grad_(True)
    biases = {n: t for n, t in model.p.items() if n.endswith("e_score_correction_bias")}
    decay = [t for n, t in model.p.items() if t.dim() >= 2 and n not in biases]
    other = [t for n, t in model.p.items() if t.dim() < 2 and n not in biases]
    for t in biases.values():
        t.requires_grad_(False)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    nparam = sum(t.numel() for t in model.p.values())
    print(f"parameters: {nparam} ({sum(t.numel() for n, t in model.p.items() if n.endswith(('.w1', '.w3', '.w2')))} in routed experts)")

    t0 = time.time()
    ema = None
    for step in range(a.steps):
        model.quantized = step >= a.steps - a.qat_steps
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        starts = torch.randint(0, len(train) - a.seq - 1, (a.batch,), generator=gen)
        batch = torch.stack([train[s:s + a.seq + 1] for s in starts.tolist()])
        load = {}
        logits = model.forward(batch[:, :-1], load)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([t for t in model.p.values() if t.requires_grad], 1.0)
        opt.step()
        with torch.no_grad():  # noaux_tc balancing: nudge the bias against the load
            for L, counts in load.items():
                b = biases[f"layers.{L}.block_sparse_moe.gate.e_score_correction_bias"]
                b += a.bias_rate * torch.sign(counts.mean() - counts).to(b.dtype)
        ema = float(loss) if ema is None else 0.95 * ema + 0.05 * float(loss)
        if step % 25 == 0 or step == a.steps - 1:
            print(f"step {step:5d}  loss {float(loss):.4f}  ema {ema:.4f}  lr {opt.param_groups[0]['lr']:.2e}"
                  f"  {'mxfp4 ' if model.quantized else ''}{time.time() - t0:7.1f} s", flush=True)
        if (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            print(f"step {step + 1:5d}  held-out perplexity {perplexity(model, windows):.2f}", flush=True)
    print(f"trained {a.steps} steps in {time.time() - t0:.1f} s")

    model.quantized = False
    for t in model.p.values():
        t.requires_grad_(False)
    if a.save_float:
        torch.save(model.p, a.save_float)
    ppl_float = perplexity(model, windows)
    tensors = export_tensors(model)
    ppl_export = perplexity(exported_model(model, tensors), windows)
    print(f"held-out perplexity: float32 weights {ppl_float:.2f}, exported (BF16 + MXFP4 experts) {ppl_export:.2f}")
    write_checkpoint(a.out_dir, tensors, a.seed)
    for f in sorted(os.listdir(a.out_dir)):
        if f.endswith(".safetensors"):
            with open(os.path.join(a.out_dir, f), "rb") as fh:
                print(f"sha256 {hashlib.sha256(fh.read()).hexdigest()}  {f}")
    with open(os.path.join(a.out_dir, "training.json"), "w") as f:
        json.dump({"seed": a.seed, "steps": a.steps, "qat_steps": a.qat_steps, "batch": a.batch,
                   "seq": a.seq, "lr": a.lr, "warmup": a.warmup, "bias_rate": a.bias_rate,
                   "torch": torch.__version__,
                   "final_loss_ema": round(ema, 4),
                   "heldout_tokens_scored": int(windows[:, 1:].numel()),
                   "heldout_perplexity_float": round(ppl_float, 3),
                   "heldout_perplexity_exported": round(ppl_export, 3),
                   "unigram_perplexity": round(unigram_perplexity(train, held), 3)}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
