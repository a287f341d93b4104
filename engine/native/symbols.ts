/**
 * The one symbol table of libk3: every function of kernels/k3.h (`symbols`, the kernels)
 * and kernels/k3io.h (`ioSymbols`, file I/O), declared once. Whatever dlopens the library
 * derives its declarations from here: ffi.ts and io.ts open the two tables whole; a caller
 * that wants a few functions on Deno's blocking pool (several products or decodes at once,
 * a read probe) takes them with `nonblocking`, and the CPU probe (libpath.ts) one function
 * with `only`. A module of its own, importing nothing, so that libpath.ts (which ffi.ts
 * imports) can use it too.
 *
 * @module
 */

const P = "pointer" as const;
const I = "i32" as const;
const F = "f32" as const;
const V = "void" as const;

/** Symbol table of the kernels; must match kernels/k3.h. */
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
  k3_kda_steps: { parameters: [P, P, P, P, P, P, P, I, I, I, I, I], result: V },
  k3_mla_attend: { parameters: [P, P, P, P, P, P, I, I, I, I, I, I, F, I, I], result: V },
  k3_mla_attend_rows: { parameters: [P, P, P, P, P, P, I, I, I, I, I, I, I, F, I, I], result: V },
  k3_mla_absorb: { parameters: [P, I, P, P, I, I, I, I, I, I, I, I], result: V },
  k3_mla_expand: { parameters: [P, I, P, P, I, I, I, I, I, I], result: V },
  k3_router_topk: { parameters: [P, P, I, I, F, P, P], result: I },
  k3_attnres: { parameters: [P, I, I, P, P, F, P], result: V },
  k3_add: { parameters: [P, P, I], result: V },
  k3_axpy: { parameters: [P, F, P, I], result: V },
  k3_sigmoid_mul: { parameters: [P, P, I], result: V },
  k3_sigmoid: { parameters: [P, P, I], result: V },
  k3_argmax: { parameters: [P, I], result: I },
  k3_read_sum: { parameters: [P, "u64"], result: "u64" },
  k3_peak_loop: { parameters: [I, P], result: "u64" },
} as const;

/** Symbol table of kernels/k3io.h. */
export const ioSymbols = {
  k3io_open: { parameters: ["buffer", I], result: I },
  k3io_is_direct: { parameters: [I], result: I },
  k3io_close: { parameters: [I], result: I },
  k3io_size: { parameters: [I], result: "i64" },
  k3io_pread: { parameters: [I, P, "u64", "u64"], result: "i64", nonblocking: true },
  k3io_pwrite: { parameters: [I, P, "u64", "u64"], result: "i64", nonblocking: true },
  k3io_sync: { parameters: [I], result: I, nonblocking: true },
  k3io_truncate: { parameters: [I, "u64"], result: I },
  k3io_pread_hash: { parameters: [I, P, "u64", "u64", "u64", P], result: "i64", nonblocking: true },
  k3io_hash: { parameters: [P, "u64"], result: "u64" },
  k3io_kind: { parameters: ["buffer"], result: I },
  k3io_write: { parameters: [I, "buffer", "u64"], result: "i64" },
  k3io_hash_init: { parameters: [P], result: "void" },
  k3io_hash_update: { parameters: [P, P, "u64"], result: I },
  k3io_hash_digest: { parameters: [P], result: "u64" },
  k3io_read_small: { parameters: ["buffer", "buffer", "u64"], result: "i64" },
  k3io_split_encode: { parameters: [P, "u64", P, "u64", I], result: "i64" },
  k3io_split_decode: { parameters: [P, "u64", P, "u64"], result: "i64" },
  k3io_pread_piece: { parameters: [I, P, "u64", "u64", "u64", I, P], result: "i64", nonblocking: true },
} as const;

/** A symbol table: function name -> its FFI declaration. */
export type SymbolTable = Record<string, Deno.ForeignFunction>;

/** The functions `names` of `table` as declared there. */
export function only<T extends SymbolTable, N extends keyof T & string>(table: T, ...names: N[]): { [K in N]: T[K] } {
  return Object.fromEntries(names.map((n) => [n, table[n]])) as { [K in N]: T[K] };
}

/** The functions `names` of `table`, each called on Deno's blocking pool (it returns a
 * promise, so that several run at once on as many threads). */
export function nonblocking<T extends SymbolTable, N extends keyof T & string>(
  table: T,
  ...names: N[]
): { [K in N]: T[K] & { nonblocking: true } } {
  return Object.fromEntries(names.map((n) => [n, { ...table[n], nonblocking: true }])) as {
    [K in N]: T[K] & { nonblocking: true };
  };
}
