// Messenger echo client in C++: `msgr_echo_client_cpp HOST:PORT COUNT`.
//
// Callback mode with two worker threads (msgr_threads = 2): two sessions to the echo server
// (one lossless, one lossy), each on its own worker thread; the callbacks verify the echoes
// and wake the main thread through a condition variable. The main thread sends (sends are
// allowed from any thread while callbacks run); resources are held by RAII wrappers.
#include <rdmx.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "msgr_echo.h"

namespace {

struct MsgrFree {
  void operator()(rdmx_msgr *m) const { rdmx_msgr_free(m); }
};
struct MsgFree {
  void operator()(rdmx_msg *m) const { rdmx_msg_free(m); }
};
struct ConfigFree {
  void operator()(rdmx_config *c) const { rdmx_config_free(c); }
};
using MsgPtr = std::unique_ptr<rdmx_msg, MsgFree>;

constexpr unsigned kWindow = 8;

struct Session {
  uint64_t id = 0;
  uint32_t policy = 0;
  bool connected = false;
  bool reset = false;
  uint64_t next_expected = 0;
  uint64_t echoed = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
  std::thread::id thread;  // the worker its callbacks run on
  bool one_thread = true;
};

struct Client {
  std::mutex mu;
  std::condition_variable cv;
  Session sessions[2];
  std::atomic<int> callbacks{0};

  Session *find(uint64_t id) {
    for (auto &s : sessions)
      if (s.id == id) return &s;
    return nullptr;
  }

  void verify(Session &s, MsgPtr msg) {
    CHECK(rdmx_msg_type(msg.get()) == ECHO_TYPE);
    size_t flen = 0;
    auto *f = static_cast<const echo_front *>(rdmx_msg_front(msg.get(), &flen));
    CHECK(f != nullptr && flen == sizeof(echo_front));
    if (f == nullptr) return;
    CHECK(f->number == s.next_expected);
    s.next_expected = f->number + 1;
    rdmx_iov iov[1];
    size_t n = 0;
    CHECK_STATUS(rdmx_msg_seg_iov(msg.get(), 0, iov, 1, &n), RDMX_OK);
    CHECK(n == 1);
    if (n != 1) return;
    CHECK(iov[0].len == f->data_len);
    CHECK(reinterpret_cast<uintptr_t>(iov[0].base) % 4096 == 0);
    CHECK(fnv1a(FNV_INIT, iov[0].base, iov[0].len) == f->checksum);
    s.echoed++;
  }

  void on_event(rdmx_msgr *, const rdmx_msgr_event *ev) {
    callbacks++;
    std::lock_guard<std::mutex> g(mu);
    Session *s = find(ev->session);
    CHECK(s != nullptr);
    if (s == nullptr) {
      if (ev->msg) rdmx_msg_free(ev->msg);
      return;
    }
    if (s->thread == std::thread::id()) {
      s->thread = std::this_thread::get_id();
    } else if (s->thread != std::this_thread::get_id()) {
      s->one_thread = false;
    }
    switch (ev->kind) {
      case RDMX_MSGR_EVENT_CONNECT:
        s->connected = true;
        break;
      case RDMX_MSGR_EVENT_MESSAGE:
        verify(*s, MsgPtr(ev->msg));
        break;
      case RDMX_MSGR_EVENT_SEND_COMPLETE:
        if (ev->status == RDMX_OK) {
          s->completed++;
        } else {
          s->failed++;
          std::fprintf(stderr, "send failed: %s\n", ev->text);
        }
        break;
      case RDMX_MSGR_EVENT_SEND_READY:
        break;
      case RDMX_MSGR_EVENT_RESET:
        std::fprintf(stderr, "reset: %s\n", ev->text);
        s->reset = true;
        break;
      default:
        CHECK(!"unknown event");
    }
    cv.notify_all();
  }
};

extern "C" void on_event(void *user, rdmx_msgr *m, const rdmx_msgr_event *ev) {
  static_cast<Client *>(user)->on_event(m, ev);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST:PORT COUNT\n", argv[0]);
    return 2;
  }
  const std::string addr = argv[1];
  const uint64_t count = std::strtoull(argv[2], nullptr, 10);

  Client client;
  std::unique_ptr<rdmx_msgr, MsgrFree> m;
  {
    rdmx_config *raw = nullptr;
    CHECK_STATUS(rdmx_config_new(&raw), RDMX_OK);
    std::unique_ptr<rdmx_config, ConfigFree> cfg(raw);
    CHECK_STATUS(rdmx_config_set(cfg.get(), "soft_port", "0"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg.get(), "msgr_threads", "2"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg.get(), "msgr_keepalive_timeout_ms", "30000"), RDMX_OK);
    rdmx_msgr *mm = nullptr;
    CHECK_STATUS(rdmx_msgr_new(cfg.get(), on_event, &client, &mm), RDMX_OK);
    m.reset(mm);
  }
  if (!m) CHECK_DONE("msgr_echo_client (C++)");
  size_t n = 0;
  CHECK_STATUS(rdmx_msgr_poll(m.get(), 0, nullptr, 0, &n), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("worker threads run the callbacks");

  const uint32_t policies[2] = {RDMX_POLICY_LOSSLESS, RDMX_POLICY_LOSSY};
  {
    std::lock_guard<std::mutex> g(client.mu);  // ids known before the first callback
    for (int i = 0; i < 2; i++) {
      client.sessions[i].policy = policies[i];
      CHECK_STATUS(rdmx_msgr_connect(m.get(), addr.c_str(), policies[i], &client.sessions[i].id),
                   RDMX_OK);
    }
  }

  std::vector<uint8_t> buf(2 * kWindow * ECHO_DATA);
  rdmx_mem mem{};
  CHECK_STATUS(rdmx_msgr_mem_reg(m.get(), buf.data(), buf.size(), &mem), RDMX_OK);

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  std::vector<uint64_t> number(2, 0);
  std::vector<uint64_t> sent(2, 0);
  std::unique_lock<std::mutex> lk(client.mu);
  while (std::chrono::steady_clock::now() < deadline) {
    bool done = true;
    bool progressed = false;
    for (int i = 0; i < 2; i++) {
      Session &s = client.sessions[i];
      if (s.reset || number[i] >= count) continue;
      done = false;
      // Registered memory: slot reused only once the echo (and so the send) came back.
      if (!s.connected || number[i] - s.echoed >= kWindow || number[i] - s.completed >= kWindow)
        continue;
      uint64_t k = number[i];
      uint8_t *data = buf.data() + (static_cast<size_t>(i) * kWindow + k % kWindow) * ECHO_DATA;
      for (size_t j = 0; j < ECHO_DATA; j++) data[j] = echo_byte(k, j);
      echo_front f{};
      f.number = k;
      f.checksum = fnv1a(FNV_INIT, data, ECHO_DATA);
      f.data_len = ECHO_DATA;
      rdmx_msg_iov iov{};
      iov.kind = (k % 2) ? RDMX_SEG_MEM : RDMX_SEG_COPY;
      f.seg_kind = iov.kind;
      iov.addr = data;
      iov.length = ECHO_DATA;
      iov.mem = &mem;
      uint64_t id = 0;
      // Sending under our lock is fine: no rdmx lock is held while a callback waits for it.
      rdmx_status st = rdmx_session_send(m.get(), s.id, ECHO_TYPE, &f, sizeof f, &iov, 1, &id);
      if (st == RDMX_OK) {
        number[i]++;
        sent[i]++;
        progressed = true;
      } else if (st != RDMX_FULL) {
        std::fprintf(stderr, "send: %s\n", rdmx_last_error());
        check_failures++;
        s.reset = true;
      }
    }
    if (done) break;
    if (!progressed) client.cv.wait_for(lk, std::chrono::milliseconds(10));
  }
  // Every echo back, then QUIT on each session and its acknowledgement.
  uint64_t quit_id[2] = {0, 0};
  client.cv.wait_until(lk, deadline, [&] {
    return client.sessions[0].echoed >= count && client.sessions[1].echoed >= count;
  });
  for (int i = 0; i < 2; i++) {
    CHECK_STATUS(rdmx_session_send(m.get(), client.sessions[i].id, QUIT_TYPE, nullptr, 0, nullptr,
                                   0, &quit_id[i]),
                 RDMX_OK);
  }
  client.cv.wait_until(lk, deadline, [&] {
    return client.sessions[0].completed > sent[0] && client.sessions[1].completed > sent[1];
  });
  for (int i = 0; i < 2; i++) {
    Session &s = client.sessions[i];
    CHECK(s.connected);
    CHECK(!s.reset);
    CHECK(s.echoed == count);
    CHECK(s.next_expected == count);
    CHECK(s.completed == sent[i] + 1);
    CHECK(s.failed == 0);
    CHECK(s.one_thread);
    CHECK(quit_id[i] == sent[i] + 1);
  }
  // Sessions spread over both workers.
  CHECK(client.sessions[0].thread != client.sessions[1].thread);
  CHECK(client.sessions[0].thread != std::this_thread::get_id());
  lk.unlock();

  for (int i = 0; i < 2; i++) {
    rdmx_session_counters c{};
    c.struct_size = sizeof c;
    CHECK_STATUS(rdmx_session_get_counters(m.get(), client.sessions[i].id, &c), RDMX_OK);
    CHECK(c.msgs_sent == sent[i] + 1);
    CHECK(c.msgs_received == count);
    CHECK(c.copied_bytes == ((count + 1) / 2) * ECHO_DATA);
    CHECK(c.rnr_naks == 0);
    CHECK_STATUS(rdmx_session_close(m.get(), client.sessions[i].id), RDMX_OK);
  }
  CHECK_STATUS(rdmx_msgr_mem_dereg(m.get(), &mem), RDMX_OK);
  rdmx_msgr_stats st{};
  st.struct_size = sizeof st;
  for (int k = 0; k < 500; k++) {
    CHECK_STATUS(rdmx_msgr_get_stats(m.get(), &st), RDMX_OK);
    if (st.data_chunks_in_use == 0 && st.header_slots_in_use == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(st.sessions == 0);
  CHECK(st.data_chunks_in_use == 0);
  CHECK(st.header_slots_in_use == 0);
  CHECK(st.mem_registrations == 0);
  std::printf("client (C++): %llu echoes on 2 sessions over 2 worker threads, %d callbacks\n",
              static_cast<unsigned long long>(client.sessions[0].echoed +
                                              client.sessions[1].echoed),
              client.callbacks.load());
  m.reset();
  CHECK_DONE("msgr_echo_client (C++)");
}
