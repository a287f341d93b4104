/**
 * The environment variables that set the engine's switches, read in one place: the engine
 * itself reads none (engine/open.ts EngineSwitches), so every command that opens a model
 * passes `engineEnvironment()` to `openModel`.
 *
 * - `K3_MEM_AVAILABLE_GB=GB`: plan against GB instead of MemAvailable and the cgroup limits
 *   (tests reach the memory refusals with it).
 * - `K3_EXPERT_READ_AHEAD=0`: do not read the next layer's experts ahead on a guess (the
 *   bench measures what the guess buys).
 * - `K3_TRUNK_DECODE=io`: decode every coded trunk piece on the I/O threads as it lands (the
 *   bench compares it with decoding in the products).
 *
 * @module
 */

import type { EngineSwitches } from "../engine/open.ts";
import { type Availability, memoryAvailability } from "../engine/native/available.ts";

/** The variable `name`: undefined when unset, or when the permission set does not grant
 * reading it (then it neither throws nor prompts). */
function variable(name: string): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") return undefined;
  return Deno.env.get(name);
}

/** The engine's switches as this process's environment sets them (unset: the defaults). */
export function engineEnvironment(): EngineSwitches {
  const switches: EngineSwitches = {};
  const gb = variable("K3_MEM_AVAILABLE_GB");
  if (gb !== undefined && gb !== "") {
    switches.memoryAvailable = { bytes: Number(gb) * 1e9, source: "K3_MEM_AVAILABLE_GB" };
  }
  if (variable("K3_EXPERT_READ_AHEAD") === "0") switches.expertReadAhead = false;
  if (variable("K3_TRUNK_DECODE") === "io") switches.trunkDecode = "io";
  return switches;
}

/** The memory a plan is checked against, as `openModel` takes it: K3_MEM_AVAILABLE_GB when
 * set, else the probe (MemAvailable and the cgroup limits; undefined when unknown). For the
 * commands that plan without opening a model (`k3 doctor`, `k3 presets`). */
export function availableMemory(): Availability | undefined {
  return engineEnvironment().memoryAvailable ?? memoryAvailability();
}
