/**
 * The chat page of `k3 serve` in real headless Chromium: runs tests/browser/web_page.ts
 * (the page's end-to-end tests) in a child `deno test -A`, because playwright-core reads
 * the whole environment and /proc, which the suite's permission set does not grant. The
 * browser is Debian's `chromium`; when it is missing this test fails, naming the fix.
 */

import assert from "node:assert/strict";
import { CHROMIUM, ROOT } from "../helpers.ts";

Deno.test("the chat page in headless Chromium (tests/browser/web_page.ts)", async () => {
  try {
    await Deno.stat(CHROMIUM);
  } catch {
    assert.fail(`${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; .ci/run does)`);
  }
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["test", "-A", "--no-check", `${ROOT}/tests/browser/web_page.ts`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, `${dec.decode(out.stdout)}\n${dec.decode(out.stderr)}`);
});
