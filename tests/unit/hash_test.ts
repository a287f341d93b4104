/**
 * k3w64 (kernels/k3io.c), k3's checksum: every build of the library (scalar, avx2, avx512
 * where present, native) gives the same digest for the same bytes whatever the start
 * alignment, the streaming split (multiples of 64) or the pread chunking. A changed
 * byte anywhere changes the digest. (`make -C kernels check-arm` compares NEON to scalar;
 * tests/oracle/k3w64_test.ts compares every build with the Python definition.)
 *
 * @module
 */
import assert from "node:assert/strict";
import { ioSymbols } from "../../engine/native/symbols.ts";
import { k3w64Hex, libraryBuilds, noise } from "../helpers.ts";

type Io = Deno.DynamicLibrary<typeof ioSymbols>;

/** Every build, opened for the I/O symbols. */
const libs = () => libraryBuilds(ioSymbols);

const hex = (b: bigint) => b.toString(16).padStart(16, "0");

function streamed(l: Io, bytes: Uint8Array, splits: number[]): string {
  const s = new BigUint64Array(12);
  const sp = Deno.UnsafePointer.of(s)!;
  l.symbols.k3io_hash_init(sp);
  let at = 0;
  for (const n of [...splits, bytes.length - splits.reduce((a, b) => a + b, 0)]) {
    const part = bytes.subarray(at, at + n);
    assert.equal(l.symbols.k3io_hash_update(sp, n ? Deno.UnsafePointer.of(part) : null, BigInt(n)), 0);
    at += n;
  }
  return hex(l.symbols.k3io_hash_digest(sp));
}

Deno.test("k3w64: alignment, streaming splits and every build agree; any changed byte changes it", () => {
  const all = libs();
  try {
    const big = noise(300_000 + 64, 77);
    let rnd = 12345;
    const next = (n: number) => {
      rnd = (rnd * 1103515245 + 12345) >>> 0;
      return (rnd >>> 8) % n;
    };
    for (let c = 0; c < 120; c++) {
      const len = c < 40 ? c * 7 : next(300_000), off = next(64);
      const bytes = big.subarray(off, off + len);
      const want = k3w64Hex(all[0][1], bytes);
      const splits: number[] = [];
      for (let left = len; left > 64 && splits.length < 6;) {
        const n = next(Math.floor(left / 64)) * 64;
        splits.push(n);
        left -= n;
      }
      for (const [name, l] of all) {
        assert.equal(k3w64Hex(l, bytes), want, `${name}: ${len} bytes at +${off}`);
        assert.equal(streamed(l, bytes, splits), want, `${name}: ${len} bytes split ${splits}`);
        assert.equal(k3w64Hex(l, bytes.slice()), want, `${name}: copied, aligned`);
      }
      if (len > 0) {
        const flipped = bytes.slice();
        flipped[next(len)] ^= 1 << next(8);
        for (const [name, l] of all) assert.notEqual(k3w64Hex(l, flipped), want, `${name}: a flipped bit`);
      }
    }
    // a zero byte appended, and a stripe moved, are not the same input
    const a = noise(4096, 5);
    const b = new Uint8Array(4097);
    b.set(a);
    const swapped = a.slice();
    swapped.set(a.subarray(0, 64), 64);
    swapped.set(a.subarray(64, 128), 0);
    for (const [name, l] of all) {
      assert.notEqual(k3w64Hex(l, b), k3w64Hex(l, a), `${name}: trailing zero`);
      assert.notEqual(k3w64Hex(l, swapped), k3w64Hex(l, a), `${name}: two stripes swapped`);
      // an update after a partial stripe is refused
      const s = new BigUint64Array(12), sp = Deno.UnsafePointer.of(s)!;
      l.symbols.k3io_hash_init(sp);
      assert.equal(l.symbols.k3io_hash_update(sp, Deno.UnsafePointer.of(a), 100n), 0);
      assert.equal(l.symbols.k3io_hash_update(sp, Deno.UnsafePointer.of(a), 64n), -1);
    }
  } finally {
    all.forEach(([, l]) => l.close());
  }
});

Deno.test("k3io_pread_hash: any chunking gives the one-shot digest; a short read gives none", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-hash-" });
  const all = libs();
  try {
    const data = noise(3 * 65536 + 4096, 9);
    const path = `${dir}/d.bin`;
    await Deno.writeFile(path, data);
    for (const [name, l] of all) {
      const fd = l.symbols.k3io_open(new TextEncoder().encode(path + "\0"), 0);
      assert.ok(fd >= 0);
      const buf = new Uint8Array(data.length + 4096);
      const out = new BigUint64Array(1);
      for (const [len, off] of [[data.length, 0], [65536, 4096], [100_000, 640]]) {
        const want = k3w64Hex(l, data.subarray(off, off + len));
        for (const chunk of [0, 64, 4096, 65536, 1 << 20]) {
          out[0] = 0n;
          const n = await l.symbols.k3io_pread_hash(
            fd,
            Deno.UnsafePointer.of(buf),
            BigInt(len),
            BigInt(off),
            BigInt(chunk),
            Deno.UnsafePointer.of(out),
          );
          assert.equal(Number(n), len);
          assert.equal(hex(out[0]), want, `${name}: ${len} at ${off}, chunk ${chunk}`);
        }
      }
      // past the end: short, no digest written
      out[0] = 7n;
      const n = await l.symbols.k3io_pread_hash(
        fd,
        Deno.UnsafePointer.of(buf),
        8192n,
        BigInt(data.length - 4096),
        4096n,
        Deno.UnsafePointer.of(out),
      );
      assert.equal(Number(n), 4096);
      assert.equal(out[0], 7n);
      // a chunk that is not a multiple of 64 is refused
      const bad = await l.symbols.k3io_pread_hash(
        fd,
        Deno.UnsafePointer.of(buf),
        4096n,
        0n,
        100n,
        Deno.UnsafePointer.of(out),
      );
      assert.equal(Number(bad), -22);
      l.symbols.k3io_close(fd);
    }
  } finally {
    all.forEach(([, l]) => l.close());
    await Deno.remove(dir, { recursive: true });
  }
});
