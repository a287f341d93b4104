/**
 * Without a packed trunk the plan's notice says nothing is verified, not only the experts
 * (issue 35): the checkpoint's shards carry no checksums.
 *
 * @module
 */

import assert from "node:assert/strict";
import { k3, TINY } from "../helpers.ts";

Deno.test("run without a trunk: the notice says no weight is verified as it is read", async () => {
  const out = await k3(["run", TINY, "--ids", "5", "--gen", "1"], { seconds: 60 });
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /no packed trunk: no weight is verified as it is read/);
  assert.doesNotMatch(out.stderr, /routed experts are not verified per read: no packed trunk/);
});
