/* Shared by the messenger echo server and its C/C++ clients: message types, the front
 * layout, the data pattern and its checksum. */
#ifndef RDMX_FFI_MSGR_ECHO_H
#define RDMX_FFI_MSGR_ECHO_H

#include <stddef.h>
#include <stdint.h>

#define ECHO_TYPE 1 /* echoed back: same type, front and data */
#define QUIT_TYPE 2 /* a client is done (acknowledged, not echoed) */

#define ECHO_DATA 4096

/* The front of an ECHO message. */
typedef struct {
  uint64_t number; /* 0, 1, 2, ... per session */
  uint32_t checksum; /* fnv1a of the data */
  uint32_t data_len;
  uint32_t seg_kind; /* how the client sent the data (RDMX_SEG_*) */
  uint32_t pad;
} echo_front;

static inline uint8_t echo_byte(uint64_t number, size_t j) {
  return (uint8_t)(number * 131u + j * 7u + (j >> 8));
}

static inline uint32_t fnv1a(uint32_t h, const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 16777619u;
  }
  return h;
}

#define FNV_INIT 2166136261u

#endif
