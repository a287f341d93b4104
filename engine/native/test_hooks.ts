/**
 * Test hooks: the environment variables only tests set, to inject faults or shrink sizes so
 * that a tiny model reaches a code path. deno.json's production permission set "k3" does not
 * grant them (the test-only set "k3-test" does), so they are read through one function that
 * asks for the permission first: without it a read would throw NotCapable, or prompt on a
 * terminal.
 *
 * @module
 */

/** The test-only variables: `K3_FAULT_EXPERT_READ=L:E` (the read of expert E of layer L comes
 * up short), `K3_TEST_HEAD_CHUNK=BYTES` (lm_head chunk size of a streamed head),
 * `K3_FAULT_WRITE_ENOSPC=N` (writes fail with ENOSPC after N bytes), `K3_TEST_CHOOSE=ID,ID,...`
 * (`k3 chat` picks these ids in order, across turns, before its sampler: a random-weight
 * model's replies scripted, e.g. a tool call, while the model still runs every token),
 * `K3_TEST_EXPERT_SHUFFLE=SEED` (a layer's experts land in a shuffled order, expert_cache.ts). */
export type TestHook =
  | "K3_FAULT_EXPERT_READ"
  | "K3_TEST_HEAD_CHUNK"
  | "K3_FAULT_WRITE_ENOSPC"
  | "K3_TEST_CHOOSE"
  | "K3_TEST_EXPERT_SHUFFLE";

/** The value of test hook `name`: undefined when it is unset or when the running permission
 * set does not grant reading it (then it neither throws nor prompts). */
export function testHook(name: TestHook): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") return undefined;
  return Deno.env.get(name);
}
