/**
 * The pages whose examples the tests run, in one list: tests/e2e/readme_commands_test.ts runs
 * every shell line of each (for its exit code), tests/e2e/readme_examples_test.ts checks the
 * curl, TypeScript and console examples of each against what k3 returns. A page that gains
 * shell examples must be added here or to {@link NOT_RUN} with its reason: a test fails on a
 * page with shell blocks in neither, so no page's examples go unrun unnoticed.
 *
 * @module
 */

import { ROOT } from "./helpers.ts";

/** Pages whose examples are run, in the order a reader meets them (paths from the repository root). */
export const EXAMPLE_PAGES = ["README.md", "docs/tools.md"];

/** Pages with shell blocks that are not run, and why. */
export const NOT_RUN: Record<string, string> = {
  "docs/commands.md":
    "a reference of every flag: its lines name files and servers of the reader's (prompts.jsonl, talk.jsonl, vLLM, SGLang)",
};

/** A page's text, read from the repository. */
export function readPage(page: string): string {
  return Deno.readTextFileSync(`${ROOT}/${page}`);
}

/** README.md and every docs/*.md that holds a shell block (```sh, ```bash or ```shell). */
export function pagesWithShellBlocks(): string[] {
  const docs = [...Deno.readDirSync(`${ROOT}/docs`)].filter((e) => e.isFile && e.name.endsWith(".md"))
    .map((e) => `docs/${e.name}`);
  return ["README.md", ...docs.sort()].filter((p) => /^```(sh|bash|shell)\s*$/m.test(readPage(p)));
}
