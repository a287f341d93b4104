/**
 * Contexts up to the model's window, sized by the memory plan: `--context N|auto` read
 * (cli/flag_groups/model.ts), the share of the memory `auto` gives the MLA caches
 * (plan_state.ts autoContextPositions), and `fitContext` (weights/plan.ts): an explicit
 * context too long for the memory is a usage error naming the most that fit, `auto` takes
 * them, and when not even one position fits the plan's own refusal stands.
 */

import assert from "node:assert/strict";
import { contextFlag, contextOpenOptions } from "../../cli/flag_groups/model.ts";
import { EXIT, K3Error } from "../../engine/errors.ts";
import { type K3Config, MAX_CONTEXT, modelWindow } from "../../engine/model/config.ts";
import { releasedK3 } from "../../engine/model/shapes.ts";
import { stateBytes } from "../../engine/model/state.ts";
import { fitContext, type MemoryPlan } from "../../engine/weights/plan.ts";
import { AUTO_CONTEXT_MIN, autoContextPositions } from "../../engine/weights/plan_state.ts";

Deno.test("--context: auto by default, N within 1..MAX_CONTEXT; beyond the model's window refused", () => {
  assert.equal(contextFlag(undefined, 2), "auto");
  assert.equal(contextFlag("auto", 2), "auto");
  assert.equal(contextFlag("8192", 2), 8192);
  assert.throws(() => contextFlag("1", 2), /--context/);
  assert.throws(() => contextFlag(String(MAX_CONTEXT + 1), 2), /--context/);
  const cfg = { ...releasedK3(), maxPositions: 262144 } as K3Config;
  assert.equal(modelWindow(cfg), 262144);
  assert.equal(modelWindow({ ...cfg, maxPositions: undefined }), MAX_CONTEXT);
  assert.deepEqual(contextOpenOptions("auto", cfg, 4), { capacity: 262144, autoCapacity: true });
  assert.equal(contextOpenOptions(262144, cfg, 4).capacity, 262144);
  assert.throws(
    () => contextOpenOptions(262145, cfg, 4),
    (e) => e instanceof K3Error && e.exitCode === EXIT.usage && /the model's window is 262144/.test(e.message),
  );
  const refusal = contextOpenOptions(100000, cfg, 4).capacityRefusal!(9000);
  assert.match(refusal, /^--context 100000 does not fit .* at most 9000 positions .*--parallel.*--context auto/);
  assert.ok(!/\n/.test(refusal));
});

Deno.test("--context auto: the MLA caches within a quarter of the memory, never below 4,096", () => {
  const st = stateBytes(releasedK3());
  assert.equal(st.perPosition, 55296);
  assert.equal(autoContextPositions(st, 8e9, 1), 36168);
  assert.equal(autoContextPositions(st, 8e9, 4), 9042);
  assert.equal(autoContextPositions(st, 64e9, 4), 72337);
  assert.equal(autoContextPositions(st, 8e9, 16), AUTO_CONTEXT_MIN);
  assert.equal(autoContextPositions(st, undefined, 4), Infinity);
});

Deno.test("fitContext: the want when it fits; explicit and too long is refused naming the most; auto takes it", () => {
  const most = 5000;
  const planFor = (positions: number) => {
    if (positions > most) throw new K3Error(`memory plan needs more than is available for ${positions}`);
    return { state: { positions } } as MemoryPlan;
  };
  const refusal = (fit: number) => `--context 9000: at most ${fit}`;
  assert.equal(fitContext(planFor, most, false, refusal).state.positions, most);
  assert.throws(
    () => fitContext(planFor, most + 1, false, refusal),
    (e) => e instanceof K3Error && e.exitCode === EXIT.usage && e.message === `--context 9000: at most ${most}`,
  );
  assert.equal(fitContext(planFor, 262144, true, refusal).state.positions, most);
  // Not one position fits: the plan's own refusal (exit 1), not a usage error.
  const never = (p: number): MemoryPlan => {
    throw new K3Error(`memory plan needs more for ${p}`);
  };
  assert.throws(
    () => fitContext(never, 100, true, refusal),
    (e) => e instanceof K3Error && e.exitCode === EXIT.runtime,
  );
  // A usage error while planning is not a memory refusal: it stands as it is.
  const usage = (): MemoryPlan => {
    throw new K3Error("--trunk-gb: bad", EXIT.usage);
  };
  assert.throws(() => fitContext(usage, 100, true, refusal), /--trunk-gb: bad/);
});
