/**
 * The one typed binding to the C kernel library (kernels/k3.h).
 *
 * Every kernel takes raw pointers. Pointers are taken once per buffer (see NativeBuffer in
 * memory.ts) because Deno.UnsafePointer.of costs ~0.5 us; sizes are i32 because a JS
 * number passed as i64 takes a ~90 ns slow path.
 *
 * @module
 */

import { K3Error } from "../errors.ts";
import { resolveLibrary } from "./libpath.ts";

const P = "pointer" as const;
const I = "i32" as const;
const F = "f32" as const;
const V = "void" as const;

/** Symbol table of libk3; must match kernels/k3.h. */
export const symbols = {
  k3_isa: { parameters: [], result: P },
  k3_cpu_features: { parameters: [], result: I },
  k3_alloc: { parameters: ["u64"], result: P },
  k3_free: { parameters: [P], result: V },
  k3_bf16_to_f32: { parameters: [P, P, I], result: V },
  k3_f16_to_f32: { parameters: [P, P, I], result: V },
  k3_matmul: { parameters: [P, I, P, P, I, I, I, I, I], result: V },
  k3_matmul_checked: { parameters: [P, I, P, P, I, I, I, I, I, P], result: V },
  k3_matrix_check: { parameters: [P, I, I, I, P], result: V },
  k3_matmul_mxfp4: { parameters: [P, P, P, P, I, I, I, I, I], result: V },
  k3_matmul_mxfp4_checked: { parameters: [P, P, P, P, I, I, I, I, I, P], result: V },
  k3_rmsnorm: { parameters: [P, P, P, I, I, F], result: V },
  k3_situ_glu: { parameters: [P, P, P, I, F, F], result: V },
  k3_short_conv: { parameters: [P, P, P, P, I], result: V },
  k3_l2norm: { parameters: [P, I, I, F], result: V },
  k3_kda_decay: { parameters: [P, P, P, P, I, I, F], result: V },
  k3_kda_step: { parameters: [P, P, P, P, P, P, P, I, I, I], result: V },
  k3_mla_attend: { parameters: [P, P, P, P, P, P, I, I, I, I, I, I, F, I, I], result: V },
  k3_mla_absorb: { parameters: [P, I, P, P, I, I, I, I, I, I, I], result: V },
  k3_mla_expand: { parameters: [P, I, P, P, I, I, I, I, I, I], result: V },
  k3_router_topk: { parameters: [P, P, I, I, F, P, P], result: I },
  k3_attnres: { parameters: [P, I, I, P, P, F, P], result: V },
  k3_add: { parameters: [P, P, I], result: V },
  k3_axpy: { parameters: [P, F, P, I], result: V },
  k3_sigmoid_mul: { parameters: [P, P, I], result: V },
  k3_sigmoid: { parameters: [P, P, I], result: V },
  k3_argmax: { parameters: [P, I], result: I },
  k3_read_sum: { parameters: [P, "u64"], result: "u64" },
} as const;

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
