/**
 * The memory plan as text: the lines printed on stderr before anything big is allocated
 * (one per term of the plan's equation, then the total, the prediction and the notes).
 *
 * @module
 */

import { bytesText } from "../native/available.ts";
import type { MemoryPlan } from "./plan.ts";
import { GB } from "./plan_input.ts";
import type { PlanPrediction } from "./plan_predict.ts";
import type { PrefillPrediction } from "./plan_segment.ts";
import { STATE_CACHE_DEFAULT_CAP } from "./plan_state.ts";

/** The plan as lines for stderr. */
export function formatPlan(p: MemoryPlan): string[] {
  const t = p.trunk, e = p.experts;
  const lines = [
    `memory plan (${p.mode}${p.preset ? `, preset ${p.preset}` : ""}; GB = 1e9 bytes):`,
  ];
  const row = (name: string, bytes: number, what: string) =>
    lines.push(`  ${name.padEnd(11)}${bytesText(bytes).padStart(10)}  ${what}`);
  row(
    "trunk",
    t.bytes,
    t.ringBytes === 0
      ? `all ${t.layers} layers resident${t.packed ? " (pinned from the packed trunk)" : ""}`
      : `${t.pinned.length} of ${t.layers} layers pinned (${bytesText(t.pinnedBytes)}) + ring ${
        bytesText(t.ringBytes)
      } (${
        t.ringDepth[0] === t.ringDepth[1] ? t.ringDepth[0] : `${t.ringDepth[0]}-${t.ringDepth[1]}`
      } layers ahead) of ${bytesText(t.totalBytes)}`,
  );
  row(
    "experts",
    e.bytes,
    e.resident
      ? `all ${e.total} routed experts resident`
      : `${e.slots} of ${e.total} slots x ${bytesText(e.slotBytes)} (top-k ${e.topK}, at least ${e.topK + 1})`,
  );
  row(
    "embed+head",
    p.embedHead.bytes,
    p.embedHead.streamed ? "streamed: one embedding row + two lm_head chunks" : "embedding and lm_head resident",
  );
  row("finals", p.finalsBytes, "final norm and AttnRes vectors");
  row(
    "state",
    p.state.bytes,
    `${p.state.sequences > 1 ? `${p.state.sequences} sequences x (` : ""}KDA ${bytesText(p.state.fixedBytes)} + KV ${
      bytesText(p.state.kvPerPosition)
    }/position x ${p.state.positions} positions${p.state.sequences > 1 ? ")" : ""}`,
  );
  row(
    "scratch",
    p.scratchBytes,
    `forward buffers for ${p.passRows} rows a pass (a ${p.chunk}-token segment${p.chunkAuto ? ", --chunk auto" : ""}${
      p.passRows > p.chunk ? ` + ${p.passRows - p.chunk} decode tokens` : ""
    }; ${bytesText(p.scratchRowBytes)} a row)`,
  );
  if (p.speculation) {
    const d = p.speculation;
    row(
      "drafts",
      d.bytes,
      `${d.sequences > 1 ? `${d.sequences} sequences x ` : ""}${
        bytesText(d.perSequence)
      } speculation record (KDA states before a drafted pass + ${d.rows} rows' inputs; --draft off: none)`,
    );
  }
  if (p.stateCache) {
    const c = p.stateCache;
    row(
      "state cache",
      c.bytes,
      c.bytes === 0
        ? "off (--state-cache-gb 0)"
        : `a ceiling, filled as conversations are kept (not allocated up front): kept conversation states: KDA ${
          bytesText(c.fixedBytes)
        } + KV ${bytesText(c.perPosition)}/position each (${
          c.source === "flag"
            ? "--state-cache-gb"
            : `default: what the plan leaves less 10%, at most ${bytesText(STATE_CACHE_DEFAULT_CAP)}`
        })`,
    );
  }
  // The state cache is a ceiling: what is allocated at the start is the rest.
  const ceiling = p.stateCache?.bytes ?? 0;
  row(
    ceiling > 0 ? "allocated" : "total",
    p.totalBytes - ceiling,
    `+ ${bytesText(p.overheadBytes)} fixed runtime overhead${
      ceiling > 0 ? `; up to ${bytesText(p.totalBytes)} with the state cache full` : ""
    }${p.availableBytes !== null ? `; ${bytesText(p.availableBytes)} available` : ""}`,
  );
  if (p.prediction) lines.push(`  ${predictionText(p.prediction)}`);
  if (p.mode === "streamed") lines.push(`  ${prefillText(p.prefill)}`);
  for (const n of p.notes) lines.push(`  note: ${n}`);
  return lines;
}

/** What a prompt's prefill reads (and, with rates, costs) as one line. */
export function prefillText(p: PrefillPrediction): string {
  const cost = p.seconds === null
    ? ""
    : `: ${durationText(p.seconds)} = max(read ${durationText(p.ioSeconds!)}, compute ${
      durationText(p.computeSeconds!)
    }) predicted`;
  return `prefill: a ${p.tokens}-token prompt in ${p.segments} ${
    p.segments === 1 ? "segment" : "segments"
  } of ${p.rows} reads ${bytesText(p.readBytes)}${cost}`;
}

/** Seconds as "12.3 s", "4.5 min" or "1.2 h". */
function durationText(s: number): string {
  if (s < 120) return `${s.toPrecision(3)} s`;
  if (s < 7200) return `${(s / 60).toPrecision(3)} min`;
  return `${(s / 3600).toPrecision(3)} h`;
}

/** The plan's prediction as one line. */
export function predictionText(p: PlanPrediction): string {
  const gb = (n: number) => (n / GB).toFixed(2);
  const tps = p.tokensPerSecond >= 100 ? p.tokensPerSecond.toFixed(0) : p.tokensPerSecond.toPrecision(3);
  const over = p.passSeconds - Math.max(p.ioSeconds, p.computeSeconds);
  const serial = over >= 0.0005 ? ` + ${over.toFixed(3)} s the reads and the compute cannot overlap` : "";
  return `predicted: ${tps} tokens/s with ${p.sequences} ${
    p.sequences === 1 ? "sequence" : "sequences"
  } decoding (a pass: ${p.passSeconds.toFixed(3)} s = max(read ${gb(p.readBytes)} GB${
    Number.isFinite(p.diskBytesPerSecond) ? ` at ${gb(p.diskBytesPerSecond)} GB/s` : ""
  } = ${p.ioSeconds.toFixed(3)} s, compute ${p.computeSeconds.toFixed(3)} s)${serial})`;
}
