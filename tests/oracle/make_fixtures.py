#!/usr/bin/env python3
"""Regenerate the committed oracle fixtures (`deno task fixtures`).

  tests/fixtures/tiny/            synthetic K3 checkpoint: gen_model.py preset tiny, seed 1,
                                  3 shards, BF16 (config.json, shards, index)
  tests/fixtures/tiny/reference.json, reference_logits.f32
                                  reference.py greedy decode of PROMPT for GEN tokens
  tests/fixtures/ops.json         per-kernel fixtures (make_ops.py)

Only files this script owns are replaced: tiktoken.model / tokenizer_config.json that
live in tests/fixtures/tiny are left alone. Everything is deterministic (fixed seeds), so
re-running gives byte-identical files.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
TINY = os.path.join(FIX, "tiny")

# ~12 ordinary ids (below 768, the start of the added/special range of the tiny vocab)
PROMPT = [5, 17, 300, 42, 99, 123, 640, 7, 250, 511, 3, 77]
GEN = 20


def run(*args):
    subprocess.run([sys.executable, *args], check=True)


def main():
    os.makedirs(TINY, exist_ok=True)
    run(os.path.join(HERE, "gen_model.py"), TINY, "--preset", "tiny", "--seed", "1",
        "--shards", "3", "--float-dtype", "bf16")
    run(os.path.join(HERE, "reference.py"), TINY, "--ids", ",".join(map(str, PROMPT)),
        "--gen", str(GEN), "--out", os.path.join(TINY, "reference.json"),
        "--logits", os.path.join(TINY, "reference_logits.f32"))
    run(os.path.join(HERE, "make_ops.py"), os.path.join(FIX, "ops.json"))


if __name__ == "__main__":
    main()
