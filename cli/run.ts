/**
 * `k3 run <model_dir>`: generation from one prompt, the text streamed to stdout as tokens
 * arrive, with a report; sampling, stop strings, saved states and clean interruption.
 * Its phases: options (cli/run/options.ts), prepare (prepare.ts), run (generate.ts),
 * report (report.ts).
 *
 * @module
 */

import { EXIT } from "../engine/errors.ts";
import { EXIT_INTERRUPTED } from "./interrupt.ts";
import { withOpenModel } from "./model_session.ts";
import { runOptions } from "./run/options.ts";
import { prepareRun, runOpenOptions } from "./run/prepare.ts";
import { generate } from "./run/generate.ts";
import { reportRun } from "./run/report.ts";

/** Runs `k3 run`; returns the exit code (130 when interrupted), throws K3Error on failure. */
export async function main(args: string[]): Promise<number> {
  const options = runOptions(args);
  if (!options) return EXIT.ok;
  const run = await prepareRun(options);
  const t0 = performance.now();
  return await withOpenModel(run.config, runOpenOptions(options, run), async (opened, interrupts) => {
    const loadSeconds = (performance.now() - t0) / 1000;
    const outcome = await generate(opened, interrupts, options, run, loadSeconds);
    await reportRun(opened, options, run, outcome, loadSeconds);
    return outcome.result.finishReason === "interrupted" ? EXIT_INTERRUPTED : EXIT.ok;
  });
}
