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

/* ---- split codec (trunk manifest version 5) ----
 * A split-coded piece holds len bytes of 16-bit little-endian words (bf16 weights; F32
 * vectors as two words each) as: a K3IO_SPLIT_HEADER-byte header (u32 magic, u32 code
 * width w in 1..7, u32 words, u32 offset of the first block, then the 2^w - 1 dictionary
 * bytes, zeros to the end of the header), the block index (one u32 per block: where the
 * block starts in the stored bytes), zeros up to the first block, then per block of
 * K3IO_SPLIT_BLOCK words: the high bytes as w-bit codes (8 codes per w bytes, code j of a
 * group at bits j*w of the group's little-endian bits; code c < 2^w - 1 is dict[c], 2^w - 1
 * is an escape), the block's low bytes as they are, and one byte per escape (its high byte)
 * in order. The last block ends at the end of the stored bytes, a multiple of 4096.
 * It is made to be decoded IN PLACE: read to the end of the piece's own slot (bytes
 * [len - stored, len) of it), block b's decoded bytes end at or before block b + 1's stored
 * bytes begin, so one buffer holds both and nothing else is needed. The index lets a
 * product decode any run of words straight from the stored bytes (k3io_split_range). */
#define K3IO_SPLIT_MAGIC 0x3253334BU /* "K3S2" */
#define K3IO_SPLIT_HEADER 256
#define K3IO_SPLIT_BLOCK 2048
int64_t k3io_split_encode(const void *src, uint64_t len, void *dst, uint64_t cap, int32_t width);
/* Decodes slen stored bytes into the len-byte piece at dst (separate buffers, or in place
 * as above). Returns len, or -EBADMSG for a piece that is not a well-formed coded piece of
 * len bytes (a header field out of range, a byte between the dictionary and the index or
 * between the index and the first block not zero, an index entry that is not where its
 * block starts, escapes that do not end exactly at slen, or in place a block that would
 * overwrite the next one's stored bytes; nothing beyond dst + len is written, nothing
 * beyond stored + slen read). */
int64_t k3io_split_decode(const void *stored, uint64_t slen, void *dst, uint64_t len);
/* Checks what k3io_split_range trusts of a coded piece kept coded (not decoded): the header
 * fields, the zero bytes, and an index whose blocks follow each other with 0..2048 escape
 * bytes each, the last ending at slen. Returns len, or -EBADMSG. What it does not check
 * (which codes are escapes) k3io_split_range finds when it decodes a block. */
int64_t k3io_split_check(const void *stored, uint64_t slen, uint64_t len);
/* Decodes words [w0, w0 + n) of a coded piece (slen stored bytes of a len-byte piece) into
 * out, reading only the blocks that hold them (found by the index). Returns 0, or -EBADMSG
 * for a piece that does not decode there (out is then zero where it failed). */
int64_t k3io_split_range(const void *stored, uint64_t slen, uint64_t len, uint64_t w0, uint64_t n, uint16_t *out);
/* Reads one trunk piece: `stored` bytes at offset to the end of the len-byte buf, decoded
 * in place when stored < len (split-coded); with K3IO_KEEP_CODED in flags a coded piece is
 * read to the START of buf (it needs only `stored` bytes there) and only checked
 * (k3io_split_check). With K3IO_HASH in flags out[0] = k3io_hash of the len
 * decoded bytes; out[1] = the thread CPU nanoseconds spent decoding. Returns len, the bytes read when a
 * raw piece ends at end of file (0 for a coded one), or -errno (-EBADMSG: not decodable). */
#define K3IO_HASH 1
#define K3IO_KEEP_CODED 2
int64_t k3io_pread_piece(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t stored, int32_t flags,
                         uint64_t *out);

#endif
