/**
 * The one way a command holds a model: open it within the memory plan, install the
 * interrupt handling, run, and always remove the handling and close the model (run,
 * chat, batch and serve).
 *
 * @module
 */

import { type ModelConfig, type OpenedModel, openModel, type OpenOptions } from "../engine/open.ts";
import { engineEnvironment } from "./environment.ts";
import { Interrupts } from "./interrupt.ts";

/** When the signals are taken over, and what a second one does. */
export interface SessionOptions {
  /** Take SIGINT/SIGTERM before the model opens (serve: a signal while loading stops it
   * once loaded) instead of after (a signal while loading ends the process). */
  listenWhileOpening?: boolean;
  /** A second signal exits at once with 130 (default) or is ignored (serve's grace). */
  exitOnSecond?: boolean;
  /** false: leave SIGINT/SIGTERM to end the process (batch: every finished result is
   * already fsync'ed, and a rerun resumes). */
  signals?: boolean;
}

/**
 * Opens the model of `config` with `options` (over the environment's engine switches), calls `use` with it and the interrupts
 * (their signal aborts on SIGINT/SIGTERM; never with `signals: false`), and closes
 * both however `use` ends.
 */
export async function withOpenModel<T>(
  config: ModelConfig,
  options: OpenOptions,
  use: (opened: OpenedModel, interrupts: Interrupts) => Promise<T>,
  session: SessionOptions = {},
): Promise<T> {
  const take = () => new Interrupts({ exitOnSecond: session.exitOnSecond, listen: session.signals });
  let interrupts = session.listenWhileOpening ? take() : undefined;
  let opened: OpenedModel;
  try {
    // The environment's switches first: a command's own options win.
    opened = await openModel(config, { ...engineEnvironment(), ...options });
  } catch (e) {
    interrupts?.dispose();
    throw e;
  }
  try {
    interrupts ??= take();
    return await use(opened, interrupts);
  } finally {
    interrupts?.dispose();
    await opened.close();
  }
}
