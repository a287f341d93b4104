/**
 * `deno task demo` (`npm run demo`): the product's claim, shown on the bundled tiny model
 * (tests/fixtures/tiny: 13 layers, hidden 128, random weights). It packs the trunk into a
 * temporary directory, then generates from the committed reference prompt twice: fully
 * resident, and streamed at a budget far below the model (a few layers of trunk, a few
 * experts of cache). Both must give the tokens of the independent float64 reference
 * (tests/oracle/reference.py, committed as tests/fixtures/tiny/reference.json); it prints
 * both timings. The temporary directory is removed at the end (also on Ctrl-C).
 *
 * @module
 */

import { cli } from "./commands.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const TINY = `${ROOT}/tests/fixtures/tiny`;
const rel = (p: string) => (p.startsWith(ROOT + "/") ? p.slice(ROOT.length + 1) : p);

/** The budgets of the streamed run: far below the tiny model's 13 layers and 104 experts. */
export const DEMO_BUDGET = ["--trunk-gb", "0.0005", "--cache-gb", "0.0002"];

async function step(args: string[], why: string): Promise<number> {
  console.error(
    `\ndemo: ${why}\ndemo: $ k3 ${args.map((a) => (/[\s"]/.test(a) ? JSON.stringify(a) : rel(a))).join(" ")}`,
  );
  return await cli(args);
}

/** Counts positions where `a` and `b` agree (and both exist). */
function agree(a: number[], b: number[]): number {
  return a.filter((x, i) => x === b[i]).length;
}

async function main(): Promise<number> {
  const tmp = await Deno.makeTempDir({ prefix: "k3-demo-" });
  const cleanup = () => {
    try {
      Deno.removeSync(tmp, { recursive: true });
    } catch { /* already gone */ }
  };
  const onSigint = () => {
    cleanup();
    Deno.exit(130);
  };
  Deno.addSignalListener("SIGINT", onSigint);
  try {
    console.error(
      "demo: the bundled model (tests/fixtures/tiny) has random weights, so its text is gibberish by design; " +
        "what it shows is that k3 computes exactly, and as exactly with almost no memory.",
    );
    const ref = JSON.parse(await Deno.readTextFile(`${TINY}/reference.json`));
    const refIds: number[] = ref.generated_ids;
    const common = ["run", TINY, "--ids", ref.prompt_ids.join(","), "--gen", String(refIds.length)];
    const trunk = `${tmp}/trunk`;
    let code = await step(["pack", TINY, trunk], "pack the trunk into one aligned file");
    if (code !== 0) return code;
    code = await step([...common, "--out", `${tmp}/resident.json`], "generate with everything in RAM");
    if (code !== 0) return code;
    code = await step(
      [...common, "--trunk", trunk, ...DEMO_BUDGET, "--out", `${tmp}/streamed.json`],
      "the same, streamed: a trunk budget of a few layers, an expert cache of a few experts",
    );
    if (code !== 0) return code;
    const resident = JSON.parse(await Deno.readTextFile(`${tmp}/resident.json`));
    const streamed = JSON.parse(await Deno.readTextFile(`${tmp}/streamed.json`));
    const n = refIds.length;
    const sameRef = agree(resident.generated_ids, refIds),
      sameRes = agree(streamed.generated_ids, resident.generated_ids);
    const timing = (r: Record<string, number>) =>
      `prefill ${r.prefill_seconds.toFixed(4)} s, decode ${r.decode_seconds_per_token.toFixed(4)} s/token`;
    console.error(
      [
        "",
        `demo: float64 reference (tests/oracle, committed in tests/fixtures/tiny/reference.json): ${refIds.join(",")}`,
        `demo: resident run: ${sameRef}/${n} tokens equal the reference; ${timing(resident)}`,
        `demo: streamed run: ${sameRes}/${n} tokens equal the resident run; ${timing(streamed)}; ` +
        `read ${streamed.trunk_bytes_read} B of trunk and ${streamed.expert_bytes_read} B of experts, ` +
        `peak RSS ${(streamed.peak_rss_bytes / 1e6).toFixed(1)} MB`,
      ].join("\n"),
    );
    if (sameRef !== n || sameRes !== n) {
      console.error("demo: FAILED: the tokens differ (please report this)");
      return 1;
    }
    console.error(
      `demo: done; removed ${tmp}.\n` +
        "Next, from this checkout: npm run -s k3 -- doctor   (with Deno installed: deno task k3 doctor),\n" +
        'then pack and run the real checkpoint: README, "The real checkpoint".',
    );
    return 0;
  } finally {
    Deno.removeSignalListener("SIGINT", onSigint);
    cleanup();
  }
}

if (import.meta.main) Deno.exit(await main());
