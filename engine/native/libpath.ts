/**
 * Finding the kernel library at start-up.
 *
 * Order:
 *  1. `K3_LIB` (an explicit path; used as is, never second-guessed);
 *  2. from a source checkout: `kernels/build/libk3.so` next to this file's `engine/`;
 *  3. in a binary built by `deno compile --include kernels/build/libk3.so` (the one-file
 *     `k3`): the library lives in the binary's embedded file system, where Deno's file APIs
 *     can read it but `dlopen` cannot open it. Its bytes are copied to a per-user cache
 *     directory (`$XDG_CACHE_HOME/k3`, else `~/.cache/k3`) as `lib-<sha256 prefix>.so`,
 *     written atomically (temporary sibling, then rename), reused while its content hash
 *     matches and re-extracted when it does not (a corrupt or truncated copy). When the
 *     binary carries per-ISA builds (libk3-avx512/avx2/scalar), the fastest one this CPU
 *     runs is chosen (a binary built on one x86 machine runs on another).
 *  4. in the one-file bundle dist/k3.js (`deno task bundle`): the same, from the libraries
 *     the bundle embeds as data (engine/native/embedded.ts) instead of the binary's file
 *     system: same choice of build, same cache, same atomic extraction.
 *
 * Everything here takes its inputs as parameters so each step is testable without a
 * compiled binary.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { K3Error } from "../errors.ts";
import { EMBEDDED } from "./embedded.ts";
import { only, symbols } from "./symbols.ts";

/** File extension of shared libraries on this OS. */
export const LIB_EXT = Deno.build.os === "darwin" ? "dylib" : Deno.build.os === "windows" ? "dll" : "so";

/** File name of the kernel library. */
export const LIB_NAME = `libk3.${LIB_EXT}`;

/** Hex digits of the content hash kept in the cached file's name. */
export const HASH_PREFIX = 16;

/** Where the library sits relative to this module: in a checkout, and embedded in a binary
 * (deno compile keeps the checkout's layout in its embedded file system). */
export function moduleLibraryPath(): string {
  return decodeURIComponent(new URL(`../../kernels/build/${LIB_NAME}`, import.meta.url).pathname);
}

/** True inside a binary produced by `deno compile`. */
export function isStandalone(): boolean {
  // Deno.build.standalone where the runtime has it; else the embedded file system's root.
  return (Deno.build as { standalone?: boolean }).standalone === true ||
    /\/deno-compile-[^/]+\//.test(import.meta.url);
}

/** Hex SHA-256 of `bytes`. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** The per-user cache directory for extracted libraries. */
export function cacheDir(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): string {
  const xdg = env("XDG_CACHE_HOME");
  if (xdg && xdg.startsWith("/")) return `${xdg}/k3`;
  const home = env("HOME") ?? env("USERPROFILE");
  if (!home) {
    throw new K3Error(
      "cannot find a cache directory for the kernel library: set XDG_CACHE_HOME or HOME (or K3_LIB)",
    );
  }
  return `${home}/.cache/k3`;
}

/** What `extractLibrary` did. */
export interface Extracted {
  /** Path of the extracted library. */
  path: string;
  /** "reused": the cached copy matched; "written": it was missing; "rewritten": it was corrupt. */
  action: "reused" | "written" | "rewritten";
}

function readIfExists(path: string): Uint8Array | undefined {
  try {
    return Deno.readFileSync(path);
  } catch {
    return undefined; // missing or unreadable: (re)write it, and report that if it fails
  }
}

/**
 * Puts `bytes` at `<dir>/lib-<sha256 prefix>.<ext>` unless an identical copy is already
 * there. The write is atomic, so a concurrent start (or a Worker) never sees half a file.
 */
export function extractLibrary(bytes: Uint8Array, dir: string): Extracted {
  const hash = sha256Hex(bytes);
  const path = `${dir}/lib-${hash.slice(0, HASH_PREFIX)}.${LIB_EXT}`;
  const existing = readIfExists(path);
  if (existing && existing.length === bytes.length && sha256Hex(existing) === hash) {
    return { path, action: "reused" };
  }
  try {
    Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tmp = `${path}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
    try {
      Deno.writeFileSync(tmp, bytes, { mode: 0o755 });
      Deno.renameSync(tmp, path);
    } catch (e) {
      try {
        Deno.removeSync(tmp);
      } catch { /* never created */ }
      throw e;
    }
  } catch (e) {
    throw new K3Error(
      `cannot extract the kernel library to ${dir}: ${(e as Error).message} (set XDG_CACHE_HOME or K3_LIB)`,
    );
  }
  return { path, action: existing ? "rewritten" : "written" };
}

/** Where the library was found. */
export interface Resolution {
  /** Path to dlopen. */
  path: string;
  /** Where it came from: K3_LIB, the checkout, a compiled binary, a bundle. */
  source: "env" | "checkout" | "embedded" | "bundled";
  /** For embedded: what happened in the cache. */
  action?: Extracted["action"];
  /** For embedded: which build was chosen. */
  file?: string;
}

/** Inputs of `resolveLibrary` (defaults: this process). */
export interface ResolveOptions {
  /** Environment lookup (default: Deno.env). */
  env?: (name: string) => string | undefined;
  /** The library's path relative to the modules (real file in a checkout, embedded file in
   * a compiled binary). */
  modulePath?: string;
  /** Running inside `deno compile`'s binary (default: detected). */
  standalone?: boolean;
  /** Override of the cache directory. */
  cacheDir?: string;
  /** CPU flags and architecture (default: this machine's). */
  cpuFlags?: Set<string>;
  /** CPU architecture (default: Deno.build.arch). */
  arch?: string;
  /** Libraries embedded in a bundle, by file name (default: engine/native/embedded.ts). */
  bundled?: Map<string, Uint8Array>;
}

/** Finds (and if needed extracts) the kernel library. Throws a K3Error when there is none. */
export function resolveLibrary(opts: ResolveOptions = {}): Resolution {
  const env = opts.env ?? ((n: string) => Deno.env.get(n));
  const override = env("K3_LIB");
  if (override) return { path: override, source: "env" };
  const bundled = opts.bundled ?? EMBEDDED.libraries;
  if (bundled.size > 0) {
    const scalar = bundled.get(SCALAR_FILE);
    const flags = opts.cpuFlags ??
      cpuFlags(() => scalar && extractLibrary(scalar, opts.cacheDir ?? cacheDir(env)).path);
    const file = chooseEmbedded((f) => bundled.has(f), flags, opts.arch ?? Deno.build.arch) ?? LIB_NAME;
    const bytes = bundled.get(file);
    if (!bytes) throw new K3Error(`this k3 bundle has no ${file}; rebuild it with \`deno task bundle\` or set K3_LIB`);
    const x = extractLibrary(bytes, opts.cacheDir ?? cacheDir(env));
    return { path: x.path, source: "bundled", action: x.action, file };
  }
  const modulePath = opts.modulePath ?? moduleLibraryPath();
  const standalone = opts.standalone ?? isStandalone();
  if (!standalone) {
    try {
      if (Deno.statSync(modulePath).isFile) return { path: modulePath, source: "checkout" };
    } catch { /* fall through to the error */ }
    throw new K3Error(
      `kernel library not found at ${modulePath}: build it with \`make -C kernels\` (or set K3_LIB)`,
    );
  }
  // A binary may carry several builds (deno task compile embeds the x86 variants): take the
  // fastest one this CPU can run, so a binary built on an AVX-512 machine still runs on an
  // AVX2 one. Every path gives the same bits, so the choice never changes a token.
  const dir = modulePath.slice(0, modulePath.lastIndexOf("/"));
  const embedded = (file: string) => {
    try {
      return Deno.statSync(`${dir}/${file}`).isFile;
    } catch {
      return false;
    }
  };
  const probe = () => {
    if (!embedded(SCALAR_FILE)) return undefined;
    return extractLibrary(Deno.readFileSync(`${dir}/${SCALAR_FILE}`), opts.cacheDir ?? cacheDir(env)).path;
  };
  const file = chooseEmbedded(embedded, opts.cpuFlags ?? cpuFlags(probe), opts.arch ?? Deno.build.arch) ??
    modulePath.slice(dir.length + 1);
  let bytes: Uint8Array;
  try {
    bytes = Deno.readFileSync(`${dir}/${file}`);
  } catch (e) {
    throw new K3Error(
      `this k3 binary has no embedded kernel library (${dir}/${file}: ${
        (e as Error).message
      }); rebuild it with \`deno task compile\` or set K3_LIB`,
    );
  }
  const x = extractLibrary(bytes, opts.cacheDir ?? cacheDir(env));
  return { path: x.path, source: "embedded", action: x.action, file };
}

/** The build every CPU of the architecture runs (also the feature probe). */
const SCALAR_FILE = `libk3-scalar.${LIB_EXT}`;

/** Per-ISA builds of `make -C kernels variants`, fastest first, with the CPU flags each needs. */
export const VARIANTS = [
  { file: `libk3-avx512.${LIB_EXT}`, needs: ["avx512f", "avx512bw", "avx512vl", "avx512dq"] },
  { file: `libk3-avx2.${LIB_EXT}`, needs: ["avx2"] },
  { file: `libk3-scalar.${LIB_EXT}`, needs: [] as string[] },
];

/**
 * The embedded build to use on x86-64: the first variant that is embedded and that the CPU
 * can run; undefined (use the native libk3) when there are none or on other architectures.
 */
export function chooseEmbedded(
  embedded: (file: string) => boolean,
  flags: Set<string>,
  arch: string,
): string | undefined {
  if (arch !== "x86_64") return undefined;
  return VARIANTS.find((v) => embedded(v.file) && v.needs.every((f) => flags.has(f)))?.file;
}

/** Feature names of k3_cpu_features' bits (kernels/k3.h), in bit order. */
export const CPU_FEATURE_BITS = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"];

/** The CPU features a kernel library reports (k3_cpu_features): any build can answer. */
export function probeCpuFlags(libPath: string): Set<string> {
  const lib = Deno.dlopen(libPath, only(symbols, "k3_cpu_features"));
  try {
    const bits = lib.symbols.k3_cpu_features();
    return new Set(CPU_FEATURE_BITS.filter((_, i) => bits & (1 << i)));
  } finally {
    lib.close();
  }
}

/**
 * The CPU feature flags: /proc/cpuinfo when readable (Deno allows it only with --allow-all),
 * else what the library at `probe` reports (k3_cpu_features), else none (selects scalar).
 */
export function cpuFlags(probe?: () => string | undefined): Set<string> {
  try {
    const t = Deno.readTextFileSync("/proc/cpuinfo");
    return new Set((t.match(/^(?:flags|Features)\s*:\s*(.+)$/m)?.[1] ?? "").split(/\s+/));
  } catch {
    try {
      const lib = probe?.();
      return lib ? probeCpuFlags(lib) : new Set();
    } catch {
      return new Set();
    }
  }
}
