/**
 * `k3 serve`'s flags for keys, timeouts, connections and Host names: a bad value is one
 * line and exit 2 before anything listens; `--api-key-file` gives the key without putting
 * it on the command line, and the server wants exactly that key.
 */

import assert from "node:assert/strict";
import { k3, serveTiny, tempDir, TINY } from "../helpers.ts";

Deno.test("serve flags: timeouts, --max-connections, --allowed-host, the key flags refused with exit 2 and one line", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(`${dir.path}/empty`, "\n");
  const cases: [string[], RegExp][] = [
    [["--header-timeout", "0"], /--header-timeout/],
    [["--body-timeout", "-1"], /--body-timeout/],
    [["--idle-timeout", "x"], /--idle-timeout/],
    [["--max-connections", "0"], /--max-connections/],
    [["--allowed-host", "http://a.example"], /--allowed-host/],
    [["--allowed-host", "a.example:80"], /--allowed-host/],
    [["--api-key-file", `${dir.path}/missing`], /--api-key-file: cannot read/],
    [["--api-key-file", `${dir.path}/empty`], /--api-key-file: the key is empty/],
    [["--api-key", "k", "--api-key-file", `${dir.path}/empty`], /not both/],
  ];
  for (const [flags, want] of cases) {
    const out = await k3(["serve", TINY, "--port", "0", ...flags]);
    assert.equal(out.code, 2, `${flags.join(" ")}: ${out.stderr}`);
    assert.match(out.stderr, want);
    assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
  }
});

Deno.test({
  name: "serve --api-key-file: the file's first line is the key",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    await using dir = await tempDir();
    await Deno.writeTextFile(`${dir.path}/key`, "file-key-123\nnot part of it\n");
    const server = await serveTiny(["--api-key-file", `${dir.path}/key`]);
    try {
      for (const [key, status] of [["file-key-123", 200], ["not part of it", 401], ["", 401]] as const) {
        const r = await fetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
        await r.body?.cancel();
        assert.equal(r.status, status, key);
      }
    } finally {
      assert.equal((await server.stop()).code, 0);
    }
  },
});
