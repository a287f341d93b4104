/**
 * File I/O for weights that do not stay in memory: the packed trunk, the expert cache and
 * the packer. A thin binding to kernels/k3io.c, which lives in the same shared library as
 * the kernels (its functions: symbols.ts ioSymbols).
 *
 * Reads and writes are `nonblocking` FFI calls: they run on Deno's blocking thread pool
 * while the JS thread keeps computing. Every such call returns a promise that MUST be
 * awaited (or settled) before the buffer it writes into is freed or reused.
 *
 * O_DIRECT (`direct: true`) is used when the filesystem allows it; then buffer address,
 * file offset and length must be multiples of ALIGN. `readSpan` rounds a byte range out
 * to ALIGN so callers can read any range from a direct file.
 *
 * @module
 */

import { defaultLibraryPath } from "./ffi.ts";
import { ioSymbols } from "./symbols.ts";
import { K3Error } from "../errors.ts";

/** The loaded I/O functions of libk3. */
export type IoLib = Deno.DynamicLibrary<typeof ioSymbols>["symbols"];

/** Alignment of O_DIRECT buffers, offsets and lengths (k3_alloc aligns to this). */
export const ALIGN = 4096;

let lib: IoLib | undefined;

/** The k3io functions (from the same libk3 the kernels use). */
export function io(): IoLib {
  if (!lib) {
    const path = defaultLibraryPath();
    try {
      lib = Deno.dlopen(path, ioSymbols).symbols;
    } catch (e) {
      throw new Error(
        `cannot load ${path} for file I/O: ${(e as Error).message} (build it with: make -C kernels)`,
      );
    }
  }
  return lib;
}

/** `n` rounded down to ALIGN. */
export const alignDown = (n: number): number => Math.floor(n / ALIGN) * ALIGN;
/** `n` rounded up to ALIGN. */
export const alignUp = (n: number): number => Math.ceil(n / ALIGN) * ALIGN;

const enc = new TextEncoder();
const cstr = (s: string) => enc.encode(s + "\0");

/** Words for a negative errno returned by k3io. */
export function errnoText(e: number): string {
  const names: Record<number, string> = {
    2: "no such file",
    5: "I/O error",
    9: "bad file descriptor",
    13: "permission denied",
    21: "is a directory",
    22: "invalid argument",
    28: "no space left on device",
    74: "not a well-formed coded piece",
  };
  return names[-e] ?? `errno ${-e}`;
}

/**
 * Read activity of the whole process: bytes read and the wall-clock time during which at
 * least one read was in flight ("busy"), so bytes / busy is the bandwidth reads achieved
 * whatever overlapped with them.
 */
export const readActivity = { bytes: 0, busySeconds: 0, inflight: 0, since: 0 };

function readStarted(): void {
  if (readActivity.inflight++ === 0) readActivity.since = performance.now();
}

function readEnded(bytes: number): void {
  readActivity.bytes += Math.max(0, bytes);
  if (--readActivity.inflight === 0) readActivity.busySeconds += (performance.now() - readActivity.since) / 1000;
}

/** An open file read and written through k3io. */
export class IoFile {
  private closed = false;
  private constructor(readonly path: string, readonly fd: number, readonly direct: boolean) {}

  /** Opens for reading (or writing: create/truncate). `direct`: try O_DIRECT. */
  static open(path: string, opts: { write?: boolean; direct?: boolean } = {}): IoFile {
    const fd = io().k3io_open(cstr(path), (opts.write ? 1 : 0) | (opts.direct ? 2 : 0));
    if (fd < 0) throw new K3Error(`cannot open ${path}: ${errnoText(fd)}`);
    return new IoFile(path, fd, opts.direct ? io().k3io_is_direct(fd) === 1 : false);
  }

  /** The file's size in bytes. */
  size(): number {
    const n = Number(io().k3io_size(this.fd));
    if (n < 0) throw new K3Error(`${this.path}: cannot stat: ${errnoText(n)}`);
    return n;
  }

  /** Reads up to len bytes at offset into ptr; resolves to the bytes read (short only at EOF). */
  async pread(ptr: NonNullable<Deno.PointerValue>, len: number, offset: number): Promise<number> {
    readStarted();
    let n = -5;
    try {
      n = Number(await io().k3io_pread(this.fd, ptr, BigInt(len), BigInt(offset)));
    } finally {
      readEnded(n);
    }
    if (n < 0) {
      throw new K3Error(`${this.path}: read of ${len} bytes at ${offset} failed: ${errnoText(n)}`);
    }
    return n;
  }

  /**
   * Reads like `pread` and computes the k3w64 of the bytes read on the same I/O thread
   * (so verifying costs the JS thread nothing), `chunk` bytes per pread (0: one pread),
   * each chunk hashed right after it lands. Resolves to the bytes read and, when all `len`
   * were read, their hash as 16 hex digits.
   */
  async preadHashed(
    ptr: NonNullable<Deno.PointerValue>,
    len: number,
    offset: number,
    chunk = 0,
  ): Promise<{ n: number; hash?: string }> {
    const out = new BigUint64Array(1);
    readStarted();
    let n = -5;
    try {
      n = Number(
        await io().k3io_pread_hash(
          this.fd,
          ptr,
          BigInt(len),
          BigInt(offset),
          BigInt(chunk),
          Deno.UnsafePointer.of(out),
        ),
      );
    } finally {
      readEnded(n);
    }
    if (n < 0) {
      throw new K3Error(`${this.path}: read of ${len} bytes at ${offset} failed: ${errnoText(n)}`);
    }
    return { n, hash: n === len ? hex64(out[0]) : undefined };
  }

  /**
   * Reads one trunk piece of `len` bytes stored as `stored` bytes at `offset` (kernels/k3io.h
   * k3io_pread_piece): raw when they are equal, else split-coded, read to the end of `ptr`'s
   * `len` bytes and decoded there in place, on the I/O thread. With `keepCoded` a coded piece
   * stays coded there (its header and block index checked), for the product to decode
   * (WTYPE.bf16Split). With `hash` the decoded bytes' k3w64 comes back too. Resolves to the
   * bytes now at `ptr` (short only for a raw piece at end of file, 0 for a coded one) and the
   * CPU seconds the I/O thread spent decoding; a coded piece that does not decode rejects with
   * CodedPieceCorrupt.
   */
  async preadPiece(
    ptr: NonNullable<Deno.PointerValue>,
    len: number,
    offset: number,
    stored: number,
    hash: boolean,
    keepCoded = false,
  ): Promise<{ n: number; hash?: string; decodeSeconds: number }> {
    const out = new BigUint64Array(2);
    readStarted();
    let n = -5;
    try {
      n = Number(
        await io().k3io_pread_piece(
          this.fd,
          ptr,
          BigInt(len),
          BigInt(offset),
          BigInt(stored),
          (hash ? 1 : 0) | (keepCoded ? 2 : 0),
          Deno.UnsafePointer.of(out),
        ),
      );
    } finally {
      readEnded(n < 0 ? n : Math.min(n, stored));
    }
    if (n === -EBADMSG) throw new CodedPieceCorrupt(`${this.path}: the coded piece at ${offset} does not decode`);
    if (n < 0) {
      throw new K3Error(`${this.path}: read of ${stored} bytes at ${offset} failed: ${errnoText(n)}`);
    }
    return { n, hash: hash && n === len ? hex64(out[0]) : undefined, decodeSeconds: Number(out[1]) / 1e9 };
  }

  /** Reads exactly len bytes (or throws naming the file and the shortfall). */
  async readExact(ptr: NonNullable<Deno.PointerValue>, len: number, offset: number): Promise<void> {
    const n = await this.pread(ptr, len, offset);
    if (n !== len) {
      throw new K3Error(`${this.path}: short read: ${n} of ${len} bytes at offset ${offset}`);
    }
  }

  /**
   * Reads bytes [offset, offset+len) of the file into `buf` (capacity `cap`), rounding out
   * to ALIGN on a direct file. Resolves to where the first wanted byte landed in buf.
   * Throws when the file ends before offset+len.
   */
  async readSpan(
    buf: NonNullable<Deno.PointerValue>,
    cap: number,
    offset: number,
    len: number,
  ): Promise<number> {
    const start = this.direct ? alignDown(offset) : offset;
    const delta = offset - start;
    const want = this.direct ? alignUp(delta + len) : len;
    if (want > cap) throw new Error(`internal: readSpan needs ${want} bytes, buffer holds ${cap}`);
    const n = await this.pread(buf, want, start);
    if (n < delta + len) {
      throw new K3Error(
        `${this.path}: short read: file ends before byte ${offset + len} (got ${
          Math.max(0, n - delta)
        } of ${len} bytes at offset ${offset})`,
      );
    }
    return delta;
  }

  /** Writes `len` bytes from `ptr` at `offset` (all of them, or throws). */
  async pwrite(ptr: NonNullable<Deno.PointerValue>, len: number, offset: number): Promise<void> {
    const n = Number(await io().k3io_pwrite(this.fd, ptr, BigInt(len), BigInt(offset)));
    if (n !== len) {
      throw new K3Error(
        `${this.path}: write of ${len} bytes at ${offset} failed: ${n < 0 ? errnoText(n) : "short write"}`,
      );
    }
  }

  /** Flushes the file's data to the disk (fdatasync). */
  async sync(): Promise<void> {
    const r = await io().k3io_sync(this.fd);
    if (r < 0) throw new K3Error(`${this.path}: sync failed: ${errnoText(r)}`);
  }

  /** Sets the file's length. */
  truncate(len: number): void {
    const r = io().k3io_truncate(this.fd, BigInt(len));
    if (r < 0) throw new K3Error(`${this.path}: truncate failed: ${errnoText(r)}`);
  }

  /** Closes the file. */
  close(): void {
    if (!this.closed) {
      this.closed = true;
      io().k3io_close(this.fd);
    }
  }
}

/** Words per block of a split-coded piece (K3IO_SPLIT_BLOCK): a coded piece's bytes are a
 * multiple of twice this. */
export const SPLIT_BLOCK = 2048;

/** errno k3io returns for a coded piece that does not decode. */
const EBADMSG = 74;

/** A split-coded piece whose bytes do not decode: the data is corrupt. */
export class CodedPieceCorrupt extends Error {}

/**
 * Split-codes the `len` bytes at `src` into `dst` (`cap` bytes; kernels/k3io.h): `width` 0
 * picks the width that stores fewest bytes and returns 0 when the piece is best stored raw;
 * 1..7 forces that width. Returns the stored bytes (a multiple of ALIGN) or 0.
 */
export function splitEncode(
  src: NonNullable<Deno.PointerValue>,
  len: number,
  dst: NonNullable<Deno.PointerValue>,
  cap: number,
  width = 0,
): number {
  const n = Number(io().k3io_split_encode(src, BigInt(len), dst, BigInt(cap), width));
  if (n < 0) throw new Error(`split encode of ${len} bytes: ${errnoText(n)}`);
  return n;
}

/**
 * Decodes `stored` split-coded bytes at `src` into the `len`-byte piece at `dst` (separate
 * buffers, or in place with the stored bytes at the end of the piece). Returns false when
 * they are not a well-formed coded piece of `len` bytes.
 */
export function splitDecode(
  src: NonNullable<Deno.PointerValue>,
  stored: number,
  dst: NonNullable<Deno.PointerValue>,
  len: number,
): boolean {
  return Number(io().k3io_split_decode(src, BigInt(stored), dst, BigInt(len))) === len;
}

/** What `path` is (k3io_kind: stat in C, for paths the runtime may not stat), or -errno. */
export function pathKind(path: string): number {
  return io().k3io_kind(cstr(path));
}

/** A file opened for plain sequential writes through k3io (FIFOs and devices). */
export class IoWriter {
  private constructor(readonly path: string, private readonly fd: number) {}

  /** Opens `path` for writing (created/truncated when it is a regular file). */
  static open(path: string): IoWriter {
    const fd = io().k3io_open(cstr(path), 1);
    if (fd < 0) throw new K3Error(`cannot open ${path}: ${errnoText(fd)}`);
    return new IoWriter(path, fd);
  }

  /** Writes all of `p`; returns its length, or throws naming the errno. */
  writeSync(p: Uint8Array): number {
    const n = Number(io().k3io_write(this.fd, p, BigInt(p.length)));
    if (n < 0) throw new Error(errnoText(n));
    return n;
  }

  /** Closes the file descriptor. */
  close(): void {
    io().k3io_close(this.fd);
  }
}

/** The name of k3's checksum (kernels/k3io.h), as trunk manifests and expert tables record it. */
export const CHECKSUM = "k3w64";

/** k3w64 of len bytes at ptr, as 16 hex digits. */
export function hashHex(ptr: NonNullable<Deno.PointerValue>, len: number): string {
  return hex64(io().k3io_hash(ptr, BigInt(len)));
}

/** A 64-bit digest or check as 16 hex digits (how manifests and tables write them). */
export const hex64 = (h: bigint): string => h.toString(16).padStart(16, "0");

/** A streaming k3w64 (updates must be multiples of 64 bytes except the last). */
export class Hasher {
  private readonly state = new BigUint64Array(12);
  private readonly ptr = Deno.UnsafePointer.of(this.state)!;
  constructor() {
    io().k3io_hash_init(this.ptr);
  }
  /** Adds `len` bytes at `ptr` to the hash. */
  update(ptr: NonNullable<Deno.PointerValue>, len: number): void {
    if (io().k3io_hash_update(this.ptr, ptr, BigInt(len)) !== 0) {
      throw new Error("internal: hash update after a partial stripe");
    }
  }
  /** The hash so far, as hex. */
  hex(): string {
    return hex64(io().k3io_hash_digest(this.ptr));
  }
}

/**
 * The text of a small regular file read natively (k3io_read_small: /proc and /sys files,
 * which the `k3` permission set does not let the runtime read), at most `cap` bytes;
 * undefined when it cannot be read (missing, not regular, refused).
 */
export function readSmallFile(path: string, cap = 1 << 16): string | undefined {
  const buf = new Uint8Array(cap);
  const n = Number(io().k3io_read_small(cstr(path), buf, BigInt(cap)));
  return n < 0 ? undefined : new TextDecoder().decode(buf.subarray(0, n));
}
