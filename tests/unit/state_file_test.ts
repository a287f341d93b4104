/**
 * Saved states: save after a prefix, load, continue: the same logits bit for bit as one
 * uninterrupted run; and every kind of damage refused with one line.
 *
 * @module
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { openModel } from "../../engine/open.ts";
import { prefill } from "../../engine/generate/generate.ts";
import { argmax } from "../../engine/generate/sampling.ts";
import { loadState, modelFingerprint, saveState } from "../../engine/generate/state_file.ts";
import { K3Error } from "../../engine/errors.ts";
import type { K3Model } from "../../engine/model/model.ts";
import type { SequenceState } from "../../engine/model/state.ts";
import { tempDir, TINY } from "../helpers.ts";

const PROMPT = [5, 17, 300, 44, 901, 12, 3, 77, 250, 610, 8, 19];

/** Greedy continuation of a state whose last logits are `logits`: n tokens and their logits. */
async function greedy(model: K3Model, state: SequenceState, logits: Float32Array, n: number) {
  const ids: number[] = [], rows: Float32Array[] = [];
  for (let i = 0; i < n; i++) {
    rows.push(logits.slice());
    ids.push(argmax(logits));
    logits = await model.forward(state, [ids[i]]);
  }
  return { ids, rows };
}

Deno.test("state save/load: a run resumed from a saved state equals one uninterrupted run, bit for bit", async () => {
  await using dir = await tempDir();
  const opened = await openModel(TINY, { capacity: 40, chunk: 4 });
  try {
    const { model } = opened;
    const fp = await modelFingerprint(opened);
    const whole = model.newState();
    const a = await greedy(model, whole, await prefill(model, whole, PROMPT), 6);
    whole.free();
    for (const cut of [0, 1, 7, PROMPT.length]) {
      const s1 = model.newState();
      if (cut > 0) await prefill(model, s1, PROMPT.slice(0, cut));
      const path = `${dir.path}/s${cut}.k3state`;
      await saveState(path, model, s1, PROMPT.slice(0, cut), fp, { note: "x" });
      s1.free();
      const loaded = await loadState(path, model, fp);
      assert.deepEqual(loaded.tokens, PROMPT.slice(0, cut));
      assert.deepEqual(loaded.meta, { note: "x" });
      assert.equal(loaded.state.pos, cut);
      const rest = PROMPT.slice(cut);
      let logits: Float32Array;
      if (rest.length) logits = await prefill(model, loaded.state, rest);
      else {
        // The whole prompt was saved: its last logits come from feeding the next token,
        // so compare from the second generated token on.
        logits = await model.forward(loaded.state, [a.ids[0]]);
      }
      const b = await greedy(model, loaded.state, logits, rest.length ? 6 : 5);
      loaded.state.free();
      const off = rest.length ? 0 : 1;
      assert.deepEqual(b.ids, a.ids.slice(off), `cut ${cut}`);
      b.rows.forEach((r, i) => assert.deepEqual(new Uint8Array(r.buffer), new Uint8Array(a.rows[i + off].buffer)));
    }
  } finally {
    await opened.close();
  }
});

Deno.test("state files: truncation, corruption, version, another model, too many positions: refused", async () => {
  await using dir = await tempDir();
  const opened = await openModel(TINY, { capacity: 16, chunk: 4 });
  const small = await openModel(TINY, { capacity: 4, chunk: 4 });
  const fewer = await openModel(TINY, { capacity: 16, chunk: 4, layers: 4 });
  try {
    const { model } = opened;
    const fp = await modelFingerprint(opened);
    const s = model.newState();
    await prefill(model, s, PROMPT.slice(0, 6));
    const good = `${dir.path}/good.k3state`;
    await saveState(good, model, s, PROMPT.slice(0, 6), fp);
    s.free();
    const bytes = await Deno.readFile(good);
    const H = new DataView(bytes.buffer).getUint32(12, true);
    const refused = async (data: Uint8Array, re: RegExp, m: K3Model = model, f = fp) => {
      const p = `${dir.path}/bad.k3state`;
      await Deno.writeFile(p, data);
      await assert.rejects(
        () => loadState(p, m, f),
        (e) => e instanceof K3Error && re.test(e.message) && !e.message.includes("\n"),
        String(re),
      );
    };
    /** The file with its header edited and the checksum made valid again. */
    const reseal = (edit: (h: Record<string, unknown>) => void) => {
      const h = JSON.parse(new TextDecoder().decode(bytes.subarray(16, 16 + H)));
      edit(h);
      const json = new TextEncoder().encode(JSON.stringify(h));
      const body = new Uint8Array(16 + json.length + (bytes.length - 32 - 16 - H));
      body.set(bytes.subarray(0, 16));
      new DataView(body.buffer).setUint32(12, json.length, true);
      body.set(json, 16);
      body.set(bytes.subarray(16 + H, bytes.length - 32), 16 + json.length);
      const out = new Uint8Array(body.length + 32);
      out.set(body);
      out.set(createHash("sha256").update(body).digest(), body.length);
      return out;
    };
    for (const n of [0, 3, 12, 16, 16 + H - 1, 16 + H + 5, bytes.length - 33, bytes.length - 1]) {
      await refused(
        bytes.slice(0, n),
        n < 8 && n > 0 ? /truncated|not a k3 state/ : n === 0 ? /not a k3 state/ : /truncated/,
      );
    }
    const longer = new Uint8Array(bytes.length + 1);
    longer.set(bytes);
    await refused(longer, /too long/);
    for (const at of [20, 16 + H + 3, bytes.length - 40, bytes.length - 1]) {
      const c = bytes.slice();
      c[at] ^= 0x10;
      await refused(c, /checksum|corrupt/);
    }
    const magic = bytes.slice();
    magic[0] = 0x4a;
    await refused(magic, /not a k3 state file/);
    const ver = bytes.slice();
    new DataView(ver.buffer).setUint32(8, 1, true); // a file from before the k3w64 weight sample
    await refused(ver, /version 1; this k3 reads version 2/);
    await refused(bytes, /different weights/, model, { ...fp, weights: "0123456789abcdef" });
    await refused(bytes, /different model config/, fewer.model, await modelFingerprint(fewer));
    await refused(bytes, /holds 6 positions, more than the 4/, small.model, await modelFingerprint(small));
    await refused(reseal((h) => (h.tokens = [1, 2])), /tokens do not match pos/);
    await refused(reseal((h) => ((h.tokens as number[])[0] = 5000)), /outside the vocabulary/);
    await refused(reseal((h) => (h.kda = [0])), /layer lists/);
    await refused(reseal((h) => (h.pos = 5)), /tokens do not match pos|payload/);
    await refused(reseal((h) => (h.meta = 3)), /meta/);
    // The untouched file still loads.
    (await loadState(good, model, fp)).state.free();
  } finally {
    await fewer.close();
    await small.close();
    await opened.close();
  }
});
