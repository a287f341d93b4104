/**
 * Files a one-file JavaScript build carries inside itself. `deno task bundle` (cli/bundle.ts)
 * writes dist/k3.js whose first module calls `embed` with the kernel libraries (every ISA
 * build, base64) and the compute worker (bundled JavaScript); a checkout or a compiled
 * binary never calls it, so everything here is empty there.
 *
 * @module
 */

/** What a bundle embedded: library file name -> bytes, and the worker's source. */
export interface Embedded {
  /** Kernel libraries by file name (libk3.so, libk3-avx2.so, ...). */
  libraries: Map<string, Uint8Array>;
  /** The compute worker (engine/native/pool_worker.ts) bundled into one ES module. */
  workerSource?: string;
  /** The chat page's files (cli/web/) by file name. */
  web: Map<string, string>;
}

/** The embedded files of this process (empty unless running from a bundle). */
export const EMBEDDED: Embedded = { libraries: new Map(), web: new Map() };

/** Registers a bundle's files; `libraries` values are base64. Called once, first thing. */
export function embed(
  files: { libraries: Record<string, string>; workerSource: string; web?: Record<string, string> },
): void {
  for (const [name, text] of Object.entries(files.web ?? {})) EMBEDDED.web.set(name, text);
  for (const [name, b64] of Object.entries(files.libraries)) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    EMBEDDED.libraries.set(name, bytes);
  }
  EMBEDDED.workerSource = files.workerSource;
}

/** The URL to start the compute worker from: the embedded source (a blob: URL) in a bundle,
 * else `fallback` (the module next to pool.ts). */
export function workerUrl(fallback: URL): URL | string {
  if (EMBEDDED.workerSource === undefined) return fallback;
  return URL.createObjectURL(new Blob([EMBEDDED.workerSource], { type: "text/javascript" }));
}
