/**
 * Native buffers: memory allocated by the kernel library (4096-aligned, fit for O_DIRECT),
 * with the pointer taken once and typed-array views for TypeScript.
 *
 * Workers in the same process can use the same pointers, since they dlopen the same
 * library; nothing is copied.
 *
 * @module
 */

import type { Kernels } from "./ffi.ts";
import { K3Error } from "../errors.ts";

/** One native allocation. */
export class NativeBuffer {
  /** The buffer's bytes. */
  readonly u8: Uint8Array;
  private freed = false;

  /** Wraps `bytes` bytes at `ptr`, allocated by the kernels' k3_alloc. */
  constructor(private readonly k: Kernels, readonly ptr: NonNullable<Deno.PointerValue>, readonly bytes: number) {
    this.u8 = bytes === 0 ? new Uint8Array(0) : new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr, bytes));
  }

  /** Allocates `bytes` (not zeroed; touching fresh pages is the cost, so reuse buffers). */
  static alloc(k: Kernels, bytes: number, what = "buffer"): NativeBuffer {
    const p = k.k3_alloc(BigInt(Math.max(bytes, 1)));
    if (p === null) throw new K3Error(`out of memory allocating ${bytes} bytes for ${what}`);
    return new NativeBuffer(k, p, bytes);
  }

  /**
   * Touches every page now, so the kernel faults (and zeroes) them here rather than inside
   * a later read into the buffer. Called on a buffer whose read comes next while another
   * read is in flight, it moves the first-touch cost off the disk's critical path.
   */
  prefault(): void {
    for (let i = 0; i < this.bytes; i += 4096) this.u8[i] = 0;
  }

  /** A Float32Array view of the whole buffer. */
  f32(): Float32Array {
    return new Float32Array(this.u8.buffer, this.u8.byteOffset, this.bytes >>> 2);
  }

  /** Pointer `offset` bytes in. */
  at(offset: number): NonNullable<Deno.PointerValue> {
    return offset === 0 ? this.ptr : Deno.UnsafePointer.offset(this.ptr, offset)!;
  }

  /** Frees the memory (once). */
  free(): void {
    if (!this.freed) {
      this.freed = true;
      this.k.k3_free(this.ptr);
    }
  }
}

/**
 * A float32 vector in native memory: pointer and view taken once, used on every token.
 */
export class Vec {
  /** The native buffer. */
  readonly buf: NativeBuffer;
  /** Its values. */
  readonly f: Float32Array;
  /** Its pointer. */
  readonly ptr: NonNullable<Deno.PointerValue>;

  /** Allocates `length` float32 values (`what` names it in errors). */
  constructor(k: Kernels, readonly length: number, what = "vector") {
    this.buf = NativeBuffer.alloc(k, length * 4, what);
    this.f = this.buf.f32();
    this.ptr = this.buf.ptr;
  }

  /** Pointer to element i. */
  at(i: number): NonNullable<Deno.PointerValue> {
    return this.buf.at(i * 4);
  }
}
