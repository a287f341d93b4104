/**
 * The permission sets of deno.json as `deno run` / `deno compile` flags, so the tasks
 * (`-P=k3`), the compiled binary, the bundle's documented command line and the tests all
 * use one list, written once in deno.json.
 *
 * @module
 */

import config from "../deno.json" with { type: "json" };

/** One permission of a set: true (all), or the names/paths it is scoped to. */
export type Grant = boolean | string[];

/** The permission sets defined in deno.json, by name. */
export const PERMISSION_SETS: Record<string, Record<string, Grant>> = config.permissions;

/** `--allow-*` flags equivalent to the deno.json permission set `name`. */
export function permissionFlags(name: string): string[] {
  const set = PERMISSION_SETS[name];
  if (!set) throw new Error(`deno.json has no permission set ${JSON.stringify(name)}`);
  return Object.entries(set).flatMap(([kind, grant]) => {
    if (grant === false) return [];
    if (grant === true) return [`--allow-${kind}`];
    return [`--allow-${kind}=${grant.join(",")}`];
  });
}

/** The flags k3 itself runs with (`deno task k3`, the compiled binary, the bundle). */
export const K3_PERMISSIONS: string[] = permissionFlags("k3");
