/* SipHash-2-4 (Aumasson and Bernstein) of a message under a 16-byte key: the MAC of kernel_observer's blocks.
 * gemmlab/grade/preload/channel.py computes the same function in the grader's process. */
#ifndef GEMMLAB_SIPHASH_H
#define GEMMLAB_SIPHASH_H
#include <stddef.h>
#include <stdint.h>
static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                       \
  do {                                                                                                 \
    v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;   \
    v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0; v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);   \
  } while (0)

static uint64_t siphash(const uint8_t key[16], const uint8_t *m, size_t len) {
  uint64_t k0 = le64(key), k1 = le64(key + 8);
  uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
  uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
  size_t whole = len - len % 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t w = le64(m + i);
    v3 ^= w; SIPROUND; SIPROUND; v0 ^= w;
  }
  uint64_t b = (uint64_t)len << 56;
  for (size_t i = 0; i < len % 8; i++) b |= (uint64_t)m[whole + i] << (8 * i);
  v3 ^= b; SIPROUND; SIPROUND; v0 ^= b;
  v2 ^= 0xff; SIPROUND; SIPROUND; SIPROUND; SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}
#endif
