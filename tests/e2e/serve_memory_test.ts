/**
 * `k3 serve`'s memory under unauthenticated requests with odd 8 kB paths, in a process of
 * its own whose V8 old space is capped at 40 MB: per-request garbage is collected within
 * the cap (the server keeps answering), and 2,000 requests after a first 1,000 add little
 * resident memory (before the fixes, /metrics kept every path as a label
 * and the server grew by 60 MB per 2,000, never freed). Without the cap V8 lets its heap
 * grow lazily, which says nothing about what is retained.
 */

import assert from "node:assert/strict";
import { serveTiny } from "../helpers.ts";

const KEY = "memory-key-01";

Deno.test({
  name: "memory: 1,000 then 2,000 unauthenticated 8 kB paths: the server stays within its heap cap, RSS bounded",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--api-key", KEY], { denoFlags: ["--v8-flags=--max-old-space-size=40"] });
    const { url, child } = server;
    const rss = async () => {
      const ps = await new Deno.Command("ps", { args: ["-o", "rss=", "-p", String(child.pid)], stdout: "piped" })
        .output();
      return 1024 * Number(new TextDecoder().decode(ps.stdout).trim());
    };
    const round = async (count: number) => {
      for (let i = 0; i < count; i++) {
        const r = await fetch(`${url}/v1/${i}-${"\u00e9x\u0007%0a".repeat(620)}`, {
          method: i % 2 ? "POST" : "GET",
          headers: { "content-type": "application/json" },
          body: i % 2 ? "{}" : undefined,
        });
        assert.equal(r.status, 401);
        await r.body?.cancel();
      }
    };
    // A first 1,000 lets V8 settle into its cap; the 2,000 after it are measured.
    await round(1000);
    const first = await rss();
    await round(2000);
    const second = await rss();
    const metrics = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text();
    assert.equal((await server.stop()).code, 0);
    assert.ok(
      second - first < 24 << 20,
      `the second round grew RSS by ${second - first} bytes (${first} -> ${second})`,
    );
    assert.ok(metrics.length < 4096, `/metrics is ${metrics.length} bytes`);
    assert.match(metrics, /^k3_requests_total\{endpoint="other",status="401"\} 3000$/m);
  },
});
