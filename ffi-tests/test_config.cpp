// C++ consumer of rdmx.h: RAII ownership, every entry point, errors as a daemon sees them.
#include <rdmx.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include "check.h"

namespace {

struct ConfigDeleter {
  void operator()(rdmx_config *c) const { rdmx_config_free(c); }
};
using Config = std::unique_ptr<rdmx_config, ConfigDeleter>;

Config make_config() {
  rdmx_config *raw = nullptr;
  if (rdmx_config_new(&raw) != RDMX_OK) throw std::runtime_error(rdmx_last_error());
  return Config(raw);
}

// Two-call pattern: size query, then fetch.
std::string get(const Config &cfg, const char *key) {
  size_t n = 0;
  if (rdmx_config_get(cfg.get(), key, nullptr, 0, &n) != RDMX_OK) throw std::runtime_error(rdmx_last_error());
  std::vector<char> buf(n + 1);
  if (rdmx_config_get(cfg.get(), key, buf.data(), buf.size(), nullptr) != RDMX_OK)
    throw std::runtime_error(rdmx_last_error());
  return std::string(buf.data());
}

std::string dump(const Config &cfg) {
  size_t n = 0;
  CHECK_STATUS(rdmx_config_dump(cfg.get(), nullptr, 0, &n), RDMX_OK);
  std::vector<char> buf(n + 1);
  CHECK_STATUS(rdmx_config_dump(cfg.get(), buf.data(), buf.size(), nullptr), RDMX_OK);
  return std::string(buf.data());
}

std::vector<std::string> log_lines;

extern "C" void on_log(void *user, rdmx_log_level, const char *msg) {
  static_cast<std::vector<std::string> *>(user)->push_back(msg);
}

}  // namespace

int main() {
  CHECK(std::string(rdmx_version()).size() > 0);
  CHECK_STREQ(rdmx_status_str(RDMX_CONFLICT), "RDMX_CONFLICT");
  CHECK_STATUS(rdmx_config_new(nullptr), RDMX_INVALID_ARGUMENT);
  rdmx_config_free(nullptr);

  Config cfg = make_config();
  CHECK_STATUS(rdmx_log_set_callback(on_log, RDMX_LOG_DEBUG, &log_lines), RDMX_OK);

  // The seed's Ceph "after" column, then an explicit override.
  CHECK_STATUS(rdmx_config_set(cfg.get(), "profile", "ceph-after"), RDMX_OK);
  CHECK(get(cfg, "rnr_retry") == "2");
  CHECK(get(cfg, "min_rnr_timer") == "12");
  CHECK(get(cfg, "timeout") == "10");
  CHECK_STATUS(rdmx_config_set(cfg.get(), "Rnr-Retry", "1"), RDMX_OK);
  CHECK(get(cfg, "rnr_retry") == "1");

  // Invalid values the issue names, each with its message.
  struct Bad {
    const char *key, *value;
    rdmx_status want;
    const char *fragment;
  } bad[] = {
      {"rnr_retry", "8", RDMX_INVALID_VALUE, "rnr_retry"},
      {"timeout", "32", RDMX_INVALID_VALUE, "timeout"},
      {"path_mtu", "1000", RDMX_INVALID_VALUE, "path_mtu"},
      {"retry_cnt", "-1", RDMX_INVALID_VALUE, "retry_cnt"},
      {"separate_cqs", "maybe", RDMX_INVALID_VALUE, "separate_cqs"},
      {"min_rnr_timr", "1", RDMX_UNKNOWN_KEY, "min_rnr_timer"},
  };
  for (const Bad &b : bad) {
    CHECK_STATUS(rdmx_config_set(cfg.get(), b.key, b.value), b.want);
    CHECK_ERR_HAS(b.fragment);
    if (b.want == RDMX_INVALID_VALUE) CHECK_ERR_HAS(b.value);
  }
  CHECK(!log_lines.empty());

  // Config file with a malformed line.
  char path[] = "/tmp/rdmx-ffi-cpp-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  {
    std::ofstream f(path);
    f << "[global]\nmax_recv_wr = 64\nmax_recv_wr 65\n";
  }
  CHECK_STATUS(rdmx_config_load_file(cfg.get(), path), RDMX_PARSE_ERROR);
  CHECK_ERR_HAS(":3:");
  CHECK(get(cfg, "max_recv_wr") == "256");  // all or nothing
  {
    std::ofstream f(path);
    f << "[global]\nmax_recv_wr = 64\n";
  }
  CHECK_STATUS(rdmx_config_load_file(cfg.get(), path), RDMX_OK);
  CHECK(get(cfg, "max_recv_wr") == "64");
  unlink(path);

  // Cross-field rule: a shared CQ smaller than the WRs completing on it.
  CHECK_STATUS(rdmx_config_set(cfg.get(), "separate_cqs", "false"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg.get(), "send_cq_size", "300"), RDMX_OK);
  CHECK_STATUS(rdmx_config_validate(cfg.get()), RDMX_CONFLICT);
  CHECK_ERR_HAS("send_cq_size");
  CHECK_STATUS(rdmx_config_set(cfg.get(), "send_cq_size", "320"), RDMX_OK);
  CHECK_STATUS(rdmx_config_validate(cfg.get()), RDMX_OK);

  std::string d = dump(cfg);
  CHECK(d.find("rnr_retry = 1") != std::string::npos);
  CHECK(d.find("max_recv_wr = 64") != std::string::npos);
  CHECK(d.find("profile = ceph-after") != std::string::npos);

  CHECK(rdmx_rnr_timer_ns(0) == 655360000ull);
  CHECK(rdmx_rnr_timer_ns(12) == 640000ull);
  CHECK(rdmx_rnr_timer_ns(32) == UINT64_MAX);
  CHECK(rdmx_ack_timeout_ns(0) == 0);
  CHECK(rdmx_ack_timeout_ns(14) == 67108864ull);
  CHECK(rdmx_ack_timeout_ns(32) == UINT64_MAX);

  CHECK_STATUS(rdmx_log_set_callback(nullptr, RDMX_LOG_WARN, nullptr), RDMX_OK);
  CHECK_DONE("test_config (C++)");
}
