/**
 * A chat task run in-process on an opened model with its grammar, as `k3 serve` runs it:
 * the unit tests of forced calls use it to get a reply's tokens without a server.
 *
 * @module
 */

import type { K3Model } from "../engine/model/model.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { makeSampler } from "../engine/generate/sampling.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import type { Task } from "../cli/request.ts";
import { taskFilter } from "../cli/structured.ts";

/** The tokens `model` generates for task `t`: its prompt, limits, sampling and grammar. */
export async function taskTokens(model: K3Model, tok: Tokenizer, t: Task): Promise<number[]> {
  const r = await new Scheduler(model).submit({
    prompt: t.promptIds,
    maxTokens: t.maxTokens,
    stopIds: t.stopIds,
    choose: makeSampler(t.sampling),
    grammar: taskFilter(t, tok, model.cfg.vocabSize, t.stopIds),
  });
  return r.tokens;
}
