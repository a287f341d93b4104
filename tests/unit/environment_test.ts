/**
 * The engine's switches come from the environment in one place (cli/environment.ts): unset
 * variables leave the engine's defaults, and each variable sets exactly its switch.
 *
 * @module
 */

import assert from "node:assert/strict";
import { engineEnvironment } from "../../cli/environment.ts";

const NAMES = ["K3_MEM_AVAILABLE_GB", "K3_EXPERT_READ_AHEAD", "K3_TRUNK_DECODE"];

/** `engineEnvironment()` with exactly the variables `vars` of NAMES set (the rest unset). */
function switchesWith(vars: Record<string, string>) {
  const saved = NAMES.map((n) => [n, Deno.env.get(n)] as const);
  try {
    for (const n of NAMES) Deno.env.delete(n);
    for (const [n, v] of Object.entries(vars)) Deno.env.set(n, v);
    return engineEnvironment();
  } finally {
    for (const [n, v] of saved) v === undefined ? Deno.env.delete(n) : Deno.env.set(n, v);
  }
}

Deno.test("engineEnvironment: unset variables leave every switch at the engine's default", () => {
  assert.deepEqual(switchesWith({}), {});
  assert.deepEqual(switchesWith({ K3_MEM_AVAILABLE_GB: "" }), {}, "an empty figure is no figure");
  assert.deepEqual(switchesWith({ K3_EXPERT_READ_AHEAD: "1", K3_TRUNK_DECODE: "product" }), {});
});

Deno.test("engineEnvironment: each variable sets its own switch", () => {
  assert.deepEqual(switchesWith({ K3_MEM_AVAILABLE_GB: "0.3" }), {
    memoryAvailable: { bytes: 0.3 * 1e9, source: "K3_MEM_AVAILABLE_GB" },
  });
  assert.deepEqual(switchesWith({ K3_EXPERT_READ_AHEAD: "0" }), { expertReadAhead: false });
  assert.deepEqual(switchesWith({ K3_TRUNK_DECODE: "io" }), { trunkDecode: "io" });
});
