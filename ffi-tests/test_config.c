/* C consumer of rdmx.h: every entry point, NULL arguments, invalid values, messages. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

#ifndef RDMX_EXPECTED_VERSION
#error "build with -DRDMX_EXPECTED_VERSION=\"$(pkg-config --modversion rdmx)\""
#endif

/* docs/rc-transport.md §4.4, in microseconds x 100 (0.01 ms units). */
static const uint64_t RNR_TABLE_10US[32] = {
    65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,
    48,    64,  96,  128, 192,  256,  384,  512,  768,  1024, 1536,
    2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};

static char get_buf[256];

static const char *get(rdmx_config *cfg, const char *key) {
  size_t n = 0;
  get_buf[0] = '\0';
  if (rdmx_config_get(cfg, key, get_buf, sizeof get_buf, &n) != RDMX_OK) {
    fprintf(stderr, "get %s failed: %s\n", key, rdmx_last_error());
    return "(error)";
  }
  CHECK(n == strlen(get_buf));
  return get_buf;
}

static rdmx_config *new_config(void) {
  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK(cfg != NULL);
  return cfg;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void test_version_and_status(void) {
  CHECK_STREQ(rdmx_version(), RDMX_EXPECTED_VERSION);
  CHECK_STREQ(rdmx_status_str(RDMX_OK), "RDMX_OK");
  CHECK_STREQ(rdmx_status_str(RDMX_INVALID_ARGUMENT), "RDMX_INVALID_ARGUMENT");
  CHECK_STREQ(rdmx_status_str(RDMX_UNKNOWN_KEY), "RDMX_UNKNOWN_KEY");
  CHECK_STREQ(rdmx_status_str(RDMX_INVALID_VALUE), "RDMX_INVALID_VALUE");
  CHECK_STREQ(rdmx_status_str(RDMX_CONFLICT), "RDMX_CONFLICT");
  CHECK_STREQ(rdmx_status_str(RDMX_PARSE_ERROR), "RDMX_PARSE_ERROR");
  CHECK_STREQ(rdmx_status_str(RDMX_IO_ERROR), "RDMX_IO_ERROR");
  CHECK_STREQ(rdmx_status_str(RDMX_BUFFER_TOO_SMALL), "RDMX_BUFFER_TOO_SMALL");
  CHECK_STREQ(rdmx_status_str(RDMX_PANIC), "RDMX_PANIC");
  CHECK_STREQ(rdmx_status_str(RDMX_BUSY), "RDMX_BUSY");
  CHECK_STREQ(rdmx_status_str(RDMX_CLOSED), "RDMX_CLOSED");
  CHECK_STREQ(rdmx_status_str(RDMX_TIMEOUT), "RDMX_TIMEOUT");
  CHECK_STREQ(rdmx_status_str(RDMX_UNSUPPORTED), "RDMX_UNSUPPORTED");
  CHECK_STREQ(rdmx_status_str(RDMX_FULL), "RDMX_FULL");
  CHECK_STREQ(rdmx_status_str(RDMX_RESOURCE_LIMIT), "RDMX_RESOURCE_LIMIT");
  CHECK_STREQ(rdmx_status_str(-1), "RDMX_UNKNOWN_STATUS");
  CHECK_STREQ(rdmx_status_str(1000), "RDMX_UNKNOWN_STATUS");
  CHECK(rdmx_last_error() != NULL);
}

static void test_null_arguments(void) {
  rdmx_config *cfg = new_config();
  char buf[8];
  size_t n;
  CHECK_STATUS(rdmx_config_new(NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("rdmx_config_new");
  CHECK_ERR_HAS("NULL");
  CHECK_STATUS(rdmx_config_set(NULL, "rnr_retry", "2"), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("cfg is NULL");
  CHECK_STATUS(rdmx_config_set(cfg, NULL, "2"), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("key is NULL");
  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("value is NULL");
  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", "\xff\xfe"), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("UTF-8");
  CHECK_STATUS(rdmx_config_get(NULL, "rnr_retry", buf, sizeof buf, &n), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_config_get(cfg, NULL, buf, sizeof buf, &n), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_config_get(cfg, "rnr_retry", NULL, 5, &n), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_config_load_file(NULL, "/tmp/x"), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_config_load_file(cfg, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("path is NULL");
  CHECK_STATUS(rdmx_config_validate(NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_config_dump(NULL, buf, sizeof buf, &n), RDMX_INVALID_ARGUMENT);
  rdmx_config_free(NULL); /* no-op */
  rdmx_config_free(cfg);
}

static void test_set_get_and_invalid_values(void) {
  rdmx_config *cfg = new_config();
  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", "2"), RDMX_OK);
  CHECK_STREQ(rdmx_last_error(), "");
  CHECK_STREQ(get(cfg, "rnr_retry"), "2");

  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", "8"), RDMX_INVALID_VALUE);
  CHECK_ERR_HAS("rnr_retry");
  CHECK_ERR_HAS("'8'");
  CHECK_ERR_HAS("0..7");
  CHECK_STREQ(get(cfg, "rnr_retry"), "2"); /* a rejected set changes nothing */

  CHECK_STATUS(rdmx_config_set(cfg, "timeout", "32"), RDMX_INVALID_VALUE);
  CHECK_ERR_HAS("timeout");
  CHECK_ERR_HAS("'32'");
  CHECK_ERR_HAS("0..31");

  CHECK_STATUS(rdmx_config_set(cfg, "path_mtu", "1000"), RDMX_INVALID_VALUE);
  CHECK_ERR_HAS("path_mtu");
  CHECK_ERR_HAS("'1000'");
  CHECK_ERR_HAS("4096");
  CHECK_STATUS(rdmx_config_set(cfg, "path_mtu", "4096"), RDMX_OK);
  CHECK_STREQ(get(cfg, "path_mtu"), "4096");

  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retyr", "2"), RDMX_UNKNOWN_KEY);
  CHECK_ERR_HAS("rnr_retyr");
  CHECK_ERR_HAS("did you mean 'rnr_retry'");
  CHECK_STATUS(rdmx_config_get(cfg, "no_such_key", get_buf, sizeof get_buf, NULL), RDMX_UNKNOWN_KEY);

  /* Ceph alias and a Ceph name with no meaning here. */
  CHECK_STATUS(rdmx_config_set(cfg, "ms_async_rdma_polling_us", "250"), RDMX_OK);
  CHECK_STREQ(get(cfg, "polling_us"), "250");
  CHECK(rdmx_config_set(cfg, "ms_async_rdma_support_srq", "true") != RDMX_OK);
  CHECK_ERR_HAS("support_srq");

  /* Buffer rules: size query, too small, exact. */
  size_t n = 0;
  char small[2];
  CHECK_STATUS(rdmx_config_get(cfg, "path_mtu", NULL, 0, &n), RDMX_OK);
  CHECK(n == 4);
  CHECK_STATUS(rdmx_config_get(cfg, "path_mtu", small, sizeof small, &n), RDMX_BUFFER_TOO_SMALL);
  CHECK(n == 4);
  CHECK(small[0] == '\0');
  char exact[5] = {0};
  CHECK_STATUS(rdmx_config_get(cfg, "path_mtu", exact, sizeof exact, NULL), RDMX_OK);
  CHECK_STREQ(exact, "4096");
  rdmx_config_free(cfg);
}

static void test_profiles_and_precedence(void) {
  rdmx_config *cfg = new_config();
  /* Explicit key first, profile after: the explicit key still wins. */
  CHECK_STATUS(rdmx_config_set(cfg, "timeout", "5"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "profile", "ceph-before"), RDMX_OK);
  CHECK_STREQ(get(cfg, "timeout"), "5");
  CHECK_STREQ(get(cfg, "rnr_retry"), "7");
  CHECK_STREQ(get(cfg, "min_rnr_timer"), "0");
  CHECK_STATUS(rdmx_config_set(cfg, "profile", "ceph-after"), RDMX_OK);
  CHECK_STREQ(get(cfg, "rnr_retry"), "2");
  CHECK_STREQ(get(cfg, "min_rnr_timer"), "12");
  CHECK_STREQ(get(cfg, "timeout"), "5");
  CHECK_STATUS(rdmx_config_set(cfg, "profile", "ceph-aftr"), RDMX_INVALID_VALUE);
  CHECK_ERR_HAS("ceph-after");
  rdmx_config_free(cfg);

  cfg = new_config();
  CHECK_STATUS(rdmx_config_set(cfg, "profile", "ceph-before"), RDMX_OK);
  CHECK_STREQ(get(cfg, "timeout"), "14");
  rdmx_config_free(cfg);
}

static void test_config_file(void) {
  char path[] = "/tmp/rdmx-ffi-test-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);

  write_file(path,
             "# rdmx test file\n"
             "; another comment\n"
             "[global]\n"
             "rnr retry = 3\n"
             "min_rnr_timer = 14   # trailing comment\n"
             "ms async rdma buffer size = 8192\n"
             "[osd]\n"
             "timeout = 20\n"
             "[rdmx]\n"
             "max_send_wr = 512\n");
  rdmx_config *cfg = new_config();
  CHECK_STATUS(rdmx_config_set(cfg, "min_rnr_timer", "1"), RDMX_OK); /* explicit, before the file */
  CHECK_STATUS(rdmx_config_load_file(cfg, path), RDMX_OK);
  CHECK_STREQ(get(cfg, "rnr_retry"), "3");
  CHECK_STREQ(get(cfg, "min_rnr_timer"), "1"); /* explicit set wins over the file */
  CHECK_STREQ(get(cfg, "chunk_size"), "8192");
  CHECK_STREQ(get(cfg, "max_send_wr"), "512");
  CHECK_STREQ(get(cfg, "timeout"), "14"); /* [osd] is not ours: the default */

  /* A malformed line: parse error naming the file and line; nothing applied. */
  write_file(path, "rnr_retry = 1\n\nthis line is broken\n");
  CHECK_STATUS(rdmx_config_load_file(cfg, path), RDMX_PARSE_ERROR);
  CHECK_ERR_HAS(path);
  CHECK_ERR_HAS(":3:");
  CHECK_ERR_HAS("this line is broken");
  CHECK_STREQ(get(cfg, "rnr_retry"), "3");

  /* An invalid value in a file names key, value and line. */
  write_file(path, "path_mtu = 1000\n");
  CHECK_STATUS(rdmx_config_load_file(cfg, path), RDMX_INVALID_VALUE);
  CHECK_ERR_HAS(":1:");
  CHECK_ERR_HAS("path_mtu");

  unlink(path);
  CHECK_STATUS(rdmx_config_load_file(cfg, path), RDMX_IO_ERROR);
  CHECK_ERR_HAS(path);
  rdmx_config_free(cfg);
}

static void test_environment(void) {
  setenv("RDMX_TIMEOUT", "12", 1);
  rdmx_config *cfg = new_config();
  CHECK_STREQ(get(cfg, "timeout"), "12");
  size_t n = 0;
  CHECK_STATUS(rdmx_config_dump(cfg, NULL, 0, &n), RDMX_OK);
  char *dump = malloc(n + 1);
  CHECK(dump != NULL);
  CHECK_STATUS(rdmx_config_dump(cfg, dump, n + 1, NULL), RDMX_OK);
  CHECK(strstr(dump, "timeout = 12") != NULL);
  CHECK(strstr(dump, "env") != NULL);
  CHECK(strstr(dump, "rnr_retry = 2") != NULL);
  CHECK(strstr(dump, "soft_port = 4791") != NULL);
  CHECK_STATUS(rdmx_config_dump(cfg, dump, 10, NULL), RDMX_BUFFER_TOO_SMALL);
  free(dump);
  CHECK_STATUS(rdmx_config_set(cfg, "timeout", "9"), RDMX_OK); /* explicit beats env */
  CHECK_STREQ(get(cfg, "timeout"), "9");
  rdmx_config_free(cfg);

  setenv("RDMX_TIMEOUT", "99", 1);
  cfg = (rdmx_config *)&cfg; /* must be overwritten with NULL on failure */
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_INVALID_VALUE);
  CHECK(cfg == NULL);
  CHECK_ERR_HAS("RDMX_TIMEOUT");
  unsetenv("RDMX_TIMEOUT");
}

static void test_validate(void) {
  rdmx_config *cfg = new_config();
  CHECK_STATUS(rdmx_config_validate(cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "send_cq_size", "128"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "max_send_wr", "1024"), RDMX_OK);
  CHECK_STATUS(rdmx_config_validate(cfg), RDMX_CONFLICT);
  CHECK_ERR_HAS("send_cq_size");
  CHECK_ERR_HAS("1024");
  CHECK_STATUS(rdmx_config_set(cfg, "send_cq_size", "0"), RDMX_OK); /* auto = 2x */
  CHECK_STATUS(rdmx_config_validate(cfg), RDMX_OK);
  rdmx_config_free(cfg);
}

static void test_encodings(void) {
  for (uint8_t code = 0; code < 32; code++) {
    CHECK(rdmx_rnr_timer_ns(code) == RNR_TABLE_10US[code] * 10000u);
    uint64_t ack = rdmx_ack_timeout_ns(code);
    CHECK(ack == (code == 0 ? 0 : ((uint64_t)4096 << code)));
  }
  CHECK(rdmx_rnr_timer_ns(0) == 655360000u);
  CHECK(rdmx_rnr_timer_ns(12) == 640000u);
  CHECK(rdmx_rnr_timer_ns(32) == UINT64_MAX);
  CHECK(rdmx_rnr_timer_ns(255) == UINT64_MAX);
  CHECK(rdmx_ack_timeout_ns(14) == 67108864u);
  CHECK(rdmx_ack_timeout_ns(10) == 4194304u);
  CHECK(rdmx_ack_timeout_ns(32) == UINT64_MAX);
}

static int log_lines = 0;
static char last_log[512];

static void on_log(void *user_data, rdmx_log_level level, const char *message) {
  int *tag = (int *)user_data;
  CHECK(tag != NULL && *tag == 42);
  CHECK(level >= RDMX_LOG_ERROR && level <= RDMX_LOG_TRACE);
  log_lines++;
  snprintf(last_log, sizeof last_log, "%s", message);
}

static void test_logging(void) {
  static int tag = 42;
  rdmx_config *cfg = new_config();
  CHECK_STATUS(rdmx_log_set_callback(on_log, RDMX_LOG_DEBUG, &tag), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", "8"), RDMX_INVALID_VALUE);
  CHECK(log_lines > 0);
  CHECK(strstr(last_log, "rnr_retry") != NULL);
  int before = log_lines;
  CHECK_STATUS(rdmx_log_set_callback(on_log, RDMX_LOG_ERROR, &tag), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "rnr_retry", "8"), RDMX_INVALID_VALUE);
  CHECK(log_lines == before); /* debug lines filtered at ERROR */
  CHECK_STATUS(rdmx_log_set_callback(on_log, 6, &tag), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("level");
  CHECK_STATUS(rdmx_log_set_callback(NULL, RDMX_LOG_WARN, NULL), RDMX_OK);
  rdmx_config_free(cfg);
}

int main(void) {
  test_version_and_status();
  test_null_arguments();
  test_set_get_and_invalid_values();
  test_profiles_and_precedence();
  test_config_file();
  test_environment();
  test_validate();
  test_encodings();
  test_logging();
  CHECK_DONE("test_config (C)");
}
