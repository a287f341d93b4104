// Checkpoint.readTensors: deep O_DIRECT reads of tensors at any offset land exactly the
// tensor's bytes (unaligned starts, a span running past the end of the file, zero-size
// tensors, tensors larger than one read piece), and a shard cut short fails with one
// K3Error naming it.
import assert from "node:assert/strict";
import { Checkpoint } from "../../engine/weights/safetensors.ts";
import { kernels } from "../../engine/native/ffi.ts";
import { K3Error } from "../../engine/errors.ts";

/** Writes a one-shard checkpoint of U8 tensors with the given sizes, in order; returns the shard's bytes. */
async function writeShard(dir: string, sizes: number[]): Promise<{ file: string; data: Uint8Array; header: number }> {
  const meta: Record<string, unknown> = {};
  let at = 0;
  sizes.forEach((n, i) => {
    meta[`t${i}`] = { dtype: "U8", shape: [n], data_offsets: [at, at + n] };
    at += n;
  });
  // An odd header length, so no tensor starts on a 4096 boundary.
  const json = new TextEncoder().encode(JSON.stringify(meta) + " ".repeat(3));
  const data = new Uint8Array(at);
  for (let i = 0; i < at; i++) data[i] = (i * 2654435761) >>> 24;
  const file = `${dir}/model.safetensors`;
  const out = new Uint8Array(8 + json.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  await Deno.writeFile(file, out);
  return { file, data, header: 8 + json.length };
}

Deno.test("readTensors lands every tensor's exact bytes, at any offset and size", async () => {
  // /var/tmp is on the disk (O_DIRECT works there; tmpfs would fall back to buffered reads).
  const dir = await Deno.makeTempDir({ dir: "/var/tmp", prefix: "k3-read-" });
  try {
    const sizes = [5000, 0, 1, 4096, (16 << 20) + 12345, 3, 70001];
    const { data } = await writeShard(dir, sizes);
    const ckpt = await Checkpoint.open(dir);
    const k = kernels();
    const list = sizes.map((_, i) => ckpt.get(`t${i}`));
    const seen = new Set<number>();
    let start = 0;
    const starts = sizes.map((n) => (start += n) - n);
    await ckpt.readTensors(k, list, (i, { buf, delta }) => {
      seen.add(i);
      assert.ok(buf.bytes >= delta + sizes[i]);
      assert.deepEqual(
        buf.u8.subarray(delta, delta + sizes[i]),
        data.subarray(starts[i], starts[i] + sizes[i]),
        `t${i}`,
      );
      buf.free();
    });
    assert.equal(seen.size, sizes.length);
    ckpt.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("readTensors on a shard cut short fails with one line naming the shard", async () => {
  const dir = await Deno.makeTempDir({ dir: "/var/tmp", prefix: "k3-read-" });
  try {
    const { file, header } = await writeShard(dir, [10000, 30000]);
    const ckpt = await Checkpoint.open(dir);
    await Deno.truncate(file, header + 10000 + 100); // after the header was read
    let handed = 0;
    await assert.rejects(
      () => ckpt.readTensors(kernels(), [ckpt.get("t0"), ckpt.get("t1")], (_, r) => (handed++, r.buf.free())),
      (e: unknown) =>
        e instanceof K3Error && e.message.includes(file) && e.message.includes("t1") && !e.message.includes("\n"),
    );
    assert.ok(handed <= 1);
    ckpt.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
