/* k3io: see k3io.h. */
#define _GNU_SOURCE
#include "k3io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef O_DIRECT
#define O_DIRECT 0
#endif

int32_t k3io_open(const char *path, int32_t flags) {
  int base = (flags & K3IO_WRITE) ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
  base |= O_CLOEXEC;
  int fd = -1;
  if ((flags & K3IO_DIRECT) && O_DIRECT != 0) {
    fd = open(path, base | O_DIRECT, 0644);
    if (fd >= 0) return fd;
    if (errno != EINVAL && errno != EOPNOTSUPP) return -errno;
  }
  fd = open(path, base, 0644);
  return fd >= 0 ? fd : -errno;
}

int32_t k3io_is_direct(int32_t fd) {
#if O_DIRECT != 0
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_DIRECT) ? 1 : 0;
#else
  (void)fd;
  return 0;
#endif
}

int32_t k3io_close(int32_t fd) { return close(fd) == 0 ? 0 : -errno; }

int64_t k3io_size(int32_t fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  return (int64_t)st.st_size;
}

int64_t k3io_pread(int32_t fd, void *buf, uint64_t len, uint64_t offset) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}

int64_t k3io_pwrite(int32_t fd, const void *buf, uint64_t len, uint64_t offset) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}

int32_t k3io_sync(int32_t fd) {
#if defined(__APPLE__)
  return fsync(fd) == 0 ? 0 : -errno;
#else
  return fdatasync(fd) == 0 ? 0 : -errno;
#endif
}

int32_t k3io_truncate(int32_t fd, uint64_t len) { return ftruncate(fd, (off_t)len) == 0 ? 0 : -errno; }

/* ---- k3h64 ---------------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t rd64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8); /* little-endian hosts only: the trunk format is little-endian */
  return v;
}
static uint32_t rd32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t round64(uint64_t acc, uint64_t in) {
  acc += in * P2;
  acc = rotl(acc, 31);
  return acc * P1;
}
static uint64_t merge64(uint64_t acc, uint64_t v) {
  acc ^= round64(0, v);
  return acc * P1 + P4;
}

void k3io_hash_init(uint64_t *s) {
  s[0] = P1 + P2;
  s[1] = P2;
  s[2] = 0;
  s[3] = (uint64_t)0 - P1;
  s[4] = 0; /* total length */
  s[5] = 0; /* tail: bytes after the last full stripe, hashed at digest */
}

/* Folds a final partial stripe (< 32 bytes) into one word, the way XXH64 finishes. */
static uint64_t tail_fold(uint64_t h, const unsigned char *p, uint64_t n) {
  while (n >= 8) {
    h ^= round64(0, rd64(p));
    h = rotl(h, 27) * P1 + P4;
    p += 8;
    n -= 8;
  }
  if (n >= 4) {
    h ^= (uint64_t)rd32(p) * P1;
    h = rotl(h, 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  while (n > 0) {
    h ^= (*p) * P5;
    h = rotl(h, 11) * P1;
    p++;
    n--;
  }
  return h;
}

int32_t k3io_hash_update(uint64_t *s, const void *p, uint64_t len) {
  if (s[5] != 0) return -1;
  const unsigned char *b = (const unsigned char *)p;
  uint64_t v1 = s[0], v2 = s[1], v3 = s[2], v4 = s[3];
  uint64_t n = len / 32;
  for (uint64_t i = 0; i < n; i++, b += 32) {
    v1 = round64(v1, rd64(b));
    v2 = round64(v2, rd64(b + 8));
    v3 = round64(v3, rd64(b + 16));
    v4 = round64(v4, rd64(b + 24));
  }
  s[0] = v1;
  s[1] = v2;
  s[2] = v3;
  s[3] = v4;
  s[4] += len;
  uint64_t rest = len - n * 32;
  if (rest) {
    /* The final partial stripe: fold it now into a tail word, marked finished. */
    s[5] = tail_fold(P5 ^ 0x6B33696FULL, b, rest) | 1ULL;
  }
  return 0;
}

uint64_t k3io_hash_digest(const uint64_t *s) {
  uint64_t h = rotl(s[0], 1) + rotl(s[1], 7) + rotl(s[2], 12) + rotl(s[3], 18);
  h = merge64(h, s[0]);
  h = merge64(h, s[1]);
  h = merge64(h, s[2]);
  h = merge64(h, s[3]);
  h += s[4];
  if (s[5]) {
    h ^= s[5];
    h = rotl(h, 27) * P1 + P4;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t k3io_hash(const void *p, uint64_t len) {
  uint64_t s[6];
  k3io_hash_init(s);
  k3io_hash_update(s, p, len);
  return k3io_hash_digest(s);
}

int64_t k3io_pread_check(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t hash_len,
                         int32_t full, uint64_t *out) {
  int64_t n = k3io_pread(fd, buf, len, offset);
  if (n < 0 || (uint64_t)n < len) return n;
  if (hash_len > 0) {
    uint64_t h = hash_len < len ? hash_len : len;
    out[0] = k3io_hash(buf, h);
    out[1] = k3io_hash((const char *)buf + (len - h), h);
  }
  if (full) out[2] = k3io_hash(buf, len);
  return n;
}

int32_t k3io_kind(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return errno == ENOENT || errno == ENOTDIR ? K3IO_KIND_MISSING : -errno;
  if (S_ISREG(st.st_mode)) return K3IO_KIND_REGULAR;
  if (S_ISDIR(st.st_mode)) return K3IO_KIND_DIR;
  if (S_ISFIFO(st.st_mode)) return K3IO_KIND_FIFO;
  if (S_ISCHR(st.st_mode)) return K3IO_KIND_CHAR;
  if (S_ISBLK(st.st_mode)) return K3IO_KIND_BLOCK;
  if (S_ISSOCK(st.st_mode)) return K3IO_KIND_SOCKET;
  return K3IO_KIND_OTHER;
}

int64_t k3io_write(int32_t fd, const void *buf, uint64_t len) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, (const char *)buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}
