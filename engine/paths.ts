/**
 * What is wrong with a path the user named, in words ("README.md is not a model directory:
 * it is a file"), instead of the OS text ("Not a directory (os error 20): readfile ...").
 *
 * Exit code decision (README, Exit codes): a path that is not the kind of thing its flag or
 * argument names (missing, a file where a directory is expected, a directory where a file
 * is, a directory without its marker file) is exit 2, like an unreadable config: nothing
 * ran, the command line must change. A file of the right kind whose content is damaged is
 * exit 1.
 *
 * @module
 */

import { EXIT, K3Error } from "./errors.ts";

function kindOf(path: string): "file" | "directory" | "missing" | "other" {
  try {
    const s = Deno.statSync(path);
    return s.isDirectory ? "directory" : s.isFile ? "file" : "other";
  } catch (e) {
    return e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotADirectory ? "missing" : "other";
  }
}

/** The problem with `dir` as `what` (e.g. "a model directory") marked by the file `marker`
 * inside it, or undefined when it is one. */
export function directoryProblem(dir: string, what: string, marker: string): string | undefined {
  switch (kindOf(dir)) {
    case "missing":
      return `${dir}: no such directory (expected ${what})`;
    case "file":
      return `${dir} is not ${what}: it is a file`;
    case "other":
      return undefined; // unreadable or special: let the read report it
  }
  const inner = kindOf(`${dir}/${marker}`);
  if (inner === "missing") return `${dir} is not ${what}: no ${marker}`;
  if (inner === "directory") return `${dir} is not ${what}: ${marker} is a directory`;
  return undefined;
}

/** Throws a usage error (exit 2) when `dir` is not `what` (see directoryProblem). */
export function expectDirectory(dir: string, what: string, marker: string): void {
  const p = directoryProblem(dir, what, marker);
  if (p) throw new K3Error(p, EXIT.usage);
}

/** Why reading the file `path` failed, in words: missing, a directory, under a file,
 * permission; else the OS message without its "readfile '...'" tail. */
export function readProblem(path: string, e: unknown): string {
  if (e instanceof Deno.errors.IsADirectory || kindOf(path) === "directory") {
    return `${path} is a directory, not a file`;
  }
  if (e instanceof Deno.errors.NotADirectory) {
    let p = path;
    while (p.includes("/") && kindOf(p) !== "file") p = p.slice(0, p.lastIndexOf("/"));
    return `${path}: ${p} is a file, not a directory`;
  }
  if (e instanceof Deno.errors.NotFound) return `${path}: no such file`;
  if (e instanceof Deno.errors.PermissionDenied) return `${path}: permission denied`;
  return `${path}: ${String((e as Error)?.message ?? e).replace(/ \(os error \d+\).*$/, "")}`;
}
