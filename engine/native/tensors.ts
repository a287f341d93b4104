/**
 * Tensor views in native memory (dense matrices, vectors, MXFP4 experts) and their checks:
 * the matrix check (kernels/k3.h, contract 5) of a tensor's bytes as a word, a streamed
 * matrix's check settled by the first product that uses it, an expert's digest settled by
 * its first run, and the checks of a region fed in order (k3 pack, `k3 pack --verify`).
 *
 * Why a second checksum beside the trunk pieces' k3w64: a streamed layer is read at the
 * floor budget on every token, and hashing each piece after it lands is a second pass over
 * bytes the disk just wrote to memory, which on this class of machine slows the reads
 * themselves (5-8% of a floor token, bench/verify.ts). The matrix check is computed by
 * k3_matmul_checked from the weight blocks the product loads anyway, so a streamed matrix is
 * verified by the product that uses it, before its layer's output goes on; vectors (a few KB
 * per layer) are checked when the layer is handed out.
 *
 * The leaf under the model and the weights: it knows bytes, rows and words, not tensor
 * names or files.
 *
 * @module
 */

import { K3Error } from "../errors.ts";
import { type Kernels, WTYPE } from "./ffi.ts";
import { NativeBuffer } from "./memory.ts";
import { hex64, io } from "./io.ts";

/** How a tensor is kept in memory. */
export type Keep = "matrix" | "vector" | "u8";

/** A dense matrix [rows][cols] in native memory, BF16 or F32. */
export interface Matrix {
  /** Native pointer to the weights. */
  ptr: NonNullable<Deno.PointerValue>;
  /** Element type (WTYPE). */
  wtype: number;
  /** Output rows. */
  rows: number;
  /** Input columns. */
  cols: number;
  /** For a streamed matrix: the check its first product settles (settleCheck, verifyMatrix). */
  check?: MatrixCheck;
}

/** A float32 vector in native memory. */
export interface F32 {
  /** Native pointer to the values. */
  ptr: NonNullable<Deno.PointerValue>;
  /** The same memory as a Float32Array. */
  f: Float32Array;
}

/** One MXFP4 matrix: packed [rows][cols/2] and scales [rows][cols/32]. */
export interface Mxfp4 {
  /** Native pointer to the packed 4-bit values. */
  packed: NonNullable<Deno.PointerValue>;
  /** Native pointer to the per-block scales. */
  scales: NonNullable<Deno.PointerValue>;
  /** Output rows. */
  rows: number;
  /** Input columns. */
  cols: number;
}

/** One routed expert: gate w1, up w3, down w2. */
export interface Expert {
  /** Gate projection. */
  w1: Mxfp4;
  /** Up projection. */
  w3: Mxfp4;
  /** Down projection. */
  w2: Mxfp4;
  /** With an expert table: the digest its first run settles (settleExpert). */
  check?: ExpertCheck;
}

/** An expert's digest to be settled by its first run: the six tensor checks its products add up. */
export interface ExpertCheck {
  /** The table's digest. */
  expect: string;
  /** The tensor checks, in table order (w1 packed, w1 scale, w3 ..., w2 ...). */
  words: BigUint64Array;
  /** True once the bytes in the slot were found to match. */
  verified: boolean;
  /** The message of a mismatch (layer, expert, shard, table). */
  mismatch: string;
}

/** A tensor's bytes as its check sees them: how it is kept, its shape and its size. */
export interface TensorBytes {
  /** How the tensor is kept. */
  keep: Keep;
  /** Its shape (a matrix is checked as shape[0] rows). */
  shape: number[];
  /** Its bytes once bound. */
  bytes: number;
}

/** A tensor placed in a region: its bytes at `offset` from the region's start. */
export interface PlacedTensor extends TensorBytes {
  /** Byte offset in the region. */
  offset: number;
}

/** A tensor as the rows its check is made of. */
export function checkRows(t: TensorBytes): { rows: number; rowbytes: number } {
  return t.keep === "matrix" ? { rows: t.shape[0], rowbytes: t.bytes / t.shape[0] } : { rows: 1, rowbytes: t.bytes };
}

/** The check of a tensor whose bytes are at `ptr`, as a word. */
export function tensorCheckWord(
  k: Kernels,
  t: TensorBytes,
  ptr: NonNullable<Deno.PointerValue>,
): bigint {
  const { rows, rowbytes } = checkRows(t);
  const sum = new BigUint64Array(1);
  k.k3_matrix_check(ptr, rowbytes, 0, rows, Deno.UnsafePointer.of(sum));
  return sum[0];
}

/** The check of a tensor whose bytes are at `ptr`, as the manifest writes it. */
export function tensorCheck(
  k: Kernels,
  t: TensorBytes,
  ptr: NonNullable<Deno.PointerValue>,
): string {
  return hex64(tensorCheckWord(k, t, ptr));
}

/**
 * A streamed matrix's expected check, settled by the first product that uses it
 * (`settleCheck`) or, for a matrix no product reads whole, by `verifyMatrix`.
 */
export interface MatrixCheck {
  /** The manifest's check. */
  expect: string;
  /** True once the bytes in memory were found to match. */
  verified: boolean;
  /** What to say on a mismatch (trunk and tensor). */
  what: string;
}

/** The K3Error (exit 1) for a tensor whose bytes do not match its check. */
export function checkMismatch(what: string, got: string, expect: string): K3Error {
  return new K3Error(
    `${what}: checksum mismatch (manifest ${expect}, data ${got}): the trunk is corrupt; re-pack it (k3 pack --force)`,
  );
}

/** Compares a product's check with the expected one; throws checkMismatch when they differ. */
export function settleCheck(c: MatrixCheck, sum: bigint): void {
  const got = hex64(sum);
  if (got !== c.expect) throw checkMismatch(c.what, got, c.expect);
  c.verified = true;
}

/** Settles a matrix's open check by one pass over its bytes: for a matrix that kernels
 * other than the product read (MLA's kv_b_proj), before they read it. */
export function verifyMatrix(k: Kernels, m: Matrix): void {
  if (!m.check || m.check.verified) return;
  const bytes = m.rows * m.cols * (m.wtype === WTYPE.bf16 ? 2 : 4);
  settleCheck(m.check, tensorCheckWord(k, { keep: "matrix", shape: [m.rows, m.cols], bytes }, m.ptr));
}

/** The expert digest from its tensors' checks (k3w64 of the little-endian words). */
export function combineDigests(words: BigUint64Array): bigint {
  return io().k3io_hash(Deno.UnsafePointer.of(words), BigInt(8 * words.length));
}

/** Compares the checks a run added up with the table (K3Error, exit 1, on a mismatch). */
export function settleExpert(c: ExpertCheck): void {
  if (hex64(combineDigests(c.words)) !== c.expect) throw new K3Error(c.mismatch);
  c.verified = true;
}

/**
 * The checks of a region's tensors from its bytes fed in order (k3 pack while it writes,
 * `k3 pack --verify` while it reads): whole rows are checked where they lie, a row split
 * between two feeds is assembled in a small carry buffer first.
 */
export class RegionChecker {
  private readonly sums: BigUint64Array;
  private readonly sumsPtr: NonNullable<Deno.PointerValue>;
  private readonly carry: NativeBuffer;
  /** Region bytes fed so far. */
  private pos = 0;
  /** The tensor being fed, its rows done and the bytes of its next row held in `carry`. */
  private ti = 0;
  private row = 0;
  private held = 0;

  /** A checker for a region holding `tensors` (its manifest entries, in offset order). */
  constructor(private readonly k: Kernels, private readonly tensors: readonly PlacedTensor[]) {
    this.sums = new BigUint64Array(tensors.length);
    this.sumsPtr = Deno.UnsafePointer.of(this.sums)!;
    this.carry = NativeBuffer.alloc(k, Math.max(1, ...tensors.map((t) => checkRows(t).rowbytes)), "row carry");
  }

  /** Feeds the region's next `len` bytes, at `buf`'s start. */
  update(buf: NativeBuffer, len: number): void {
    const s = this.pos, e = s + len;
    while (this.ti < this.tensors.length) {
      const t = this.tensors[this.ti];
      const { rows, rowbytes } = checkRows(t);
      let a = Math.max(s, t.offset + this.row * rowbytes + this.held);
      const b = Math.min(e, t.offset + t.bytes);
      if (a >= b) {
        if (this.row === rows) {
          this.next();
          continue;
        }
        break;
      }
      const sum = Deno.UnsafePointer.offset(this.sumsPtr, 8 * this.ti)!;
      if (this.held > 0) {
        const n = Math.min(rowbytes - this.held, b - a);
        this.carry.u8.set(buf.u8.subarray(a - s, a - s + n), this.held);
        this.held += n;
        a += n;
        if (this.held === rowbytes) {
          this.k.k3_matrix_check(this.carry.ptr, rowbytes, this.row, this.row + 1, sum);
          this.row++;
          this.held = 0;
        }
      }
      const whole = Math.floor((b - a) / rowbytes);
      if (whole > 0) {
        this.k.k3_matrix_check(buf.at(a - s), rowbytes, this.row, this.row + whole, sum);
        this.row += whole;
        a += whole * rowbytes;
      }
      if (a < b) {
        this.carry.u8.set(buf.u8.subarray(a - s, b - s), 0);
        this.held = b - a;
      }
      if (this.row === rows) this.next();
      else break;
    }
    this.pos = e;
  }

  /** Moves on to the next tensor. */
  private next(): void {
    this.ti++;
    this.row = 0;
    this.held = 0;
  }

  /** Each tensor's check, in order (after every byte of the region was fed); frees the carry. */
  results(): string[] {
    this.carry.free();
    if (this.ti !== this.tensors.length) throw new Error("internal: region checked before all its bytes were fed");
    return Array.from(this.sums, hex64);
  }
}
