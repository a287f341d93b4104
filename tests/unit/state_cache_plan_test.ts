/** The memory plan's state cache line: the flag, the default (what the plan leaves less 10%, capped), off. */

import assert from "node:assert/strict";
import { estimatedInput, makePlan } from "../../engine/weights/plan.ts";
import { formatPlan } from "../../engine/weights/plan_text.ts";
import { bytesText } from "../../engine/native/available.ts";
import { releasedK3 } from "../../engine/model/shapes.ts";
import { STATE_CACHE_DEFAULT_CAP, stateCacheDefault } from "../../engine/weights/plan_state.ts";

const cfg = releasedK3();
const floor = estimatedInput(cfg, { trunkDir: "t", trunkGB: 3, cacheGB: 1 }, 4096);

Deno.test("plan: no state cache asked, no line and nothing added", () => {
  const p = makePlan(floor);
  assert.equal(p.stateCache, null);
  assert.ok(!formatPlan(p).some((l) => l.includes("state cache")));
});

Deno.test("plan: --state-cache-gb is planned and counted in the total", () => {
  const base = makePlan(floor);
  const p = makePlan({ ...floor, stateCache: { gb: 2.5 } });
  assert.equal(p.stateCache!.bytes, 2.5e9);
  assert.equal(p.totalBytes, base.totalBytes + 2.5e9);
  assert.equal(p.stateCache!.perPosition, 55296);
  assert.match(
    formatPlan(p).join("\n"),
    /state cache +2\.50 GB +a ceiling, filled as conversations are kept \(not allocated up front\): kept conversation states: KDA 464\.6 MB/,
  );
  assert.match(formatPlan(makePlan({ ...floor, stateCache: { gb: 0 } })).join("\n"), /state cache .*off/);
  // The total apart from the ceiling: what is allocated at the start, then what it may grow to.
  const allocated = formatPlan(p).find((l) => l.trimStart().startsWith("allocated")) ?? "";
  assert.match(
    allocated,
    new RegExp(
      `allocated +${bytesText(base.totalBytes).replace(".", "\\.")} +\\+ .*; up to ${
        bytesText(p.totalBytes).replace(".", "\\.")
      } with the state cache full`,
    ),
  );
  assert.ok(!formatPlan(p).some((l) => l.trimStart().startsWith("total")));
});

Deno.test("plan: the default is what the plan leaves after trunk, experts and state, less 10%, at most the cap", () => {
  const base = makePlan(floor);
  const left = 6e9;
  const available = base.totalBytes + base.overheadBytes + left;
  const p = makePlan({ ...floor, available, stateCache: {} });
  assert.equal(p.stateCache!.bytes, Math.floor(0.9 * left));
  assert.equal(p.stateCache!.source, "default");
  assert.equal(stateCacheDefault(available, base.totalBytes), p.stateCache!.bytes);
  // The plan with its default cache still fits what is available.
  assert.ok(p.totalBytes + p.overheadBytes <= available);
  assert.match(
    formatPlan(p).join("\n"),
    /state cache +5\.40 GB .*default: what the plan leaves less 10%, at most 8\.00 GB/,
  );
  assert.equal(
    makePlan({ ...floor, available: available + 1e12, stateCache: {} }).stateCache!.bytes,
    STATE_CACHE_DEFAULT_CAP,
  );
  assert.equal(makePlan({ ...floor, stateCache: {} }).stateCache!.bytes, STATE_CACHE_DEFAULT_CAP);
  assert.equal(makePlan({ ...floor, available: base.totalBytes, stateCache: {} }).stateCache!.bytes, 0);
});
