/* C consumer of the memory API: pools and chunks (exhaustion, double put, foreign
 * pointers, stats, teardown with chunks still out), the registration cache (hits,
 * invalidation), RLIMIT_MEMLOCK refusal, and least privilege through a real connection:
 * a pool exposed read-only is readable by the peer but its WRITE fails REM_ACCESS_ERR. */
#define _DEFAULT_SOURCE
#include <rdmx.h>

#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static rdmx_context *new_context(void) {
  rdmx_config *cfg = NULL;
  rdmx_context *ctx = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "rcache_entries", "4"), RDMX_OK);
  CHECK_STATUS(rdmx_context_new(cfg, &ctx), RDMX_OK);
  rdmx_config_free(cfg);
  return ctx;
}

static void test_pool(rdmx_context *ctx) {
  rdmx_pool *p = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 4096, 600, RDMX_ACCESS_LOCAL_WRITE, &p), RDMX_OK);
  rdmx_pool_stats st;
  CHECK_STATUS(rdmx_pool_get_stats(p, &st), RDMX_OK);
  CHECK(st.chunk_size == 4096 && st.chunks_cap == 600 && st.chunks_in_use == 0 && st.arenas == 1);
  CHECK(st.backing <= RDMX_BACKING_HUGETLB);
  static rdmx_chunk got[600];
  for (int i = 0; i < 600; i++) {
    CHECK_STATUS(rdmx_chunk_get(p, &got[i]), RDMX_OK);
    CHECK(got[i].length == 4096 && got[i].lkey != 0);
    CHECK(((uintptr_t)got[i].addr % 4096) == 0);
    ((uint8_t *)got[i].addr)[0] = (uint8_t)i; /* the memory is really ours */
  }
  rdmx_chunk extra;
  CHECK_STATUS(rdmx_chunk_get(p, &extra), RDMX_FULL);
  CHECK_ERR_HAS("exhausted");
  CHECK_STATUS(rdmx_pool_get_stats(p, &st), RDMX_OK);
  CHECK(st.chunks_in_use == 600 && st.chunks_total == 600 && st.arenas == 2);
  CHECK(st.metadata_bytes * 100 <= st.chunks_total * st.chunk_size); /* <= 1% */
  CHECK_STATUS(rdmx_chunk_put(p, got[7].addr), RDMX_OK);
  CHECK_STATUS(rdmx_chunk_put(p, got[7].addr), RDMX_INVALID_ARGUMENT); /* double put */
  CHECK_ERR_HAS("put");
  CHECK_STATUS(rdmx_chunk_put(p, (uint8_t *)got[8].addr + 16), RDMX_INVALID_ARGUMENT);
  int on_stack;
  CHECK_STATUS(rdmx_chunk_put(p, &on_stack), RDMX_INVALID_ARGUMENT); /* foreign */
  CHECK_STATUS(rdmx_chunk_put(p, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_pool_get_stats(p, &st), RDMX_OK);
  CHECK(st.chunks_in_use == 599); /* the rejected puts changed nothing */
  CHECK_STATUS(rdmx_chunk_get(p, &extra), RDMX_OK);
  CHECK(extra.addr == got[7].addr);
  /* Teardown with chunks still out: must be ASan/valgrind clean. */
  rdmx_pool_free(p);
  rdmx_pool_free(NULL);
  CHECK_STATUS(rdmx_pool_new(NULL, 4096, 1, 0, &p), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_pool_new(ctx, 1000, 1, 0, &p), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("power of two");
  CHECK_STATUS(rdmx_chunk_get(NULL, &extra), RDMX_INVALID_ARGUMENT);
}

static void test_rcache(rdmx_context *ctx) {
  size_t len = 64 * 1024;
  uint8_t *buf = aligned_alloc(4096, len);
  rdmx_mem a, b, c;
  rdmx_rcache_stats rs0, rs;
  CHECK_STATUS(rdmx_mem_cache_stats(ctx, &rs0), RDMX_OK);
  CHECK_STATUS(rdmx_mem_reg(ctx, buf, len, RDMX_ACCESS_LOCAL_WRITE, &a), RDMX_OK);
  CHECK(a.addr <= (uint64_t)(uintptr_t)buf && a.addr + a.length >= (uint64_t)(uintptr_t)buf + len);
  CHECK_STATUS(rdmx_mem_reg(ctx, buf + 4096, 8192, RDMX_ACCESS_LOCAL_WRITE, &b), RDMX_OK);
  CHECK(b.lkey == a.lkey); /* covered: a cache hit */
  CHECK_STATUS(rdmx_mem_cache_stats(ctx, &rs), RDMX_OK);
  CHECK(rs.hits == rs0.hits + 1 && rs.misses == rs0.misses + 1);
  CHECK_STATUS(rdmx_mem_dereg(ctx, &a), RDMX_OK);
  CHECK_STATUS(rdmx_mem_dereg(ctx, &b), RDMX_OK);
  CHECK_STATUS(rdmx_mem_dereg(ctx, &b), RDMX_INVALID_ARGUMENT); /* twice */
  CHECK_ERR_HAS("released twice");
  /* Still cached after release: a hit. */
  CHECK_STATUS(rdmx_mem_reg(ctx, buf, 4096, RDMX_ACCESS_LOCAL_WRITE, &c), RDMX_OK);
  CHECK(c.lkey == a.lkey);
  CHECK_STATUS(rdmx_mem_dereg(ctx, &c), RDMX_OK);
  /* Invalidate before freeing: the next registration is a miss with new keys. */
  CHECK_STATUS(rdmx_mem_invalidate(ctx, buf, len), RDMX_OK);
  CHECK_STATUS(rdmx_mem_reg(ctx, buf, 4096, RDMX_ACCESS_LOCAL_WRITE, &c), RDMX_OK);
  CHECK(c.lkey != a.lkey);
  CHECK_STATUS(rdmx_mem_dereg(ctx, &c), RDMX_OK);
  CHECK_STATUS(rdmx_mem_invalidate(ctx, buf, len), RDMX_OK);
  CHECK_STATUS(rdmx_mem_cache_stats(ctx, &rs), RDMX_OK);
  CHECK(rs.invalidations >= rs0.invalidations + 2);
  CHECK_STATUS(rdmx_mem_reg(ctx, NULL, 10, 0, &c), RDMX_INVALID_ARGUMENT);
  free(buf);
}

/* In a child: a low RLIMIT_MEMLOCK and no privilege to exceed it. */
static int memlock_child(void) {
  struct rlimit rl = {256 * 1024, 256 * 1024};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 2;
  if (getuid() == 0 && setuid(65534) != 0) return 3; /* root could pin past the limit */
  rdmx_context *ctx = new_context();
  size_t len = 4 << 20;
  uint8_t *buf = aligned_alloc(4096, len);
  rdmx_mem m;
  CHECK_STATUS(rdmx_mem_reg(ctx, buf, len, RDMX_ACCESS_LOCAL_WRITE, &m), RDMX_RESOURCE_LIMIT);
  CHECK_ERR_HAS("RLIMIT_MEMLOCK");
  rdmx_mr mr;
  CHECK_STATUS(rdmx_mr_reg(ctx, buf, len, RDMX_ACCESS_LOCAL_WRITE, &mr), RDMX_RESOURCE_LIMIT);
  CHECK_STATUS(rdmx_mr_reg(ctx, buf, 64 * 1024, RDMX_ACCESS_LOCAL_WRITE, &mr), RDMX_OK); /* fits */
  CHECK_STATUS(rdmx_mr_dereg(ctx, mr.lkey), RDMX_OK);
  rdmx_pool *p = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 1 << 20, 4, RDMX_ACCESS_LOCAL_WRITE, &p), RDMX_RESOURCE_LIMIT);
  rdmx_context_free(ctx);
  free(buf);
  printf("memlock child: %d checks, %d failed\n", check_count, check_failures);
  fflush(stdout);
  return check_failures == 0 ? 0 : 1;
}

static void test_memlock(void) {
#if defined(__SANITIZE_ADDRESS__)
  /* ASan intercepts mlock as a no-op: this case runs in the valgrind pass. */
  printf("test_mem: RLIMIT_MEMLOCK case skipped under ASan (mlock is intercepted)\n");
  return;
#endif
  fflush(stdout); /* the child must not repeat buffered output */
  pid_t pid = fork();
  if (pid == 0) _exit(memlock_child());
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Least privilege through a connection: the server exposes a pool read-only. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static size_t wait_for(rdmx_conn *c, rdmx_completion *out, size_t want) {
  size_t got = 0;
  double end = now_s() + 10.0;
  while (got < want && now_s() < end) {
    size_t n = 0;
    if (rdmx_poll(c, out + got, want - got, &n) != RDMX_OK) break;
    got += n;
  }
  return got;
}

static int server(int port_fd) {
  rdmx_context *ctx = new_context();
  rdmx_pool *p = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 4096, 16, RDMX_ACCESS_REMOTE_READ, &p), RDMX_OK);
  rdmx_chunk ch;
  CHECK_STATUS(rdmx_chunk_get(p, &ch), RDMX_OK);
  /* A read-only pool's memory is still ours to fill locally. */
  for (int i = 0; i < 4096; i++) ((uint8_t *)ch.addr)[i] = (uint8_t)(i * 7);
  rdmx_listener *l = NULL;
  CHECK_STATUS(rdmx_listener_new(ctx, "127.0.0.1:0", &l), RDMX_OK);
  uint16_t port = rdmx_listener_port(l);
  CHECK(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
  CHECK(write(port_fd, &ch, sizeof ch) == (ssize_t)sizeof ch);
  close(port_fd);
  rdmx_conn *c = NULL;
  CHECK_STATUS(rdmx_listener_accept(l, 20000, &c), RDMX_OK);
  /* Wait for the client to go (its side channel closes: our receive is flushed). */
  rdmx_pool *rp = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 4096, 1, RDMX_ACCESS_LOCAL_WRITE, &rp), RDMX_OK);
  rdmx_chunk rc;
  CHECK_STATUS(rdmx_chunk_get(rp, &rc), RDMX_OK);
  rdmx_sge r = {(uint64_t)(uintptr_t)rc.addr, 4096, rc.lkey};
  CHECK_STATUS(rdmx_post_recv(c, &r, 1, 1), RDMX_OK);
  rdmx_completion wc[1];
  CHECK(wait_for(c, wc, 1) == 1 && wc[0].status == 5);
  for (int i = 0; i < 4096; i++)
    if (((uint8_t *)ch.addr)[i] != (uint8_t)(i * 7)) { CHECK(!"read-only chunk was written"); break; }
  rdmx_conn_free(c);
  rdmx_listener_free(l);
  rdmx_pool_free(rp);
  rdmx_pool_free(p);
  rdmx_context_free(ctx);
  printf("server: %d checks, %d failed\n", check_count, check_failures);
  fflush(stdout);
  return check_failures == 0 ? 0 : 1;
}

static void test_least_privilege(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(server(fds[1]));
  }
  close(fds[1]);
  uint16_t port = 0;
  rdmx_chunk theirs;
  CHECK(read(fds[0], &port, sizeof port) == (ssize_t)sizeof port);
  CHECK(read(fds[0], &theirs, sizeof theirs) == (ssize_t)sizeof theirs);
  close(fds[0]);
  rdmx_context *ctx = new_context();
  rdmx_pool *p = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 4096, 4, RDMX_ACCESS_LOCAL_WRITE, &p), RDMX_OK);
  rdmx_chunk mine;
  CHECK_STATUS(rdmx_chunk_get(p, &mine), RDMX_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
  rdmx_conn *c = NULL;
  CHECK_STATUS(rdmx_connect(ctx, addr, 10000, &c), RDMX_OK);
  rdmx_remote_region rr;
  CHECK(rdmx_conn_remote_region_count(c) == 1);
  CHECK_STATUS(rdmx_conn_remote_region(c, 0, &rr), RDMX_OK);
  CHECK(rr.access == RDMX_ACCESS_REMOTE_READ && rr.rkey == theirs.rkey);
  rdmx_sge s = {(uint64_t)(uintptr_t)mine.addr, 4096, mine.lkey};
  rdmx_completion wc[1];
  CHECK_STATUS(rdmx_post_read(c, &s, 1, (uint64_t)(uintptr_t)theirs.addr, theirs.rkey, 1, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1 && wc[0].status == 0);
  for (int i = 0; i < 4096; i++)
    if (((uint8_t *)mine.addr)[i] != (uint8_t)(i * 7)) { CHECK(!"READ bytes differ"); break; }
  CHECK_STATUS(rdmx_post_write(c, &s, 1, (uint64_t)(uintptr_t)theirs.addr, theirs.rkey, 2, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1 && wc[0].cookie == 2 && wc[0].status == 10); /* REM_ACCESS_ERR */
  rdmx_conn_free(c);
  rdmx_pool_free(p);
  rdmx_context_free(ctx);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void) {
  rdmx_context *ctx = new_context();
  test_pool(ctx);
  test_rcache(ctx);
  rdmx_context_free(ctx);
  test_memlock();
  test_least_privilege();
  CHECK_DONE("test_mem (C)");
}
