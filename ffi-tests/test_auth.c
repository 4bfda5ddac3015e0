/* Side-channel authentication through the C ABI: keyrings via rdmx_config_set
 * ("auth_keyring", "auth_entity"), a connection with the right key, RDMX_AUTH with a clear
 * rdmx_last_error() for a wrong key and for a client without one, the listener's counters
 * (rdmx_listener_counters), and a keyring that others may read refused at context
 * creation. One process: the listener accepts on a thread of its own. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static const char *K1 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
static const char *K2 = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

static void write_keyring(const char *path, const char *entity, const char *key, mode_t mode) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fprintf(f, "[%s]\n    key = %s\n", entity, key);
  fclose(f);
  CHECK(chmod(path, mode) == 0);
}

/* A context with `keyring` (NULL = none) as `entity`; NULL and the status in *st on failure. */
static rdmx_context *new_context(const char *keyring, const char *entity, rdmx_status *st) {
  rdmx_config *cfg = NULL;
  rdmx_context *ctx = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "auth_entity", entity), RDMX_OK);
  /* valgrind runs everything ~30x slower: room for each auth frame. */
  CHECK_STATUS(rdmx_config_set(cfg, "handshake_first_bytes_ms", "10000"), RDMX_OK);
  if (keyring) CHECK_STATUS(rdmx_config_set(cfg, "auth_keyring", keyring), RDMX_OK);
  *st = rdmx_context_new(cfg, &ctx);
  rdmx_config_free(cfg);
  return ctx;
}

struct acceptor {
  rdmx_listener *l;
  atomic_int stop;
  atomic_int accepted;
};

static void *accept_loop(void *arg) {
  struct acceptor *a = arg;
  while (!atomic_load(&a->stop)) {
    rdmx_conn *c = NULL;
    rdmx_status st = rdmx_listener_accept(a->l, 50, &c);
    if (st == RDMX_OK) {
      atomic_fetch_add(&a->accepted, 1);
      rdmx_conn_free(c);
    }
  }
  return NULL;
}

int main(void) {
  char dir[] = "/tmp/rdmx-test-auth-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char server_ring[128], good_ring[128], bad_ring[128], open_ring[128];
  snprintf(server_ring, sizeof server_ring, "%s/server", dir);
  snprintf(good_ring, sizeof good_ring, "%s/good", dir);
  snprintf(bad_ring, sizeof bad_ring, "%s/bad", dir);
  snprintf(open_ring, sizeof open_ring, "%s/open", dir);
  write_keyring(server_ring, "client.fio", K1, 0600);
  write_keyring(good_ring, "client.fio", K1, 0600);
  write_keyring(bad_ring, "client.fio", K2, 0600);
  write_keyring(open_ring, "client.fio", K1, 0644);

  CHECK_STREQ(rdmx_status_str(RDMX_AUTH), "RDMX_AUTH");

  /* A keyring that others may read is refused, saying what to do. */
  rdmx_status st;
  rdmx_context *bad_ctx = new_context(open_ring, "client.fio", &st);
  CHECK(bad_ctx == NULL);
  CHECK_STATUS(st, RDMX_AUTH);
  CHECK_ERR_HAS("chmod 600");

  rdmx_context *server = new_context(server_ring, "osd.0", &st);
  CHECK_STATUS(st, RDMX_OK);
  rdmx_context *good = new_context(good_ring, "client.fio", &st);
  CHECK_STATUS(st, RDMX_OK);
  rdmx_context *bad = new_context(bad_ring, "client.fio", &st);
  CHECK_STATUS(st, RDMX_OK);
  rdmx_context *none = new_context(NULL, "client.fio", &st);
  CHECK_STATUS(st, RDMX_OK);
  if (!server || !good || !bad || !none) return 1;

  struct acceptor a = {.l = NULL};
  atomic_init(&a.stop, 0);
  atomic_init(&a.accepted, 0);
  CHECK_STATUS(rdmx_listener_new(server, "127.0.0.1:0", &a.l), RDMX_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)rdmx_listener_port(a.l));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, accept_loop, &a) == 0);

  /* The right key. */
  rdmx_conn *c = NULL;
  CHECK_STATUS(rdmx_connect(good, addr, 60000, &c), RDMX_OK);
  /* Held until the server accepted it (accept fails a connection whose peer left). */
  for (int i = 0; i < 3000 && atomic_load(&a.accepted) == 0; i++)
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 10000000}, NULL);
  CHECK(atomic_load(&a.accepted) == 1);
  rdmx_conn_free(c);

  /* A wrong key: RDMX_AUTH, and the server counts it. */
  c = NULL;
  CHECK_STATUS(rdmx_connect(bad, addr, 60000, &c), RDMX_AUTH);
  CHECK_ERR_HAS("authentication failed");
  CHECK(c == NULL);

  /* No key at all. */
  CHECK_STATUS(rdmx_connect(none, addr, 60000, &c), RDMX_AUTH);
  CHECK_ERR_HAS("requires authentication");

  rdmx_handshake_counters k = {.struct_size = sizeof k};
  int tries = 0;
  do {
    CHECK_STATUS(rdmx_listener_counters(a.l, &k), RDMX_OK);
    if (k.auth_failures >= 2) break;
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 10000000}, NULL);
  } while (++tries < 3000);
  CHECK(k.auth_failures == 2);
  CHECK(k.passed == 1);
  CHECK_STATUS(rdmx_listener_counters(NULL, &k), RDMX_INVALID_ARGUMENT);

  atomic_store(&a.stop, 1);
  pthread_join(t, NULL);
  CHECK(atomic_load(&a.accepted) == 1);
  rdmx_listener_free(a.l);
  rdmx_context_free(none);
  rdmx_context_free(bad);
  rdmx_context_free(good);
  rdmx_context_free(server);
  unlink(server_ring);
  unlink(good_ring);
  unlink(bad_ring);
  unlink(open_ring);
  rmdir(dir);
  CHECK_DONE("test_auth (C)");
}
