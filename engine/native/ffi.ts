/**
 * The one typed binding to the C kernel library (kernels/k3.h; its functions are declared
 * once, in symbols.ts).
 *
 * Every kernel takes raw pointers. Pointers are taken once per buffer (see NativeBuffer in
 * memory.ts) because Deno.UnsafePointer.of costs ~0.5 us; sizes are i32 because a JS
 * number passed as i64 takes a ~90 ns slow path.
 *
 * @module
 */

import { K3Error } from "../errors.ts";
import { resolveLibrary } from "./libpath.ts";
import { symbols } from "./symbols.ts";

/** The loaded kernel library's functions. */
export type Kernels = Deno.DynamicLibrary<typeof symbols>["symbols"];

/** Weight element type codes of k3_matmul. */
export const WTYPE = { f32: 0, bf16: 1, bf16Split: 2 } as const;

/**
 * The library to load when no path is given (engine/libpath.ts): K3_LIB, else the
 * checkout's kernels/build, else the copy embedded in a compiled binary, extracted to the
 * cache dir. Anything that dlopens libk3 for its own symbols (engine/native/io.ts) uses this.
 */
export function defaultLibraryPath(): string {
  return resolveLibrary().path;
}

let loaded: { path: string; lib: Deno.DynamicLibrary<typeof symbols> } | undefined;

/**
 * Opens the kernel library once per isolate (main thread and each Worker open their own
 * handle to the same shared object, so native pointers are valid in all of them).
 * Without an explicit path it is found by engine/libpath.ts: K3_LIB, else the checkout's
 * kernels/build, else the copy embedded in a compiled binary (extracted to a cache dir).
 */
export function kernels(path?: string): Kernels {
  if (loaded && (path === undefined || loaded.path === path)) return loaded.lib.symbols;
  if (loaded) throw new Error(`kernel library already loaded from ${loaded.path}`);
  const want = path ?? defaultLibraryPath();
  let lib;
  try {
    lib = Deno.dlopen(want, symbols);
  } catch (e) {
    throw new K3Error(
      `cannot load kernel library ${want}: ${
        (e as Error).message.split("\n")[0]
      } (build it with: make -C kernels, or set K3_LIB)`,
    );
  }
  loaded = { path: want, lib };
  return lib.symbols;
}

/** Path of the library this isolate loaded (workers load the same one). */
export function libraryPath(): string {
  if (!loaded) throw new Error("kernel library not loaded yet");
  return loaded.path;
}

/** Opens a kernel library at an explicit path without making it the default (for tests
 * that compare two builds, e.g. scalar against SIMD). */
export function openKernels(path: string): Deno.DynamicLibrary<typeof symbols> {
  return Deno.dlopen(path, symbols);
}

/** Name of the SIMD path the library was built with. */
export function isaName(k: Kernels): string {
  const p = k.k3_isa();
  return p ? new Deno.UnsafePointerView(p).getCString() : "unknown";
}
