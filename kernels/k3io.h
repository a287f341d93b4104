/*
 * k3io: file I/O for the weight streamer and the packer.
 *
 * Reads go straight into caller-owned (4096-aligned) buffers with pread, looping until
 * the requested length or end of file. Files can be opened with O_DIRECT (bypassing the
 * page cache, so streamed weights do not double their footprint) where the filesystem
 * allows; k3io_open falls back to buffered I/O otherwise and k3io_is_direct says which.
 * With O_DIRECT the buffer address, offset and length must be multiples of 4096.
 *
 * The TypeScript side calls the read/write functions as `nonblocking` FFI symbols, so they
 * run on Deno's blocking thread pool while the forward pass computes.
 *
 * k3io_hash* is k3's one checksum ("k3w64", a 64-bit digest): a wide multiply-accumulate
 * hash built like XXH3's long-input loop, 8 lanes of 64 bits over 64-byte stripes, keyed
 * per stripe, scrambled every 16 stripes, folded with 64x64->128 multiplies into one word
 * (not claimed compatible with XXH3). The scalar, AVX2, AVX-512 and NEON paths do the same
 * integer arithmetic, so they agree bit for bit; tests/oracle/k3w64.py is its definition
 * in Python. ~10 GB/s from DRAM and ~35 GB/s in cache on one AVX2 core.
 * Streaming: init, update with lengths that are multiples of 64 (any length on the last
 * call), digest.
 */
#ifndef K3IO_H
#define K3IO_H
#include <stdint.h>

/* flags for k3io_open */
#define K3IO_READ 0
#define K3IO_WRITE 1   /* create/truncate for writing */
#define K3IO_DIRECT 2  /* try O_DIRECT (falls back to buffered) */

/* Returns a file descriptor, or -errno. */
int32_t k3io_open(const char *path, int32_t flags);
/* 1 when fd has O_DIRECT, else 0. */
int32_t k3io_is_direct(int32_t fd);
int32_t k3io_close(int32_t fd);
/* File size in bytes, or -errno. */
int64_t k3io_size(int32_t fd);

/* Reads up to len bytes at offset into buf; loops over short reads; stops at EOF.
 * Returns the bytes read (< len only at end of file), or -errno. */
int64_t k3io_pread(int32_t fd, void *buf, uint64_t len, uint64_t offset);
/* Writes len bytes at offset; returns len or -errno. */
int64_t k3io_pwrite(int32_t fd, const void *buf, uint64_t len, uint64_t offset);
/* fdatasync; 0 or -errno. */
int32_t k3io_sync(int32_t fd);
/* Sets the file's length; 0 or -errno. */
int32_t k3io_truncate(int32_t fd, uint64_t len);

/* One-shot checksum of len bytes. */
uint64_t k3io_hash(const void *p, uint64_t len);
/* Words of streaming state (lanes, stripe in block, length, ended flag). */
#define K3IO_HASH_STATE 12
/* Streaming checksum over a K3IO_HASH_STATE-word state. */
void k3io_hash_init(uint64_t *state);
/* len must be a multiple of 64 except on the last update. Returns 0, or -1 when a
 * previous update already ended with a partial stripe. */
int32_t k3io_hash_update(uint64_t *state, const void *p, uint64_t len);
uint64_t k3io_hash_digest(const uint64_t *state);

/* Reads like k3io_pread, `chunk` bytes per pread (0 or >= len: all at once; else a multiple of 64),
 * hashing each chunk right after it lands; when all len bytes were read, out[0] gets their
 * k3io_hash. Returns the bytes read, or -errno (-EINVAL for a bad chunk). */
int64_t k3io_pread_hash(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t chunk, uint64_t *out);

/* What `path` is (following symlinks): one of K3IO_KIND_*, or -errno. Used where the
 * runtime's own stat is not permitted (devices, /sys), so a FIFO or device is recognised. */
#define K3IO_KIND_MISSING 0
#define K3IO_KIND_REGULAR 1
#define K3IO_KIND_DIR 2
#define K3IO_KIND_FIFO 3
#define K3IO_KIND_CHAR 4
#define K3IO_KIND_BLOCK 5
#define K3IO_KIND_SOCKET 6
#define K3IO_KIND_OTHER 7
int32_t k3io_kind(const char *path);
/* Writes len bytes at the current position (FIFOs, devices); returns len or -errno. */
int64_t k3io_write(int32_t fd, const void *buf, uint64_t len);

/* Reads at most cap bytes of the regular file at path from its start (a /proc or /sys file
 * the runtime is not permitted to read); returns the bytes read or -errno (-EINVAL for a
 * file that is not regular). */
int64_t k3io_read_small(const char *path, void *buf, uint64_t cap);

#endif
