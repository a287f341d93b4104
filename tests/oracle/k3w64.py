#!/usr/bin/env python3
"""k3w64, k3's checksum (kernels/k3io.c), written out from its definition in pure Python,
so the C paths (scalar, AVX2, AVX-512, NEON) are checked against an independent statement.

  python3 tests/oracle/k3w64.py vectors   JSON known answers: [{"len", "hex" | "fill", "hash"}]
  python3 tests/oracle/k3w64.py key       the 32 key words (splitmix64 from 0x6B33773634)

Definition (all arithmetic mod 2**64, words little-endian):
  acc = 8 lanes, the XXH3 initial values; the input is cut into 64-byte stripes of 8 words,
  the last partial stripe zero-padded. Stripe s (counted from 0) uses j = s mod 16:
  for lane i: d = word i, x = d ^ key[j + i]; acc[i ^ 1] += d; acc[i] += lo32(x) * hi32(x).
  After stripe s when s mod 16 == 15: acc[i] = ((a ^ (a >> 47)) ^ key[16 + i]) * 0x9E3779B1.
  digest: h = len * P64_1 + sum_k fold(acc[2k] ^ key[24 + 2k], acc[2k+1] ^ key[25 + 2k])
  with fold(a, b) = lo64(a*b) ^ hi64(a*b); then h ^= h >> 37; h *= 0x165667919E3779F9;
  h ^= h >> 32.
"""

import json
import random
import struct
import sys

M = (1 << 64) - 1
P64_1 = 0x9E3779B185EBCA87
INIT = [0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
        0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1]


def key_words(seed=0x6B33773634, n=32):
    """splitmix64 outputs 1..n from `seed` (also the matrix check's key: k3check.py)."""
    x, out = seed, []
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & M
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        out.append(z ^ (z >> 31))
    return out


KEY = key_words()


def k3w64(data: bytes) -> int:
    acc = list(INIT)
    n = len(data)
    padded = data + bytes((-n) % 64)
    for s in range(len(padded) // 64):
        j = s % 16
        words = struct.unpack_from("<8Q", padded, 64 * s)
        for i, d in enumerate(words):
            x = d ^ KEY[j + i]
            acc[i ^ 1] = (acc[i ^ 1] + d) & M
            acc[i] = (acc[i] + (x & 0xFFFFFFFF) * (x >> 32)) & M
        if j == 15:
            for i in range(8):
                a = acc[i]
                a ^= a >> 47
                a ^= KEY[16 + i]
                acc[i] = (a * 0x9E3779B1) & M
    h = (n * P64_1) & M
    for k in range(4):
        p = (acc[2 * k] ^ KEY[24 + 2 * k]) * (acc[2 * k + 1] ^ KEY[25 + 2 * k])
        h = (h + ((p & M) ^ (p >> 64))) & M
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & M
    h ^= h >> 32
    return h


def vectors():
    rng = random.Random(8)
    out = []
    for n in [0, 1, 7, 8, 31, 63, 64, 65, 127, 128, 1000, 1023, 1024, 1025, 1088, 2245, 17441, 40000]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        out.append({"len": n, "hex": data.hex(), "hash": "%016x" % k3w64(data)})
    for fill, n in [(0, 1 << 20), (255, 65536 + 3)]:
        out.append({"len": n, "fill": fill, "hash": "%016x" % k3w64(bytes([fill]) * n)})
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["vectors"]:
        print(json.dumps(vectors()))
    elif sys.argv[1:] == ["key"]:
        print("\n".join("0x%016x" % w for w in KEY))
    else:
        sys.exit(__doc__)
