/**
 * `deno task demo`: the main job end to end on the bundled tiny model (tests/fixtures/tiny,
 * 13 layers, hidden 128, with its tokenizer): pack its trunk into a temporary directory,
 * then generate from a text prompt at a small memory budget (a streamed trunk with room for
 * a few layers, an expert cache of a few experts), printing the report a real run prints.
 * The temporary directory is removed at the end (also on Ctrl-C).
 *
 * @module
 */

import { cli } from "../main.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const TINY = `${ROOT}/tests/fixtures/tiny`;
const rel = (p: string) => (p.startsWith(ROOT + "/") ? p.slice(ROOT.length + 1) : p);

/** The budgets of the demo run: far below the tiny model's 13 layers and 104 experts. */
export const DEMO_BUDGET = ["--trunk-gb", "0.0005", "--cache-gb", "0.0002"];
export const DEMO_PROMPT = "Once upon a time";

async function step(args: string[]): Promise<number> {
  console.error(
    `\ndemo: $ k3 ${args.map((a) => (/[\s"]/.test(a) ? JSON.stringify(a) : rel(a))).join(" ")}`,
  );
  return await cli(args);
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
    const trunk = `${tmp}/trunk`;
    const packCode = await step(["pack", TINY, trunk]);
    if (packCode !== 0) return packCode;
    const memory = ["--trunk", trunk, ...DEMO_BUDGET];
    const code = await step([
      "run",
      TINY,
      "--prompt",
      DEMO_PROMPT,
      "--gen",
      "16",
      ...memory,
      "--out",
      `${tmp}/report.json`,
    ]);
    if (code !== 0) return code;
    const report = JSON.parse(await Deno.readTextFile(`${tmp}/report.json`));
    console.error(
      `\ndemo: --out report: ${report.generated_ids.length} tokens, ${
        Number(report.seconds_per_token).toFixed(4)
      } s/token, ` +
        `peak RSS ${
          (report.peak_rss_bytes / 1e6).toFixed(1)
        } MB, trunk read ${report.trunk_bytes_read} B, experts read ${report.expert_bytes_read} B`,
    );
    console.error(
      `demo: done; removed ${tmp}. Next: k3 doctor, then k3 pack / k3 run on the real checkpoint (README).`,
    );
    return 0;
  } finally {
    Deno.removeSignalListener("SIGINT", onSigint);
    cleanup();
  }
}

if (import.meta.main) Deno.exit(await main());
