/* Access control at rdmx-target through the C ABI (issue 27): the target run by run.sh has
 * `--keyring DIR/server --allow v0=client.ro:ro,client.rw:rw` and the keyrings DIR/ro,
 * DIR/rw, DIR/none (client.none: a valid key, no grant) and DIR/wrong (client.ro with
 * another key). Checks: a wrong key and an entity without a grant get RDMX_AUTH with a
 * clear rdmx_last_error(); a read-only grant reads and its writes complete -EACCES (RPC
 * and one-sided modes); a read-write grant writes. Usage: test_blk_acl ADDR:PORT DIR */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* A config authenticating as `entity` with the keyring DIR/name. */
static rdmx_config *config_as(const char *dir, const char *name, const char *entity) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "auth_keyring", path), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "auth_entity", entity), RDMX_OK);
  /* valgrind runs everything ~30x slower: room for each auth frame and keepalive. */
  CHECK_STATUS(rdmx_config_set(cfg, "handshake_first_bytes_ms", "10000"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "timeout", "18"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_timeout_ms", "60000"), RDMX_OK);
  return cfg;
}

/* One request on `b`, waited for; its completion status (1 if none came). */
static int32_t one(rdmx_blk *b, uint32_t op, uint8_t *buf) {
  rdmx_blk_req r = {op, 4096, 0, buf, 9};
  size_t took = 0;
  CHECK_STATUS(rdmx_blk_submit(b, &r, 1, &took), RDMX_OK);
  if (took != 1) return 1;
  rdmx_blk_completion c;
  size_t n = 0;
  for (int i = 0; i < 300 && n == 0; i++) {
    CHECK_STATUS(rdmx_blk_poll(b, &c, 1, 1, 100, &n), RDMX_OK);
  }
  CHECK(n == 1);
  return n == 1 ? c.status : 1;
}

/* Opens v0 as `entity` with keyring `name` in `mode`; NULL (and the status checked) when
 * `want` is not RDMX_OK. */
static rdmx_blk *open_as(const char *addr, const char *dir, const char *name, const char *entity,
                         uint32_t mode, rdmx_status want) {
  rdmx_config *cfg = config_as(dir, name, entity);
  rdmx_blk *b = NULL;
  CHECK_STATUS(rdmx_blk_open(cfg, addr, "v0", mode, 30000, &b), want);
  rdmx_config_free(cfg);
  return b;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TARGET_ADDR:PORT KEYRING_DIR\n", argv[0]);
    return 2;
  }
  const char *addr = argv[1], *dir = argv[2];
  uint8_t *buf = aligned_alloc(4096, 4096);
  CHECK(buf != NULL);
  if (buf == NULL) CHECK_DONE("test_blk_acl (C)");

  /* A wrong key for a granted entity: refused at authentication. */
  CHECK(open_as(addr, dir, "wrong", "client.ro", RDMX_BLK_MODE_RPC, RDMX_AUTH) == NULL);
  CHECK_ERR_HAS("authentication failed");
  /* A valid key, no grant on v0: refused at open, the reason named. */
  CHECK(open_as(addr, dir, "none", "client.none", RDMX_BLK_MODE_RPC, RDMX_AUTH) == NULL);
  CHECK_ERR_HAS("Permission denied");
  CHECK_ERR_HAS("--allow");

  /* Read-write: writes a pattern. */
  rdmx_blk *rw = open_as(addr, dir, "rw", "client.rw", RDMX_BLK_MODE_RPC, RDMX_OK);
  if (rw) {
    memset(buf, 0x5a, 4096);
    CHECK(one(rw, RDMX_BLK_WRITE, buf) == 0);
  }
  /* Read-only, through the target and one-sided: reads the pattern, writes -EACCES. */
  uint32_t modes[2] = {RDMX_BLK_MODE_RPC, RDMX_BLK_MODE_READ};
  for (int m = 0; m < 2; m++) {
    rdmx_blk *ro = open_as(addr, dir, "ro", "client.ro", modes[m], RDMX_OK);
    if (!ro) continue;
    memset(buf, 0, 4096);
    CHECK(one(ro, RDMX_BLK_READ, buf) == 0);
    CHECK(buf[0] == 0x5a && buf[4095] == 0x5a);
    memset(buf, 0x11, 4096);
    CHECK(one(ro, RDMX_BLK_WRITE, buf) == -EACCES);
    rdmx_blk_free(ro);
  }
  /* The refused writes changed nothing. */
  if (rw) {
    memset(buf, 0, 4096);
    CHECK(one(rw, RDMX_BLK_READ, buf) == 0);
    CHECK(buf[0] == 0x5a && buf[4095] == 0x5a);
    rdmx_blk_free(rw);
  }
  free(buf);
  CHECK_DONE("test_blk_acl (C)");
}
