/**
 * The memory plan: a memory budget (the flags, a preset: model/presets.ts) turned into
 * pinned trunk layers, a read-ahead ring and expert-cache slots. More memory buys speed,
 * never a different token: every budget runs the same kernels in the same order.
 *
 * The plan (all bytes, printed before anything big is allocated: plan_text.ts), one module
 * per term:
 *
 *   total = trunk + experts + embed/head + finals + state + drafts + scratch + state cache
 *   trunk       pinned layers + ring (plan_trunk.ts)
 *   experts     cache slots x slot bytes, or every expert resident (plan_experts.ts)
 *   embed/head  both matrices resident, or one row buffer + two lm_head chunks (plan_embed_head.ts)
 *   finals      the final vectors
 *   state       KDA state + KV per position x positions, per sequence (plan_state.ts)
 *   drafts      a speculation record per sequence, when sequences may draft (plan_state.ts)
 *   scratch     the forward pass's buffers for a prefill segment (model/scratch.ts, sized by the
 *               caller; the segment by the memory with `--chunk auto`: plan_segment.ts)
 *   state cache (serve, batch) kept conversation states, by default what the plan leaves
 *               (plan_state.ts)
 *
 * The trunk and cache budgets come from the flags or, with `--preset auto`, from the
 * available memory (plan_auto.ts). The run is refused (exit 1) when total + FIXED_OVERHEAD
 * exceeds MemAvailable.
 *
 * With measured rates (`PlanInput.rates`) the plan predicts decode tokens/s
 * (plan_predict.ts, weights/throughput.ts) and prints it; `--preset auto` then spends what
 * is left after the fixed parts by the best prediction instead of trunk first, and
 * `fitSequences` with `auto` takes the number of sequences with the best prediction instead
 * of the most that fit. `fitContext` finds the most positions a sequence the plan holds: a
 * context asked for and too long is refused naming it; `--context auto` takes it.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { EXIT, K3Error, usageError } from "../errors.ts";
import { bytesText } from "../native/available.ts";
import { passRows, planScratchRows, scratchBytes } from "../model/scratch.ts";
import { stateBytes } from "../model/state.ts";
import { alignUp, FIXED_OVERHEAD_BYTES, type MemoryOptions, type PlanInput, wantsStreaming } from "./plan_input.ts";
import { planBudgets } from "./plan_auto.ts";
import { type EmbedHeadPlan, planEmbedHead } from "./plan_embed_head.ts";
import { expertBytesOf, type ExpertsPlan, planExperts } from "./plan_experts.ts";
import { type PlanPrediction, planPrediction } from "./plan_predict.ts";
import {
  autoSegment,
  type ChunkRequest,
  largestFitting,
  predictPrefill,
  type PrefillPrediction,
  weighSegments,
} from "./plan_segment.ts";
import {
  type DraftsPlan,
  planDrafts,
  planState,
  planStateCache,
  type StateCachePlan,
  type StatePlan,
} from "./plan_state.ts";
import { estimatedLayerBytes, planTrunk, trunkBytes, type TrunkPlan } from "./plan_trunk.ts";

/** The memory plan. Every size in bytes. */
export interface MemoryPlan {
  /** Everything in RAM, or a trunk streamed from disk. */
  mode: "resident" | "streamed";
  /** The preset named, if any. */
  preset: string | null;
  /** Trunk layers: pinned, and the read-ahead ring. */
  trunk: TrunkPlan;
  /** The routed-expert cache. */
  experts: ExpertsPlan;
  /** Embedding and lm_head: streamed or resident, and their bytes. */
  embedHead: EmbedHeadPlan;
  /** Bytes of the final vectors. */
  finalsBytes: number;
  /** Sequence state: fixed bytes, MLA cache per position, positions, sequences. */
  state: StatePlan;
  /** Bytes of scratch buffers. */
  scratchBytes: number;
  /** Of those, the bytes each more row of a pass adds (a segment row: scratch.ts). */
  scratchRowBytes: number;
  /** Speculation records: one per sequence when sequences may draft (null: they do not). */
  speculation: DraftsPlan | null;
  /** Predicted decode tokens/s with every sequence decoding (null: no rates given). */
  prediction: PlanPrediction | null;
  /** The conversation state cache's RAM budget (null: no cache planned). */
  stateCache: StateCachePlan | null;
  /** The prefill segment: prompt tokens one pass runs. A pass whose experts exceed the
   * cache runs them in waves. */
  chunk: number;
  /** The segment was chosen by the plan (`--chunk auto`). */
  chunkAuto: boolean;
  /** What a prompt of `prefill.tokens` is predicted to read and cost in these segments. */
  prefill: PrefillPrediction;
  /** Rows one forward pass holds: a prefill chunk plus one decode token of each other sequence. */
  passRows: number;
  /** Bytes of the whole plan. */
  totalBytes: number;
  /** Bytes beyond the plan (runtime, code). */
  overheadBytes: number;
  /** Available memory checked against (null: not checked). */
  availableBytes: number | null;
  /** Where availableBytes comes from ("MemAvailable", a cgroup limit, the override). */
  availableSource: string;
  /** Notes printed with the plan. */
  notes: string[];
}

/** Plan inputs for a model known only by its config (BF16 matrices). */
export function estimatedInput(
  cfg: K3Config,
  mem: MemoryOptions,
  capacity: number,
  chunk: ChunkRequest = 16,
): PlanInput {
  const VD = cfg.vocabSize * cfg.hiddenSize;
  return {
    cfg,
    mem,
    capacity,
    chunk,
    packed: true,
    layerBytes: Array.from({ length: cfg.numLayers }, (_, L) => estimatedLayerBytes(cfg, L)),
    embedBytes: alignUp(VD * 2),
    headBytes: alignUp(VD * 2),
    finalsBytes: alignUp(3 * cfg.hiddenSize * 4),
    expertBytes: expertBytesOf(cfg),
    stateBytes: stateBytes(cfg),
    scratchFor: (rows, sequences) => scratchBytes(cfg, planScratchRows(rows, sequences, capacity)),
  };
}

/**
 * Makes the plan; throws K3Error (exit 1) when it cannot be met. Pure: everything it weighs
 * is in `input`. With `chunk: "auto"` the segment is the largest that fits the available
 * memory, up to the whole prompt, decided before the pins and the cache share the rest,
 * unless a few more, smaller segments predict a shorter prefill (plan_segment.ts).
 */
export function makePlan(input: PlanInput): MemoryPlan {
  if (input.chunk !== "auto") return planWithSegment(input, input.chunk, false);
  const tokens = prefillTokens(input);
  const fits = input.available === undefined ? undefined : (rows: number) => {
    try {
      checkFits(planWithSegment(input, rows, true));
      return true;
    } catch (e) {
      if (e instanceof K3Error) return false;
      throw e;
    }
  };
  const fewest = autoSegment(tokens, fits);
  if (!fits) return planWithSegment(input, fewest.rows, true);
  // Weighed against the pins fewer rows leave room for, by the predicted prefill (seconds
  // at the measured rates, else bytes read).
  const plans = new Map<number, MemoryPlan>();
  const planOf = (rows: number) => plans.get(rows) ?? plans.set(rows, planWithSegment(input, rows, true)).get(rows)!;
  const cost = (rows: number) => planOf(rows).prefill.seconds ?? planOf(rows).prefill.readBytes;
  return planOf(weighSegments(tokens, fewest, cost).rows);
}

/** The prompt tokens a plan's prefill is sized and predicted for. */
function prefillTokens(input: PlanInput): number {
  return Math.max(1, Math.min(input.prefillTokens ?? input.capacity, input.capacity));
}

/** The plan with prefill segments of `chunk` tokens. */
function planWithSegment(input: PlanInput, chunk: number, chunkAuto: boolean): MemoryPlan {
  const notes: string[] = [];
  const streaming = wantsStreaming(input.mem);
  const sequences = Math.max(1, input.sequences ?? 1);
  const rows = passRows(chunk, sequences);
  const scratch = input.scratchFor(rows, sequences);
  const state = planState(input, sequences);
  const drafts = planDrafts(input, sequences, rows);
  const budgets = planBudgets(input, streaming, sequences, {
    stateBytes: state.bytes,
    draftBytes: drafts?.bytes ?? 0,
    scratchBytes: scratch,
  }, notes);
  const trunk = planTrunk(input, streaming, budgets.trunk, notes);
  const experts = planExperts(input, streaming, budgets.cache, notes);
  const embedHead = planEmbedHead(input, budgets.streamEmbed);
  const planned = trunk.bytes + experts.bytes + embedHead.bytes + input.finalsBytes + state.bytes +
    (drafts?.bytes ?? 0) + scratch;
  const stateCache = planStateCache(input, planned);
  const streamed = streaming
    ? { pinned: trunk.pinned, ringBytes: trunk.ringBytes, slots: experts.slots, headStreamed: embedHead.streamed }
    : null;
  return {
    mode: streaming ? "streamed" : "resident",
    preset: input.mem.preset ?? null,
    trunk,
    experts,
    embedHead,
    finalsBytes: input.finalsBytes,
    state,
    scratchBytes: scratch,
    scratchRowBytes: input.scratchFor(rows + 1, sequences) - scratch,
    speculation: drafts,
    prediction: planPrediction(input, sequences, streamed, experts.total),
    stateCache,
    chunk,
    chunkAuto,
    prefill: predictPrefill(
      {
        streamedBytes: streaming
          ? (input.layerStreamBytes ?? input.layerBytes).reduce((a, b, L) => a + (trunk.pinned.includes(L) ? 0 : b), 0)
          : 0,
        trunkBytes: trunkBytes(input.layerBytes),
        moeLayers: Math.max(0, input.cfg.numLayers - input.cfg.firstKDense),
        experts: input.cfg.moe.numExperts,
        topK: input.cfg.moe.topK,
        expertBytes: input.expertBytes,
        expertsResident: experts.resident,
      },
      prefillTokens(input),
      chunk,
      input.rates,
    ),
    passRows: rows,
    totalBytes: planned + (stateCache?.bytes ?? 0),
    overheadBytes: FIXED_OVERHEAD_BYTES,
    availableBytes: input.available ?? null,
    availableSource: input.availableSource ?? "MemAvailable",
    notes,
  };
}

/**
 * The plan for `want` sequences; with `auto`, for the number up to `want` whose plan
 * predicts the most tokens/s (plans without a prediction: the most that fit; ties: more
 * sequences). When `want` (explicit) does not fit but fewer would, that is a usage error
 * naming the largest that fits; when not even one fits, the plan's own refusal stands.
 */
export function fitSequences(planFor: (n: number) => MemoryPlan, want: number, auto: boolean): MemoryPlan {
  let firstError: unknown;
  let best: MemoryPlan | undefined;
  const rate = (p: MemoryPlan) => p.prediction?.tokensPerSecond ?? 0;
  for (let n = want; n >= 1; n--) {
    try {
      const plan = planFor(n);
      if (n === want && !auto) return plan;
      if (auto) {
        if (!best || rate(plan) > rate(best) * (1 + 1e-9)) best = plan;
        if (!plan.prediction) return best;
        continue;
      }
      throw usageError(
        `--parallel ${want} does not fit the memory plan (${
          (firstError as Error).message
        }); the largest that fits is ${n}`,
      );
    } catch (e) {
      if (e instanceof K3Error && e.exitCode === EXIT.usage && n < want) throw e;
      firstError ??= e;
    }
  }
  if (best) return best;
  throw firstError;
}

/**
 * The plan for a context of `want` positions a sequence (`planFor` makes and checks one);
 * with `auto`, for the most positions up to `want` whose plan fits. When an explicit `want`
 * does not fit the memory but fewer positions would, that is a usage error (exit 2):
 * `refusal` is given the most that fit and says which flag to change. When not even one
 * position fits, the plan's own refusal (exit 1) stands.
 */
export function fitContext(
  planFor: (positions: number) => MemoryPlan,
  want: number,
  auto: boolean,
  refusal: (most: number) => string,
): MemoryPlan {
  let refused: K3Error;
  try {
    return planFor(want);
  } catch (e) {
    // Only the memory's refusal: a usage error stays what it is.
    if (!(e instanceof K3Error) || e.exitCode === EXIT.usage) throw e;
    refused = e;
  }
  const fits = (positions: number) => {
    try {
      planFor(positions);
      return true;
    } catch (e) {
      if (e instanceof K3Error && e.exitCode !== EXIT.usage) return false;
      throw e;
    }
  };
  const most = want > 1 ? largestFitting(1, want - 1, fits) : undefined;
  if (most === undefined) throw refused;
  if (auto) return planFor(most);
  throw usageError(refusal(most));
}

/** Throws K3Error (exit 1) when the plan does not fit in what is available. */
export function checkFits(plan: MemoryPlan): void {
  if (plan.availableBytes === null) return;
  const need = plan.totalBytes + plan.overheadBytes;
  if (need > plan.availableBytes) {
    throw new K3Error(
      `memory plan needs ${bytesText(need)} (${bytesText(plan.totalBytes)} + ${
        bytesText(plan.overheadBytes)
      } runtime) but only ${
        bytesText(plan.availableBytes)
      } is available (${plan.availableSource}); choose a smaller --preset, --trunk-gb or --cache-gb${
        plan.trunk.packed ? "" : ", or stream the trunk with --trunk"
      }`,
    );
  }
}
