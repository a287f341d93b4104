#!/usr/bin/env python3
"""k3's matrix check (kernels/k3.h, contract 5), written out from its definition in pure
Python, so the C paths (scalar, AVX2, AVX-512, NEON, fused into the product or not) are
checked against an independent statement.

  python3 tests/oracle/k3check.py vectors   JSON known answers:
                                            [{"rows", "rowbytes", "hex", "r0", "r1", "check"}]
  python3 tests/oracle/k3check.py file PATH OFFSET ROWS ROWBYTES [OFFSET ROWS ROWBYTES ...]
                                            JSON list of the checks of those tensors of a file
  python3 tests/oracle/k3check.py digest PATH OFFSET ROWS ROWBYTES [...]
                                            the k3w64 (tests/oracle/k3w64.py) of those checks as
                                            little-endian words: an expert table digest

Definition (all arithmetic mod 2**64, words little-endian): each row of `rowbytes` bytes is
cut into 32-byte units, the last zero padded; unit u is four words d[0..3] and uses key
words K[(u mod 16) + i] (splitmix64 outputs 1..19 from seed 0x6B33636B). Lanes a[0..3]
start at 0; per unit, x = d[i] ^ K[(u mod 16) + i], a[i] += d[i] + lo32(x) * hi32(x).
Row r's word: h = a0 ^ rotl(a1, 16) ^ rotl(a2, 32) ^ rotl(a3, 48); h += r * 0x9E3779B97F4A7C15;
then murmur3's fmix64. A row range's check is the sum of its rows' words.
"""

import json
import random
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the tree
from k3w64 import k3w64, key_words  # noqa: E402

M = (1 << 64) - 1


KEY = key_words(0x6B33636B, 19)


def rotl(v, s):
    return ((v << s) | (v >> (64 - s))) & M


def row_word(row: bytes, r: int) -> int:
    row = row + bytes(-len(row) % 32)
    a = [0, 0, 0, 0]
    for u in range(len(row) // 32):
        d = struct.unpack_from("<4Q", row, 32 * u)
        for i in range(4):
            x = d[i] ^ KEY[(u % 16) + i]
            a[i] = (a[i] + d[i] + (x & 0xFFFFFFFF) * (x >> 32)) & M
    h = a[0] ^ rotl(a[1], 16) ^ rotl(a[2], 32) ^ rotl(a[3], 48)
    h = (h + r * 0x9E3779B97F4A7C15) & M
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M
    return h ^ (h >> 33)


def check(data: bytes, rowbytes: int, r0: int, r1: int) -> int:
    return sum(row_word(data[r * rowbytes:(r + 1) * rowbytes], r) for r in range(r0, r1)) & M


def vectors():
    rng = random.Random(0x6B33)
    out = []
    # row lengths around the unit (32), the key period (16 units = 512 bytes) and bf16/f32
    # rows of 16-element blocks with remainders
    for rowbytes in [2, 30, 32, 34, 64, 96, 510, 512, 514, 1000, 1056, 2050]:
        rows = rng.randint(1, 6)
        data = bytes(rng.getrandbits(8) for _ in range(rows * rowbytes))
        r0 = rng.randint(0, rows - 1)
        for a, b in [(0, rows), (r0, rows)]:
            out.append({"rows": rows, "rowbytes": rowbytes, "hex": data.hex(), "r0": a, "r1": b,
                        "check": "%016x" % check(data, rowbytes, a, b)})
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["vectors"]:
        print(json.dumps(vectors()))
    elif sys.argv[1:2] in (["file"], ["digest"]) and len(sys.argv) % 3 == 0:
        with open(sys.argv[2], "rb") as f:
            data = f.read()
        n = [int(a) for a in sys.argv[3:]]
        checks = []
        for i in range(0, len(n), 3):
            off, rows, rowbytes = n[i:i + 3]
            checks.append(check(data[off:off + rows * rowbytes], rowbytes, 0, rows))
        if sys.argv[1] == "file":
            print(json.dumps(["%016x" % c for c in checks]))
        else:
            print(json.dumps("%016x" % k3w64(struct.pack("<%dQ" % len(checks), *checks))))
    else:
        sys.exit(__doc__)
