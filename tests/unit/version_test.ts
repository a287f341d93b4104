/**
 * k3's version is written in one place (cli/version.ts), and CHANGELOG.md's newest release
 * is that version: a release bumps both together or the suite fails.
 */

import assert from "node:assert/strict";
import { VERSION } from "../../cli/version.ts";
import { ROOT } from "../helpers.ts";

Deno.test("CHANGELOG.md: the newest release heading is cli/version.ts's VERSION", async () => {
  const changelog = await Deno.readTextFile(`${ROOT}/CHANGELOG.md`);
  // Release headings are `## X.Y.Z - YYYY-MM-DD`; an `## Unreleased` section may sit above them.
  const releases = [...changelog.matchAll(/^## (\d+\.\d+\.\d+) - \d{4}-\d{2}-\d{2}$/gm)].map((m) => m[1]);
  assert.ok(releases.length > 0, "CHANGELOG.md has a release heading");
  assert.equal(releases[0], VERSION);
  assert.match(VERSION, /^\d+\.\d+\.\d+$/);
});

Deno.test("version: written only in cli/version.ts (deno.json and package.json carry none)", async () => {
  for (const file of ["deno.json", "package.json"]) {
    const json = JSON.parse(await Deno.readTextFile(`${ROOT}/${file}`));
    assert.equal(json.version, undefined, `${file} has no version of its own`);
  }
});
