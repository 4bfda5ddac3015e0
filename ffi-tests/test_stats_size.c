/* The statistics structs grow at their end and start with `struct_size` (include/rdmx.h,
 * "Structs that grow"). A program built against an older header passes a smaller struct:
 * rdmx fills that many bytes, writes back how many, and writes nothing past it. A program
 * built against a newer header (a larger struct) gets rdmx's whole struct and its size.
 * struct_size 0 (not set) is refused. Checked on a messenger's stats and totals and on a
 * context's port counters, each inside a guard buffer whose tail must stay untouched. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define GUARD 0xA5
#define TAIL 64

/* A struct with TAIL guard bytes after it: `.s` the struct, `.b` its bytes. */
#define GUARDED(T)                     \
  union {                              \
    T s;                               \
    unsigned char b[sizeof(T) + TAIL]; \
  }

/* `buf` holds a struct of `size` bytes and TAIL guard bytes after it. */
static int tail_untouched(const unsigned char *buf, size_t size) {
  for (size_t i = size; i < size + TAIL; i++)
    if (buf[i] != GUARD) return 0;
  return 1;
}

/* The size a caller built against an older header would pass: the struct up to (not
 * including) the field at `cut`. */
static void older(unsigned char *buf, size_t full, size_t cut) {
  memset(buf, GUARD, full + TAIL);
  size_t size = cut;
  memcpy(buf, &size, sizeof size);
}

int main(void) {
  rdmx_config *cfg = NULL;
  rdmx_msgr *m = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(cfg, NULL, NULL, &m), RDMX_OK);
  uint16_t port = 0;
  CHECK_STATUS(rdmx_msgr_listen(m, "127.0.0.1:0", &port), RDMX_OK);

  /* rdmx_msgr_stats: an older struct ending before `missed_wakes`. */
  GUARDED(rdmx_msgr_stats) ms;
  size_t cut = offsetof(rdmx_msgr_stats, missed_wakes);
  older(ms.b, sizeof ms.s, cut);
  CHECK_STATUS(rdmx_msgr_get_stats(m, &ms.s), RDMX_OK);
  CHECK(ms.s.struct_size == cut);
  CHECK(ms.s.data_chunks_cap > 0);
  CHECK(tail_untouched(ms.b, cut));
  /* The current size: everything filled, the guard after the struct untouched. */
  older(ms.b, sizeof ms.s, sizeof ms.s);
  CHECK_STATUS(rdmx_msgr_get_stats(m, &ms.s), RDMX_OK);
  CHECK(ms.s.struct_size == sizeof ms.s);
  CHECK(ms.s.missed_wakes == 0 && ms.s.session_refusals == 0);
  CHECK(tail_untouched(ms.b, sizeof ms.s));
  /* A newer caller's larger struct: rdmx fills its own size and says so. */
  older(ms.b, sizeof ms.s, sizeof ms.s + TAIL / 2);
  CHECK_STATUS(rdmx_msgr_get_stats(m, &ms.s), RDMX_OK);
  CHECK(ms.s.struct_size == sizeof ms.s);
  CHECK(tail_untouched(ms.b, sizeof ms.s));
  /* Not set: refused, nothing written past the size field. */
  older(ms.b, sizeof ms.s, 0);
  CHECK_STATUS(rdmx_msgr_get_stats(m, &ms.s), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("struct_size");
  CHECK(tail_untouched(ms.b, sizeof(size_t)));
  /* Only the size field itself: allowed, nothing else written. */
  older(ms.b, sizeof ms.s, sizeof(size_t));
  CHECK_STATUS(rdmx_msgr_get_stats(m, &ms.s), RDMX_OK);
  CHECK(ms.s.struct_size == sizeof(size_t));
  CHECK(tail_untouched(ms.b, sizeof(size_t)));

  /* rdmx_session_counters (the messenger's totals): an older struct of 4 counters. */
  GUARDED(rdmx_session_counters) tc;
  cut = offsetof(rdmx_session_counters, replays);
  older(tc.b, sizeof tc.s, cut);
  CHECK_STATUS(rdmx_msgr_get_totals(m, &tc.s), RDMX_OK);
  CHECK(tc.s.struct_size == cut);
  CHECK(tc.s.msgs_sent == 0 && tc.s.bytes_received == 0);
  CHECK(tail_untouched(tc.b, cut));
  CHECK_STATUS(rdmx_msgr_get_totals(m, NULL), RDMX_INVALID_ARGUMENT);

  /* rdmx_port_counters of a context: an older struct ending before `async_events`. */
  rdmx_context *ctx = NULL;
  CHECK_STATUS(rdmx_context_new(cfg, &ctx), RDMX_OK);
  GUARDED(rdmx_port_counters) pc;
  cut = offsetof(rdmx_port_counters, async_events);
  older(pc.b, sizeof pc.s, cut);
  CHECK_STATUS(rdmx_context_port_counters(ctx, &pc.s), RDMX_OK);
  CHECK(pc.s.struct_size == cut);
  CHECK(pc.s.unknown_qpn == 0);
  CHECK(tail_untouched(pc.b, cut));

  rdmx_context_free(ctx);
  rdmx_msgr_free(m);
  rdmx_config_free(cfg);
  CHECK_DONE("test_stats_size");
}
