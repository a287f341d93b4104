/**
 * Layer-major prefill through the CLI: with default flags at the floor budget a 600-id
 * prompt runs in one segment that reads the trunk once and each routed expert at most once,
 * and every build of the kernel library gives the same logit bits as token by token.
 */

import assert from "node:assert/strict";
import { probeCpuFlags } from "../../engine/native/libpath.ts";
import { floorFlags, k3, packedFloor, ROOT, tempDir, TINY } from "../helpers.ts";

const PROMPT = Array.from({ length: 600 }, (_, i) => ((i * 7) % 700) + 1).join(",");

Deno.test("floor, default flags: a 600-id prompt reads the trunk once and each expert at most once", async () => {
  await using d = await tempDir();
  const { floor, layerSizes } = await packedFloor(TINY, `${d.path}/trunk`);
  const report = `${d.path}/r.json`;
  const out = await k3(["run", TINY, "--ids", PROMPT, "--gen", "1", ...floorFlags(floor), "--out", report]);
  assert.equal(out.code, 0, out.stderr);
  const r = JSON.parse(await Deno.readTextFile(report));
  const trunk = layerSizes.reduce((a, b) => a + b, 0);
  assert.equal(r.memory.chunk, 600, "--chunk auto: the whole prompt in one segment");
  assert.ok(r.trunk_bytes_read <= 1.3 * trunk, `trunk read ${r.trunk_bytes_read} B of ${trunk} B`);
  // Expert reads are counted, not weighed: a tiny expert (3,264 B) is read in whole 4 KB
  // O_DIRECT blocks around it (7.4 kB a read on average), so its bytes read exceed its own
  // bytes by the alignment while the count of reads is exact. One segment: one read (a
  // cache miss) at most per (layer, expert) any row chose; the tiny model's 12 MoE layers
  // of 8 experts hold 96.
  assert.ok(r.experts_routed <= 96, `${r.experts_routed} distinct routed experts`);
  assert.ok(
    r.expert_cache_misses <= r.experts_routed,
    `${r.expert_cache_misses} expert reads for ${r.experts_routed} distinct routed experts`,
  );
  assert.match(out.stderr, /prefill: a 600-token prompt in 1 segment of 600 reads/);
});

Deno.test("every kernel build: a 600-id prompt in one segment gives the logit bits of token by token", async () => {
  await using d = await tempDir();
  const dump = async (name: string, flags: string[], env?: Record<string, string>) => {
    const file = `${d.path}/${name}.f32`;
    const out = await k3(["run", TINY, "--ids", PROMPT, "--gen", "2", "--dump-logits", file, ...flags], { env });
    assert.equal(out.code, 0, out.stderr);
    return await Deno.readFile(file);
  };
  const want = await dump("chunk1", ["--chunk", "1", "-t", "1"]);
  const native = `${ROOT}/kernels/build/libk3.so`;
  const cpu = probeCpuFlags(native);
  for (const build of ["scalar", "avx2", "avx512"]) {
    if (build === "avx2" && !cpu.has("avx2")) continue;
    if (build === "avx512" && !cpu.has("avx512bw")) continue;
    const lib = `${ROOT}/kernels/build/libk3-${build}.so`;
    const got = await dump(build, ["-t", "2"], { K3_LIB: lib });
    assert.deepEqual(got, want, `${build}: logit bits of the one-segment prefill`);
  }
});
