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
 * k3io_hash* is the trunk checksum ("k3h64"): four 64-bit lanes of the xxHash64 round over
 * 32-byte stripes, merged as XXH64 merges them, then the remaining 8-byte words and bytes,
 * then the XXH64 avalanche. (Same construction as XXH64, not claimed bit-compatible.)
 * Streaming: init, update with lengths that are multiples of 32 (any length on the last
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
/* Streaming checksum: state is 6 uint64_t (v1..v4, total length, finished flag). */
void k3io_hash_init(uint64_t *state);
/* len must be a multiple of 32 except on the last update. Returns 0, or -1 when a
 * previous update already ended with a partial stripe. */
int32_t k3io_hash_update(uint64_t *state, const void *p, uint64_t len);
uint64_t k3io_hash_digest(const uint64_t *state);

/* Reads like k3io_pread, then writes k3io_hash of the first `hash_len` bytes read and of
 * the last `hash_len` bytes of [0, len) to out[0] and out[1] (the trunk's cheap check on a
 * streamed read; hash_len 0 skips it). When full != 0, out[2] gets the hash of all len bytes. */
int64_t k3io_pread_check(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t hash_len,
                         int32_t full, uint64_t *out);

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

#endif
