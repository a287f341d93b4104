/** The start-up rate probes of the plan's prediction (weights/rate_probe.ts). */

import assert from "node:assert/strict";
import { kernels } from "../../engine/native/ffi.ts";
import { measureDense, measureDiskRate, measureRates } from "../../engine/weights/rate_probe.ts";
import { DEFAULT_COMPUTE } from "../../engine/weights/throughput.ts";
import { tempDir } from "../helpers.ts";

Deno.test("rate probe: the disk probe reads the whole file (a rate, not a fraction of one), and a short file is refused", async () => {
  await using dir = await tempDir();
  const path = `${dir.path}/probe.bin`;
  await Deno.writeFile(path, new Uint8Array(40 << 20).fill(7));
  const k = kernels();
  const t0 = performance.now();
  const rate = await measureDiskRate(k, path, 1 << 30);
  const seconds = (performance.now() - t0) / 1000;
  // 40 MB were read in at most `seconds`: the rate is at least that average (a probe that
  // lost count of concurrent reads would report a fraction of it).
  assert.ok(rate >= (40 << 20) / seconds, `${rate} B/s for 40 MB in ${seconds} s`);
  assert.ok(Number.isFinite(rate));
  await Deno.writeFile(`${dir.path}/empty.bin`, new Uint8Array(100));
  assert.equal(await measureDiskRate(k, `${dir.path}/empty.bin`), Infinity, "nothing to time under 4096 bytes");
});

Deno.test("rate probe: the bf16 rate is positive and finite, and the other rates are its shares", async () => {
  const k = kernels();
  const dense = await measureDense(k, 1, 1);
  assert.ok(dense.rate > 0 && Number.isFinite(dense.rate));
  assert.ok(dense.rowGrowth >= 0 && Number.isFinite(dense.rowGrowth), `row growth ${dense.rowGrowth}`);
  await using dir = await tempDir();
  await Deno.writeFile(`${dir.path}/t.bin`, new Uint8Array(1 << 20));
  const r = await measureRates(k, `${dir.path}/t.bin`, 1);
  assert.ok(Math.abs(r.expert / r.dense - DEFAULT_COMPUTE.expert / DEFAULT_COMPUTE.dense) < 1e-12);
  assert.ok(r.rowGrowth >= 0 && Number.isFinite(r.rowGrowth));
  assert.equal(r.expertRowGrowth, r.rowGrowth, "the MXFP4 row growth is taken as the bf16 one's");
});
