/** Fuzz: safetensors shard headers (parseShardHeader) on structure-aware mutations of a real shard's header. */

import assert from "node:assert/strict";
import fc from "fast-check";
import { DTYPE_BYTES, parseShardHeader } from "../../engine/weights/safetensors.ts";
import { assertRefusal, check, jsonMutations, mutateAll } from "./fuzz.ts";
import { TINY } from "../helpers.ts";

Deno.test("fuzz safetensors header: refused with exit 1 and one line, or every tensor inside the file, sized, disjoint", () => {
  const file = `${TINY}/model-00001-of-00003.safetensors`;
  const bytes = Deno.readFileSync(file);
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const fileSize = bytes.length;
  const encode = (h: unknown, lenDelta: number) => {
    const json = new TextEncoder().encode(JSON.stringify(h));
    const out = new Uint8Array(8 + json.length);
    new DataView(out.buffer).setBigUint64(0, BigInt(Math.max(0, json.length + lenDelta)), true);
    out.set(json, 8);
    return out;
  };
  const ref = parseShardHeader(file, encode(header, 0), fileSize - n + JSON.stringify(header).length);
  const arb = fc.tuple(jsonMutations, fc.constantFrom(0, 0, 0, -1, 1, 2 ** 40), fc.constantFrom(0, 0, -1000, 1000));
  check("safetensors header", arb, ([ms, lenDelta, sizeDelta]) => {
    const mutated = mutateAll(header, ms);
    const enc = encode(mutated, lenDelta);
    const size = fileSize - n + (enc.length - 8) + sizeDelta; // the data section as in the real file
    let tensors;
    try {
      tensors = parseShardHeader(file, enc, size);
    } catch (e) {
      return assertRefusal(e, [1]);
    }
    const dataStart = 8 + enc.length - 8;
    const live = tensors.filter((t) => t.bytes > 0).sort((a, b) => a.offset - b.offset);
    for (const t of tensors) {
      assert.ok(t.offset >= dataStart && t.offset + t.bytes <= size, `${t.name} inside the file`);
      assert.equal(t.bytes, t.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[t.dtype]);
    }
    for (let i = 1; i < live.length; i++) {
      assert.ok(live[i - 1].offset + live[i - 1].bytes <= live[i].offset, "disjoint");
    }
    if (lenDelta === 0 && sizeDelta === 0 && JSON.stringify(mutated) === JSON.stringify(header)) {
      assert.equal(tensors.length, ref.length);
    }
  });
});
