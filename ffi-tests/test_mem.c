/* C consumer of the memory API: pools and chunks (exhaustion, double put, foreign
 * pointers, stats, teardown with chunks still out), the registration cache (hits,
 * invalidation), RLIMIT_MEMLOCK refusal, and least privilege through a real connection:
 * a pool exposed read-only is readable by the peer but its WRITE fails REM_ACCESS_ERR.
 *
 *   test_mem                   everything; the server and the RLIMIT_MEMLOCK case are
 *                              forked children (soft provider)
 *   test_mem server FILE       the read-only pool's server alone; writes
 *                              "127.0.0.1:PORT ADDR RKEY" to FILE
 *   test_mem client FILE       pools, cache, and the connection to that server
 *   test_mem memlock           the RLIMIT_MEMLOCK case alone (lowers this process's limit)
 *
 * Separate processes serve provider=verbs under `rdmx-ibv exec`, where a forked child
 * cannot share its parent's device (one address, RoCEv2's UDP port 4791, per process). */
#define _DEFAULT_SOURCE
#include <rdmx.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "conn_wait.h"

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
  rdmx_pool_stats st = {.struct_size = sizeof st};
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
  rdmx_rcache_stats rs0 = {.struct_size = sizeof rs0}, rs = {.struct_size = sizeof rs};
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
static int server(int port_fd, const char *file) {
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
  if (file == NULL) {
    CHECK(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
    CHECK(write(port_fd, &ch, sizeof ch) == (ssize_t)sizeof ch);
    close(port_fd);
  } else {
    /* FILE.tmp, then renamed: the client never reads a partial line. */
    char tmp[4096];
    CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", file) < (int)sizeof tmp);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (f != NULL) {
      fprintf(f, "127.0.0.1:%u %" PRIxPTR " %" PRIx32 "\n", (unsigned)port, (uintptr_t)ch.addr, ch.rkey);
      CHECK(fclose(f) == 0);
      CHECK(rename(tmp, file) == 0);
    }
  }
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
  /* Free only once the client closed: the NAK of its WRITE must reach it before our EOF. */
  wait_peer_gone(c, &r);
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

/* The client side of the least-privilege case: `addr` serves a read-only chunk of 4096
 * bytes at `theirs_addr` with `theirs_rkey`. */
static void least_privilege_client(const char *addr, uint64_t theirs_addr, uint32_t theirs_rkey);

static void test_least_privilege(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(server(fds[1], NULL));
  }
  close(fds[1]);
  uint16_t port = 0;
  rdmx_chunk theirs;
  CHECK(read(fds[0], &port, sizeof port) == (ssize_t)sizeof port);
  CHECK(read(fds[0], &theirs, sizeof theirs) == (ssize_t)sizeof theirs);
  close(fds[0]);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
  least_privilege_client(addr, (uint64_t)(uintptr_t)theirs.addr, theirs.rkey);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void least_privilege_client(const char *addr, uint64_t theirs_addr, uint32_t theirs_rkey) {
  rdmx_context *ctx = new_context();
  rdmx_pool *p = NULL;
  CHECK_STATUS(rdmx_pool_new(ctx, 4096, 4, RDMX_ACCESS_LOCAL_WRITE, &p), RDMX_OK);
  rdmx_chunk mine;
  CHECK_STATUS(rdmx_chunk_get(p, &mine), RDMX_OK);
  rdmx_conn *c = NULL;
  CHECK_STATUS(rdmx_connect(ctx, addr, 10000, &c), RDMX_OK);
  rdmx_remote_region rr;
  CHECK(rdmx_conn_remote_region_count(c) == 1);
  CHECK_STATUS(rdmx_conn_remote_region(c, 0, &rr), RDMX_OK);
  CHECK(rr.access == RDMX_ACCESS_REMOTE_READ && rr.rkey == theirs_rkey);
  rdmx_sge s = {(uint64_t)(uintptr_t)mine.addr, 4096, mine.lkey};
  rdmx_completion wc[1];
  CHECK_STATUS(rdmx_post_read(c, &s, 1, theirs_addr, theirs_rkey, 1, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1 && wc[0].status == 0);
  for (int i = 0; i < 4096; i++)
    if (((uint8_t *)mine.addr)[i] != (uint8_t)(i * 7)) { CHECK(!"READ bytes differ"); break; }
  CHECK_STATUS(rdmx_post_write(c, &s, 1, theirs_addr, theirs_rkey, 2, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1 && wc[0].cookie == 2 && wc[0].status == 10); /* REM_ACCESS_ERR */
  rdmx_conn_free(c);
  rdmx_pool_free(p);
  rdmx_context_free(ctx);
}

/* Reads "ADDR HEXADDR HEXRKEY" from `file`, waiting up to 60 s for the server to write it. */
static int read_server_file(const char *file, char *addr, size_t len, uint64_t *raddr, uint32_t *rkey) {
  for (int i = 0; i < 1200; i++) {
    FILE *f = fopen(file, "r");
    if (f != NULL) {
      char a[64];
      uintptr_t x = 0;
      uint32_t k = 0;
      int n = fscanf(f, "%63s %" SCNxPTR " %" SCNx32, a, &x, &k);
      fclose(f);
      if (n == 3 && strlen(a) < len) {
        strcpy(addr, a);
        *raddr = (uint64_t)x;
        *rkey = k;
        return 1;
      }
    }
    struct timespec pause = {0, 50000000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "no server line in %s after 60 s\n", file);
  return 0;
}

int main(int argc, char **argv) {
  const char *want = getenv("RDMX_PROVIDER");
  if (argc == 3 && strcmp(argv[1], "server") == 0) {
    int rc = server(-1, argv[2]);
    return rc == 0 && check_failures == 0 ? 0 : 1;
  }
  if (argc == 2 && strcmp(argv[1], "memlock") == 0) {
#if defined(__SANITIZE_ADDRESS__)
    printf("test_mem: RLIMIT_MEMLOCK case skipped under ASan (mlock is intercepted)\n");
    return 0;
#else
    return memlock_child();
#endif
  }
  int client_only = argc == 3 && strcmp(argv[1], "client") == 0;
  if (argc != 1 && !client_only) {
    fprintf(stderr, "usage: %s [server FILE | client FILE | memlock]\n", argv[0]);
    return 2;
  }
  rdmx_context *ctx = new_context();
  CHECK_STREQ(rdmx_context_provider(ctx), want ? want : "soft");
  test_pool(ctx);
  test_rcache(ctx);
  rdmx_context_free(ctx);
  if (client_only) {
    char addr[64];
    uint64_t raddr = 0;
    uint32_t rkey = 0;
    CHECK(read_server_file(argv[2], addr, sizeof addr, &raddr, &rkey));
    if (check_failures == 0) least_privilege_client(addr, raddr, rkey);
  } else {
    test_memlock();
    test_least_privilege();
  }
  CHECK_DONE("test_mem (C)");
}
