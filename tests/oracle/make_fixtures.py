#!/usr/bin/env python3
"""Regenerate the committed oracle fixtures (`deno task fixtures`).

  tests/fixtures/tiny/            synthetic K3 checkpoint: gen_model.py preset tiny, seed 1,
                                  3 shards, BF16 (config.json, shards, index)
  tests/fixtures/tiny/reference.json, reference_logits.f32
                                  reference.py greedy decode of PROMPT for GEN tokens
  tests/fixtures/ops.json         per-kernel fixtures (make_ops.py)
  tests/fixtures/tiny-en/reference.json, reference_logits.f32
                                reference.py greedy decode of PROMPT_EN on the trained
                                English model (its weights are committed: they come from
                                tools/train_tiny, which needs PyTorch; see its README)

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

TINY_EN = os.path.join(FIX, "tiny-en")
# The start of a held-out sentence (Brown corpus, fiction) and its ids under the
# tiny-en tokenizer (tests/unit/tiny_en_test.ts checks the engine encodes it so).
PROMPT_EN_TEXT = "She wanted to be with him, to give him"
PROMPT_EN = [83, 257, 264, 406, 274, 288, 302, 342, 447, 44, 288, 309, 408, 447]
GEN_EN = 32


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
    run(os.path.join(HERE, "reference.py"), TINY_EN, "--ids", ",".join(map(str, PROMPT_EN)),
        "--gen", str(GEN_EN), "--text", PROMPT_EN_TEXT,
        "--out", os.path.join(TINY_EN, "reference.json"),
        "--logits", os.path.join(TINY_EN, "reference_logits.f32"))


if __name__ == "__main__":
    main()
