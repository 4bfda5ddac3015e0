/* One process, two contexts, on whichever provider the environment configures
 * (RDMX_PROVIDER: run.sh runs this binary as is, and again under `rdmx-ibv exec --set
 * provider=verbs`, where libibverbs sees rdmx's device rdmx0): the provider and its reason
 * are reported, a listener accepts on a thread, and a READ, a WRITE and a SEND with
 * immediate move the right bytes; the event fd fires. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "conn_wait.h"

#define LEN 16384

static rdmx_context *new_context(void) {
  rdmx_config *cfg = NULL;
  rdmx_context *ctx = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK); /* defaults + RDMX_* environment */
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "path_mtu", "1024"), RDMX_OK);
  CHECK_STATUS(rdmx_context_new(cfg, &ctx), RDMX_OK);
  rdmx_config_free(cfg);
  return ctx;
}

struct acc {
  rdmx_listener *l;
  rdmx_conn *c;
  rdmx_status st;
};

static void *accept_one(void *p) {
  struct acc *a = p;
  a->st = rdmx_listener_accept(a->l, 10000, &a->c);
  return NULL;
}

int main(void) {
  const char *want = getenv("RDMX_PROVIDER");
  if (want == NULL) want = "soft";
  rdmx_context *a = new_context(), *b = new_context();
  CHECK_STREQ(rdmx_context_provider(a), want);
  const char *why = rdmx_context_provider_reason(a);
  CHECK(why != NULL && strstr(why, "provider=") == why);
  if (strcmp(want, "verbs") == 0) CHECK(strstr(why, "device rdmx0 port 1") != NULL);
  CHECK(rdmx_context_provider_reason(NULL) == NULL);
  printf("provider %s: %s\n", rdmx_context_provider(a), why);

  uint8_t *abuf = calloc(LEN, 1), *bbuf = malloc(LEN);
  for (size_t i = 0; i < LEN; i++) bbuf[i] = (uint8_t)(i * 7 + 3);
  rdmx_mr ma, mb;
  CHECK_STATUS(rdmx_mr_reg(a, abuf, LEN, RDMX_ACCESS_LOCAL_WRITE, &ma), RDMX_OK);
  CHECK_STATUS(rdmx_mr_reg(b, bbuf, LEN,
                           RDMX_ACCESS_LOCAL_WRITE | RDMX_ACCESS_REMOTE_READ |
                               RDMX_ACCESS_REMOTE_WRITE,
                           &mb),
               RDMX_OK);

  struct acc acc = {NULL, NULL, RDMX_OK};
  CHECK_STATUS(rdmx_listener_new(b, "127.0.0.1:0", &acc.l), RDMX_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)rdmx_listener_port(acc.l));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, accept_one, &acc) == 0);
  rdmx_conn *ca = NULL;
  CHECK_STATUS(rdmx_connect(a, addr, 10000, &ca), RDMX_OK);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK_STATUS(acc.st, RDMX_OK);
  rdmx_conn *cb = acc.c;
  rdmx_remote_region r;
  CHECK(rdmx_conn_remote_region_count(ca) == 1);
  CHECK_STATUS(rdmx_conn_remote_region(ca, 0, &r), RDMX_OK);

  rdmx_completion wc[4];
  /* READ 5000 bytes at offset 11, with the event fd armed. */
  int fd = rdmx_event_fd(ca);
  CHECK(fd >= 0);
  CHECK_STATUS(rdmx_req_notify(ca), RDMX_OK);
  rdmx_sge rd = {(uint64_t)(uintptr_t)abuf, 5000, ma.lkey};
  CHECK_STATUS(rdmx_post_read(ca, &rd, 1, r.addr + 11, r.rkey, 1, 0), RDMX_OK);
  struct pollfd p = {fd, POLLIN, 0};
  CHECK(poll(&p, 1, 5000) == 1);
  CHECK_STATUS(rdmx_event_clear(ca), RDMX_OK);
  CHECK(wait_for(ca, wc, 1) == 1);
  CHECK(wc[0].cookie == 1 && wc[0].status == 0);
  CHECK(memcmp(abuf, bbuf + 11, 5000) == 0);

  /* WRITE 1000 bytes of 0x5a at offset 9000. */
  memset(abuf + 8000, 0x5a, 1000);
  rdmx_sge wr = {(uint64_t)(uintptr_t)(abuf + 8000), 1000, ma.lkey};
  CHECK_STATUS(rdmx_post_write(ca, &wr, 1, r.addr + 9000, r.rkey, 2, 0), RDMX_OK);
  CHECK(wait_for(ca, wc, 1) == 1);
  CHECK(wc[0].cookie == 2 && wc[0].status == 0);
  for (size_t i = 9000; i < 10000; i++) CHECK(bbuf[i] == 0x5a);

  /* SEND with immediate into a posted receive. */
  rdmx_sge rv = {(uint64_t)(uintptr_t)bbuf, 4096, mb.lkey};
  CHECK_STATUS(rdmx_post_recv(cb, &rv, 1, 9), RDMX_OK);
  rdmx_sge sd = {(uint64_t)(uintptr_t)(abuf + 8000), 100, ma.lkey};
  CHECK_STATUS(rdmx_post_send_imm(ca, &sd, 1, 0xabcd, 3, 0), RDMX_OK);
  CHECK(wait_for(ca, wc, 1) == 1);
  CHECK(wc[0].cookie == 3 && wc[0].status == 0);
  CHECK(wait_for(cb, wc, 1) == 1);
  CHECK(wc[0].cookie == 9 && wc[0].status == 0 && wc[0].byte_len == 100);
  CHECK(bbuf[0] == 0x5a && bbuf[99] == 0x5a);

  rdmx_conn_free(ca);
  rdmx_conn_free(cb);
  rdmx_listener_free(acc.l);
  CHECK_STATUS(rdmx_mr_dereg(a, ma.lkey), RDMX_OK);
  CHECK_STATUS(rdmx_mr_dereg(b, mb.lkey), RDMX_OK);
  rdmx_context_free(a);
  rdmx_context_free(b);
  free(abuf);
  free(bbuf);
  CHECK_DONE(strcmp(want, "verbs") == 0 ? "test_provider (verbs)" : "test_provider (soft)");
}
