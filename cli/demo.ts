/**
 * `deno task demo` (`npm run demo`): the product's claim, shown on the bundled tiny model
 * (tests/fixtures/tiny-en: the tiny K3 shape, 13 layers, hidden 128, trained on the Brown
 * corpus by tools/train_tiny). It packs the trunk into a temporary directory, then
 * continues the committed reference prompt (a sentence start from the held-out text) twice:
 * fully resident, and streamed at a budget far below the model (a few layers of trunk, a
 * few experts of cache), printing the text as it is generated. Both must give the tokens
 * of the independent float64 reference (tests/oracle/reference.py, committed as
 * tests/fixtures/tiny-en/reference.json), and the prompt text must encode to the
 * reference's prompt ids; it prints both timings. The temporary directory is removed at
 * the end (also on Ctrl-C).
 *
 * @module
 */

import { cli } from "./commands.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const TINY = `${ROOT}/tests/fixtures/tiny-en`;
const rel = (p: string) => (p.startsWith(ROOT + "/") ? p.slice(ROOT.length + 1) : p);
const shown = (a: string) => (/[\s"]/.test(a) ? JSON.stringify(a) : rel(a));

/** The budgets of the streamed run: far below the tiny model's 13 layers and 96 experts. */
export const DEMO_BUDGET = ["--trunk-gb", "0.0005", "--cache-gb", "0.0002"];

async function step(args: string[], why: string): Promise<number> {
  console.error(
    `\ndemo: ${why}\ndemo: $ k3 ${args.map(shown).join(" ")}`,
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
      "demo: the bundled model (tests/fixtures/tiny-en) is a 2 M-parameter K3 trained on the Brown corpus: " +
        "it continues English text (it does not follow instructions). What it shows is that k3 computes " +
        "exactly, and as exactly with almost no memory.",
    );
    const ref = JSON.parse(await Deno.readTextFile(`${TINY}/reference.json`));
    const refIds: number[] = ref.generated_ids;
    const common = ["run", TINY, "--prompt", ref.prompt_text, "--gen", String(refIds.length)];
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
    const samePrompt = JSON.stringify(resident.prompt_ids) === JSON.stringify(ref.prompt_ids);
    const sameRef = agree(resident.generated_ids, refIds),
      sameRes = agree(streamed.generated_ids, resident.generated_ids);
    const timing = (r: Record<string, number>) =>
      `prefill ${r.prefill_seconds.toFixed(4)} s, decode ${r.decode_seconds_per_token.toFixed(4)} s/token`;
    console.error(
      [
        "",
        `demo: prompt: ${JSON.stringify(ref.prompt_text)} (${resident.prompt_ids.length} tokens, ` +
        `${samePrompt ? "the" : "NOT the"} reference's prompt ids)`,
        `demo: continuation: ${JSON.stringify(resident.generated_text)}`,
        `demo: float64 reference (tests/oracle, committed in tests/fixtures/tiny-en/reference.json): ${
          refIds.join(",")
        }`,
        `demo: resident run: ${sameRef}/${n} tokens equal the reference; ${timing(resident)}`,
        `demo: streamed run: ${sameRes}/${n} tokens equal the resident run; ${timing(streamed)}; ` +
        `read ${streamed.trunk_bytes_read} B of trunk and ${streamed.expert_bytes_read} B of experts, ` +
        `peak RSS ${(streamed.peak_rss_bytes / 1e6).toFixed(1)} MB`,
      ].join("\n"),
    );
    if (!samePrompt || sameRef !== n || sameRes !== n) {
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
