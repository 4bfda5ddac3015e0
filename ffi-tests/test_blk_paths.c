/* C consumer of the multipath block client (rdmx_blk_open_paths, docs/failover.md): starts
 * two rdmx-target processes (argv[1], the binary) exporting one file volume, opens it over
 * both, writes and reads back 256 blocks at queue depth 8 while the first target is
 * SIGKILLed mid-IO, and checks that no IO failed, every block holds its last write, and
 * the path counters tell what happened. Bad arguments are refused with a status and a
 * message. */
#define _DEFAULT_SOURCE
#include <rdmx.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "check.h"

#define BS 4096u
#define BLOCKS 256u
#define QD 8u

static char dir[] = "/tmp/rdmx-blk-paths-XXXXXX";
static char volpath[300];

/* Starts `bin` serving volpath as v0; its pid in *pid, its address in addr. 0 on success. */
static int start_target(const char *bin, int n, pid_t *pid, char *addr, size_t cap) {
  char logpath[320], vol[340];
  snprintf(logpath, sizeof(logpath), "%s/target%d.log", dir, n);
  snprintf(vol, sizeof(vol), "v0=file:%s", volpath);
  pid_t p = fork();
  if (p < 0) return -1;
  if (p == 0) {
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    /* handshake_first_bytes_ms: under valgrind the client's first auth frame can take
     * longer than the default 500 ms, and the target drops it (CI: "the peer closed the
     * connection (0 bytes of an auth frame received)"), as test_blk_acl's target. */
    execl(bin, bin, "--listen", "127.0.0.1:0", "--volume", vol, "--set", "timeout=18", "--set",
          "msgr_keepalive_timeout_ms=60000", "--set", "handshake_first_bytes_ms=10000",
          (char *)NULL);
    _exit(127);
  }
  *pid = p;
  for (int i = 0; i < 300; i++) {
    FILE *f = fopen(logpath, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
      const char *key = "rdmx-target listening on ";
      char *at = strstr(line, key);
      if (at) {
        at += strlen(key);
        size_t len = strcspn(at, " \n");
        if (len >= cap) len = cap - 1;
        memcpy(addr, at, len);
        addr[len] = '\0';
        fclose(f);
        return 0;
      }
    }
    if (f) fclose(f);
    int st;
    if (waitpid(p, &st, WNOHANG) == p) {
      fprintf(stderr, "rdmx-target exited (see %s)\n", logpath);
      return -1;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "rdmx-target did not start within 30 s\n");
  kill(p, SIGKILL);
  waitpid(p, NULL, 0);
  return -1;
}

static uint8_t pattern(uint32_t block, uint32_t version, uint32_t i) {
  return (uint8_t)((block * 131u) ^ (version * 7919u) ^ i ^ (i >> 8));
}

/* Writes every block with `version` (killing `victim` after `kill_after` completions if it
 * is > 0), then reads every block back and checks it. Returns the IO errors seen. */
static unsigned run(rdmx_blk *b, uint8_t *buf, uint32_t version, pid_t *victim, unsigned kill_after) {
  unsigned errors = 0, done = 0, next = 0;
  rdmx_blk_completion wc[QD];
  for (int pass = 0; pass < 2; pass++) {
    next = 0;
    done = 0;
    for (uint32_t blk = 0; blk < BLOCKS && pass == 0; blk++)
      for (uint32_t i = 0; i < BS; i++) buf[blk * BS + i] = pattern(blk, version, i);
    if (pass == 1) memset(buf, 0xee, (size_t)BLOCKS * BS);
    time_t end = time(NULL) + 60;
    while (done < BLOCKS && time(NULL) < end) {
      while (next < BLOCKS && rdmx_blk_inflight(b) < QD) {
        rdmx_blk_req r = {pass == 0 ? RDMX_BLK_WRITE : RDMX_BLK_READ, BS, (uint64_t)next * BS,
                          buf + (size_t)next * BS, next};
        size_t k = 0;
        rdmx_status s = rdmx_blk_submit(b, &r, 1, &k);
        CHECK_STATUS(s, RDMX_OK);
        if (s != RDMX_OK || k != 1) break;
        next++;
      }
      size_t got = 0;
      CHECK_STATUS(rdmx_blk_poll(b, wc, QD, 1, 100, &got), RDMX_OK);
      for (size_t i = 0; i < got; i++) {
        done++;
        if (wc[i].status != 0) {
          errors++;
          fprintf(stderr, "block %llu: status %d\n", (unsigned long long)wc[i].cookie,
                  wc[i].status);
        }
      }
      if (pass == 0 && kill_after && done >= kill_after && *victim > 0) {
        kill(*victim, SIGKILL);
        waitpid(*victim, NULL, 0);
        *victim = -1;
      }
    }
    CHECK(done == BLOCKS);
  }
  unsigned bad = 0;
  for (uint32_t blk = 0; blk < BLOCKS; blk++)
    for (uint32_t i = 0; i < BS; i++)
      if (buf[blk * BS + i] != pattern(blk, version, i)) {
        bad++;
        break;
      }
  CHECK(bad == 0);
  return errors;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/rdmx-target\n", argv[0]);
    return 2;
  }
  /* Bad arguments, before any target. */
  rdmx_blk *b = NULL;
  const char *two[2] = {"127.0.0.1:1", NULL};
  CHECK_STATUS(rdmx_blk_open_paths(NULL, two, 0, "v0", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("addresses");
  CHECK_STATUS(rdmx_blk_open_paths(NULL, NULL, 2, "v0", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_blk_open_paths(NULL, two, 2, "v0", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("addrs[1]");
  two[1] = "not an address";
  CHECK_STATUS(rdmx_blk_open_paths(NULL, two, 2, "v0", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("not an address");
  two[1] = "127.0.0.1:1";
  CHECK_STATUS(rdmx_blk_open_paths(NULL, two, 2, "v0", RDMX_BLK_MODE_READ, 0, &b), RDMX_UNSUPPORTED);
  CHECK_STATUS(rdmx_blk_open_paths(NULL, two, 2, "v0", RDMX_BLK_MODE_RPC, 0, NULL), RDMX_INVALID_ARGUMENT);
  CHECK(b == NULL);
  CHECK(rdmx_blk_path_count(NULL) == 0);
  rdmx_blk_path p = {.struct_size = sizeof(p)};
  CHECK_STATUS(rdmx_blk_get_path(NULL, 0, &p), RDMX_INVALID_ARGUMENT);
  rdmx_blk_path_event ev = {.struct_size = sizeof(ev)};
  CHECK_STATUS(rdmx_blk_next_path_event(NULL, &ev), RDMX_INVALID_ARGUMENT);

  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(volpath, sizeof(volpath), "%s/vol.img", dir);
  int fd = open(volpath, O_RDWR | O_CREAT, 0600);
  CHECK(fd >= 0 && ftruncate(fd, 4 << 20) == 0);
  if (fd >= 0) close(fd);
  pid_t pids[2] = {-1, -1};
  char addrs[2][128];
  int started = start_target(argv[1], 0, &pids[0], addrs[0], sizeof(addrs[0])) == 0 &&
                start_target(argv[1], 1, &pids[1], addrs[1], sizeof(addrs[1])) == 0;
  CHECK(started);
  uint8_t *buf = aligned_alloc(BS, (size_t)BLOCKS * BS);
  CHECK(buf != NULL);
  if (started && buf) {
    rdmx_config *cfg = NULL;
    CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
    /* valgrind: as test_blk (run.sh). */
    CHECK_STATUS(rdmx_config_set(cfg, "timeout", "18"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_timeout_ms", "60000"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "blk_path_policy", "sideways"), RDMX_INVALID_VALUE);
    const char *list[2] = {addrs[0], addrs[1]};
    CHECK_STATUS(rdmx_blk_open_paths(cfg, list, 2, "nope", RDMX_BLK_MODE_RPC, 10000, &b),
                 RDMX_INVALID_ARGUMENT);
    CHECK_ERR_HAS("no path opened it");
    CHECK_STATUS(rdmx_blk_open_paths(cfg, list, 2, "v0", RDMX_BLK_MODE_RPC, 10000, &b), RDMX_OK);
    if (b) {
      CHECK(rdmx_blk_path_count(b) == 2);
      CHECK(rdmx_blk_event_fd(b) == -1);
      rdmx_blk_volume v;
      CHECK_STATUS(rdmx_blk_info(b, &v), RDMX_OK);
      CHECK(v.size == 4u << 20 && v.block_size == 4096);
      CHECK_STATUS(rdmx_blk_mem_register(b, buf, (size_t)BLOCKS * BS), RDMX_OK);
      CHECK_STATUS(rdmx_blk_get_path(b, 2, &p), RDMX_INVALID_ARGUMENT);
      CHECK_ERR_HAS("2 paths");
      CHECK_STATUS(rdmx_blk_get_path(b, 0, &p), RDMX_OK);
      CHECK(p.struct_size == sizeof(p));
      CHECK(p.active == 1);

      CHECK(run(b, buf, 1, &pids[0], 0) == 0);
      /* The first target dies with IO in flight: no error reaches the application. */
      CHECK(run(b, buf, 2, &pids[0], 40) == 0);
      CHECK(pids[0] == -1);

      rdmx_blk_path p0 = {.struct_size = sizeof(p0)}, p1 = {.struct_size = sizeof(p1)};
      CHECK_STATUS(rdmx_blk_get_path(b, 0, &p0), RDMX_OK);
      CHECK_STATUS(rdmx_blk_get_path(b, 1, &p1), RDMX_OK);
      CHECK(p0.state != RDMX_BLK_PATH_UP);
      CHECK(p0.failures >= 1);
      CHECK(p0.active == 0);
      CHECK(p1.state == RDMX_BLK_PATH_UP && p1.active == 1);
      CHECK(p1.issued > 0);
      rdmx_blk_counters k = {.struct_size = sizeof(k)};
      CHECK_STATUS(rdmx_blk_get_counters(b, &k), RDMX_OK);
      CHECK(k.io_timeouts == 0);
      /* Every re-issue left the dead path and went to the surviving one. */
      CHECK(k.reissued == p1.reissued);
      CHECK(k.reissued == p0.failed_over);
      /* The path events, oldest first: path 0 went down (with why), path 1 took the IO. */
      CHECK_STATUS(rdmx_blk_next_path_event(b, NULL), RDMX_INVALID_ARGUMENT);
      rdmx_blk_path_event e0 = {.struct_size = 0};
      CHECK_STATUS(rdmx_blk_next_path_event(b, &e0), RDMX_INVALID_ARGUMENT);
      CHECK_ERR_HAS("struct_size");
      int down0 = 0, active1_after_down = 0, events = 0;
      for (; events < 64; events++) {
        rdmx_blk_path_event e = {.struct_size = sizeof(e)};
        CHECK_STATUS(rdmx_blk_next_path_event(b, &e), RDMX_OK);
        CHECK(e.struct_size == sizeof(e));
        if (e.kind == RDMX_BLK_PATH_EVENT_NONE) break;
        CHECK(e.path < 2);
        CHECK(e.reason[sizeof(e.reason) - 1] == 0);
        if (e.kind == RDMX_BLK_PATH_EVENT_DOWN && e.path == 0) {
          down0 = 1;
          CHECK(e.reason[0] != 0);
        }
        if (e.kind == RDMX_BLK_PATH_EVENT_ACTIVE && e.path == 1 && down0) active1_after_down = 1;
        if (e.kind != RDMX_BLK_PATH_EVENT_DOWN) CHECK(e.reason[0] == 0);
      }
      CHECK(events < 64);
      CHECK(down0 && active1_after_down);
      rdmx_blk_path_event none = {.struct_size = sizeof(none)};
      CHECK_STATUS(rdmx_blk_next_path_event(b, &none), RDMX_OK);
      CHECK(none.kind == RDMX_BLK_PATH_EVENT_NONE);
      printf("test_blk_paths: path 0 down after %llu us without a completion; %llu IOs "
             "re-issued\n",
             (unsigned long long)p0.last_detect_us, (unsigned long long)k.reissued);
      rdmx_blk_free(b);
    }
    rdmx_config_free(cfg);
  }
  free(buf);
  for (int i = 0; i < 2; i++)
    if (pids[i] > 0) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
    }
  char logpath[320];
  for (int i = 0; i < 2; i++) {
    snprintf(logpath, sizeof(logpath), "%s/target%d.log", dir, i);
    unlink(logpath);
  }
  unlink(volpath);
  rmdir(dir);
  CHECK_DONE("test_blk_paths (C)");
}
