/**
 * The tiny checkpoint written again with its tensors scattered over 4 shards: no layer's
 * (or expert's) tensors are contiguous, for the per-tensor read paths.
 *
 * @module
 */

import { Checkpoint } from "../engine/weights/safetensors.ts";
import { TINY } from "./helpers.ts";

/** Writes the tiny checkpoint again with its tensors shuffled over 4 shards. */
export async function shuffledCopy(dst: string): Promise<void> {
  const ck = await Checkpoint.open(TINY);
  try {
    const names = [...ck.tensors.keys()];
    // A fixed permutation that scatters each layer's tensors over every shard.
    const order = names.map((n, i) => ({ n, key: (i * 7919) % names.length })).sort((a, b) => a.key - b.key).map((x) =>
      x.n
    );
    const shards: string[][] = [[], [], [], []];
    order.forEach((n, i) => shards[i % 4].push(n));
    for (let s = 0; s < 4; s++) {
      const header: Record<string, unknown> = {};
      let at = 0;
      const parts: Uint8Array[] = [];
      for (const n of shards[s]) {
        const t = ck.get(n);
        const buf = new Uint8Array(t.bytes);
        await ck.read(t, buf);
        header[n] = { dtype: t.dtype, shape: t.shape, data_offsets: [at, at + t.bytes] };
        parts.push(buf);
        at += t.bytes;
      }
      let json = JSON.stringify(header);
      json += " ".repeat((8 - (json.length % 8)) % 8);
      const hb = new TextEncoder().encode(json);
      const out = new Uint8Array(8 + hb.length + at);
      new DataView(out.buffer).setBigUint64(0, BigInt(hb.length), true);
      out.set(hb, 8);
      let p = 8 + hb.length;
      for (const b of parts) {
        out.set(b, p);
        p += b.length;
      }
      await Deno.writeFile(`${dst}/model-0000${s + 1}-of-00004.safetensors`, out);
    }
  } finally {
    ck.close();
  }
  await Deno.copyFile(`${TINY}/config.json`, `${dst}/config.json`);
}
