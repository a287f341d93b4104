#!/bin/sh
# Rebuild tests/fixtures/tiny-en from nothing: corpus (npm), vocabulary and token streams
# (the engine's own BPE trainer and tokenizer, Deno), training and export (PyTorch),
# the check against the float64 oracle, then the committed reference tokens.
#
#   sh tools/train_tiny/run.sh [OUT_DIR [train.py flags]]   (default tests/fixtures/tiny-en)
#
# Needs npm, Debian's python3-torch and libopenblas0-serial (see README.md here); the
# tests never do: they read the committed weights.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/tests/fixtures/tiny-en}
[ $# -gt 0 ] && shift
TORCH_PY=${TORCH_PY:-/usr/bin/python3}
DATA=$(mktemp -d "${TMPDIR:-/tmp}/tiny-en-data.XXXXXX")
trap 'rm -rf "$DATA"' EXIT INT TERM
python3 "$ROOT/tools/train_tiny/corpus.py" "$DATA"
"$ROOT/node_modules/.bin/deno" run -A "$ROOT/tools/train_tiny/vocab.ts" "$DATA" "$OUT"
"$TORCH_PY" "$ROOT/tools/train_tiny/train.py" "$DATA" "$OUT" "$@"
"$TORCH_PY" "$ROOT/tools/train_tiny/check.py" "$OUT"
if [ "$OUT" = "$ROOT/tests/fixtures/tiny-en" ]; then python3 "$ROOT/tests/oracle/make_fixtures.py"; fi
