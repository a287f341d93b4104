/**
 * What a previous `k3 batch` output already holds: the ids of its result lines and the
 * settings each recorded, so a rerun skips what is done and refuses to mix settings that
 * change tokens. A torn last line (a kill mid-write) is cut away first.
 *
 * @module
 */

import { K3Error } from "../../engine/errors.ts";
import { readProblem } from "../../engine/paths.ts";
import { notRegular } from "../../engine/native/files.ts";
import { type ReportSettings, settingsDiff } from "../report.ts";
import { jsonlLines } from "./jobs.ts";

/** The longest result line the resume scan accepts (a longer one is not ours). */
const MAX_RESULT_LINE = 64 << 20;

/** The key of a result line (as a job's key), and the settings it recorded; undefined: not a result line. */
function resultKey(v: unknown): { key: string; settings?: ReportSettings | undefined } | undefined {
  if (!v || typeof v !== "object") return undefined;
  const o = v as Record<string, unknown>;
  if ((typeof o.id === "string" || typeof o.id === "number") && Array.isArray(o.generated_ids)) {
    return {
      key: JSON.stringify(o.id),
      settings: o.settings && typeof o.settings === "object" ? o.settings as ReportSettings : undefined,
    };
  }
  // An OpenAI Batch output line (its format has no settings to record).
  if (typeof o.custom_id === "string" && "response" in o && "error" in o) {
    return { key: `custom_id:${JSON.stringify(o.custom_id)}` };
  }
  return undefined;
}

/**
 * Ids already in an output file, and the settings each line records (undefined: a line
 * from before settings were recorded); a torn or unreadable last line is cut away. Only a
 * regular file is scanned (a device or FIFO is never read), and lines are bounded.
 */
export async function readDone(
  path: string,
): Promise<{ done: Set<string>; cutBytes: number; lines: number; settings: (ReportSettings | undefined)[] }> {
  const why = notRegular(path);
  if (why === "no such file") return { done: new Set(), cutBytes: 0, lines: 0, settings: [] };
  if (why !== undefined) throw new K3Error(`--output: cannot resume from ${path}: ${why}`);
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (e) {
    throw new K3Error(`--output: cannot read ${readProblem(path, e)}`);
  }
  const done = new Set<string>();
  const settings: (ReportSettings | undefined)[] = [];
  const dec = new TextDecoder("utf-8", { fatal: true });
  let keep = 0;
  for (const line of jsonlLines(bytes)) {
    if (line.end - line.start > MAX_RESULT_LINE) {
      throw new K3Error(
        `--output: ${path}:${line.number} is longer than any result line; refusing to append to this file`,
      );
    }
    let found: ReturnType<typeof resultKey>;
    if (line.terminated) {
      try {
        found = resultKey(JSON.parse(dec.decode(bytes.subarray(line.start, line.end))));
      } catch { /* not a result line */ }
    }
    if (found === undefined) {
      // Only the last line can be torn (we write whole lines); anything else is not ours.
      const last = !line.terminated || line.end === bytes.length - 1;
      if (!last) {
        throw new K3Error(`--output: ${path}:${line.number} is not a result line; refusing to append to this file`);
      }
      break;
    }
    done.add(found.key);
    if ("settings" in found) settings.push(found.settings);
    keep = line.end + 1;
  }
  const cutBytes = bytes.length - keep;
  if (cutBytes > 0) await Deno.truncate(path, keep);
  return { done, cutBytes, lines: done.size, settings };
}

/** Why the recorded settings of an output file do not fit this run (the token-deciding
 * ones: cli/report.ts tokenSettings), or undefined when a resume is sound. */
export function resumeMismatch(recorded: (ReportSettings | undefined)[], now: ReportSettings): string | undefined {
  if (recorded.length === 0) return undefined;
  if (recorded.some((s) => s === undefined)) return "lines without recorded settings, from an older k3";
  for (const s of recorded) {
    const diff = settingsDiff(s!, now);
    if (diff.length) return diff.join("; ");
  }
  return undefined;
}
