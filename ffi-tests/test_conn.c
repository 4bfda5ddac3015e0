/* C server/client pair over the TCP side channel on 127.0.0.1. Moves data both ways
 * (SEND/RECV, RDMA READ and WRITE) and checks every byte and the work request counters,
 * then the failure cases: post on a closed connection, READ outside the peer's region
 * (REM_ACCESS_ERR), a bad lkey (LOC_PROT_ERR), WRITE into a region exposed read-only, and
 * (soft only) a path that loses every packet (RETRY_EXC_ERR, explained by rdmx_conn_error)
 * and the port counters (junk datagrams to a context's UDP port are counted).
 *
 *   test_conn                  the server is a forked child (soft provider)
 *   test_conn server FILE      the server alone; writes "127.0.0.1:PORT" to FILE
 *   test_conn client FILE      the client alone, dialing the address FILE holds
 *
 * The two roles run as separate processes where a forked child cannot share the device:
 * provider=verbs under `rdmx-ibv exec`, one device address (RoCEv2's UDP port 4791) per
 * process. The provider expected is RDMX_PROVIDER's (default soft). With verbs the server
 * also checks the async event its QP raises when the client's READ breaks the rules. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "conn_wait.h"

#define SRV_LEN (64 * 1024)
#define RO_LEN 4096
#define CONNS 5 /* the echo connection + one per failure case */

static uint8_t srv_pattern(size_t i) { return (uint8_t)(i * 13 + 7); }
static uint8_t cli_pattern(size_t i) { return (uint8_t)(i * 31 + 1); }

static const char *expected_provider(void) {
  const char *p = getenv("RDMX_PROVIDER");
  return p ? p : "soft";
}

static int on_verbs(void) { return strcmp(expected_provider(), "verbs") == 0; }

static rdmx_context *new_context(void) {
  rdmx_config *cfg = NULL;
  rdmx_context *ctx = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "path_mtu", "1024"), RDMX_OK);
  CHECK_STATUS(rdmx_context_new(cfg, &ctx), RDMX_OK);
  rdmx_config_free(cfg);
  return ctx;
}

/* ---- server (child process) ---- */

/* Hands the listener's port to the client: through the pipe of the forked case, or as
 * "127.0.0.1:PORT" in `file` (written to FILE.tmp, then renamed: the client never sees a
 * partial line). */
static void publish_port(int port_fd, const char *file, uint16_t port) {
  if (file == NULL) {
    CHECK(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
    close(port_fd);
    return;
  }
  char tmp[4096];
  CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", file) < (int)sizeof tmp);
  FILE *f = fopen(tmp, "w");
  CHECK(f != NULL);
  if (f == NULL) return;
  fprintf(f, "127.0.0.1:%u\n", (unsigned)port);
  CHECK(fclose(f) == 0);
  CHECK(rename(tmp, file) == 0);
}

/* With verbs: the READ outside this side's region (the client's case 4) broke this
 * side's QP, which only the device's async event tells (no completion of ours failed):
 * rdmx_conn_error names it and the connection's counters count it. */
static void check_async_error(rdmx_conn *c) {
  rdmx_counters k = {.struct_size = sizeof k};
  double end = now_s() + 5.0;
  do {
    CHECK_STATUS(rdmx_conn_counters(c, &k), RDMX_OK);
    if (k.async_events > 0) break;
    struct timespec pause = {0, 5000000};
    nanosleep(&pause, NULL);
  } while (now_s() < end);
  CHECK(k.async_events == 1);
  const char *why = rdmx_conn_error(c);
  CHECK(why != NULL && strstr(why, "QP_FATAL on QP") == why);
  if (why) printf("server: case 4's QP: %s\n", why);
}

static int server(int port_fd, const char *file) {
  rdmx_context *ctx = new_context();
  CHECK_STREQ(rdmx_context_provider(ctx), expected_provider());
  uint8_t *srv = malloc(SRV_LEN), *ro = malloc(RO_LEN), *rx = malloc(SRV_LEN);
  for (size_t i = 0; i < SRV_LEN; i++) srv[i] = srv_pattern(i);
  for (size_t i = 0; i < RO_LEN; i++) ro[i] = 0xAB;
  rdmx_mr m_srv, m_ro, m_rx;
  CHECK_STATUS(rdmx_mr_reg(ctx, srv, SRV_LEN, RDMX_ACCESS_LOCAL_WRITE | RDMX_ACCESS_REMOTE_READ | RDMX_ACCESS_REMOTE_WRITE, &m_srv), RDMX_OK);
  CHECK_STATUS(rdmx_mr_reg(ctx, ro, RO_LEN, RDMX_ACCESS_REMOTE_READ, &m_ro), RDMX_OK);
  CHECK_STATUS(rdmx_mr_reg(ctx, rx, SRV_LEN, RDMX_ACCESS_LOCAL_WRITE, &m_rx), RDMX_OK);
  rdmx_listener *l = NULL;
  CHECK_STATUS(rdmx_listener_new(ctx, "127.0.0.1:0", &l), RDMX_OK);
  publish_port(port_fd, file, rdmx_listener_port(l));

  /* Case 7 (the fifth connection) is soft only. */
  int conns = on_verbs() ? CONNS - 1 : CONNS;
  for (int k = 0; k < conns; k++) {
    rdmx_conn *c = NULL;
    rdmx_status ast = rdmx_listener_accept(l, 20000, &c);
    /* A failure-case client may be done (and gone) before its connection is accepted:
     * the listener then says so (RDMX_CLOSED) and the next client is accepted. */
    if (k > 0 && ast == RDMX_CLOSED) continue;
    CHECK_STATUS(ast, RDMX_OK);
    if (!c) break;
    rdmx_completion wc[4];
    rdmx_sge r = {(uint64_t)(uintptr_t)rx, 8000, m_rx.lkey};
    rdmx_status st = rdmx_post_recv(c, &r, 1, 100 + (uint64_t)k);
    if (k > 0 && st == RDMX_CLOSED) {
      /* The failure-case clients may be done (and gone) before we get here. */
      rdmx_conn_free(c);
      continue;
    }
    CHECK(st == RDMX_OK);
    if (k == 0) {
      /* Echo connection: receive the client's SEND, check it, SEND ours back. */
      CHECK(wait_for(c, wc, 1) == 1);
      CHECK(wc[0].status == 0 && wc[0].opcode == 128 && wc[0].byte_len == 8000 && wc[0].cookie == 100);
      for (size_t i = 0; i < 8000; i++)
        if (rx[i] != cli_pattern(i)) { CHECK(!"server: received bytes differ"); break; }
      rdmx_sge s = {(uint64_t)(uintptr_t)srv, 6000, m_srv.lkey};
      CHECK_STATUS(rdmx_post_send_imm(c, &s, 1, 0xFEED, 200, 0), RDMX_OK);
      CHECK(wait_for(c, wc, 1) == 1);
      CHECK(wc[0].status == 0 && wc[0].cookie == 200 && wc[0].opcode == 0);
      CHECK_STATUS(rdmx_post_recv(c, &r, 1, 101), RDMX_OK);
    }
    /* Wait for the client to go away: the pending receive is flushed (status 5). */
    size_t got = wait_for(c, wc, 1);
    CHECK(got == 1 && wc[0].status == 5);
    if (k == 1 && on_verbs()) check_async_error(c);
    uint64_t probes = (uint64_t)wait_peer_gone(c, &r);
    rdmx_counters kc = {.struct_size = sizeof kc};
    CHECK_STATUS(rdmx_conn_counters(c, &kc), RDMX_OK);
    CHECK(kc.wr_recv_posted == (k == 0 ? 2u : 1u) + probes && kc.wc_status[5] == 1 + probes);
    rdmx_conn_free(c);
  }
  rdmx_listener_free(l);
  /* The client wrote 5000 bytes at offset 40000; the read-only region is untouched. */
  for (size_t i = 0; i < 5000; i++)
    if (srv[40000 + i] != cli_pattern(i + 3)) { CHECK(!"server: written bytes differ"); break; }
  for (size_t i = 0; i < RO_LEN; i++)
    if (ro[i] != 0xAB) { CHECK(!"server: read-only region was written"); break; }
  CHECK_STATUS(rdmx_mr_dereg(ctx, m_srv.lkey), RDMX_OK);
  CHECK_STATUS(rdmx_mr_dereg(ctx, m_ro.lkey), RDMX_OK);
  CHECK_STATUS(rdmx_mr_dereg(ctx, m_rx.lkey), RDMX_OK);
  rdmx_context_free(ctx);
  free(srv); free(ro); free(rx);
  printf("server: %d checks, %d failed\n", check_count, check_failures);
  fflush(stdout); /* the child leaves with _exit */
  return check_failures == 0 ? 0 : 1;
}

/* ---- client (parent process) ---- */

struct hook_arg {
  rdmx_sge sge;
  int calls;
};

/* A UDP port on 127.0.0.1 that was free a moment ago (0 on failure). */
static uint16_t free_udp_port(void) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* Sends `len` bytes of `data` to 127.0.0.1:`port` from a fresh UDP socket. */
static void send_junk(uint16_t port, const void *data, size_t len) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  CHECK(fd >= 0);
  if (fd < 0) return;
  struct sockaddr_in to;
  memset(&to, 0, sizeof to);
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  CHECK(sendto(fd, data, len, 0, (struct sockaddr *)&to, sizeof to) == (ssize_t)len);
  close(fd);
}

/* On-connect hook: posts the first receive while the peer is still held back. */
static int32_t post_first_recv(void *user, rdmx_conn *conn) {
  struct hook_arg *a = (struct hook_arg *)user;
  a->calls++;
  /* The connection is lent to the hook: closing or freeing it is refused, not UB. */
  CHECK_STATUS(rdmx_conn_close(conn), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("lent to the on-connect hook");
  rdmx_conn_free(conn);
  CHECK_ERR_HAS("lent to the on-connect hook");
  return rdmx_post_recv(conn, &a->sge, 1, 11) == RDMX_OK ? 0 : 1;
}

static rdmx_conn *dial(rdmx_context *ctx, const char *addr, rdmx_remote_region *rw, rdmx_remote_region *rdonly) {
  rdmx_conn *c = NULL;
  CHECK_STATUS(rdmx_connect(ctx, addr, 10000, &c), RDMX_OK);
  CHECK(rdmx_conn_remote_region_count(c) == 2);
  for (size_t i = 0; i < rdmx_conn_remote_region_count(c); i++) {
    rdmx_remote_region r;
    CHECK_STATUS(rdmx_conn_remote_region(c, i, &r), RDMX_OK);
    if (r.access & RDMX_ACCESS_REMOTE_WRITE) *rw = r; else *rdonly = r;
  }
  rdmx_remote_region dummy;
  CHECK_STATUS(rdmx_conn_remote_region(c, 2, &dummy), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("out of range");
  return c;
}

static int client(const char *port) {
  rdmx_context *ctx = new_context();
  CHECK_STREQ(rdmx_context_provider(ctx), expected_provider());
  rdmx_port_counters pc = {.struct_size = sizeof pc};
  memset(&pc, 0xFF, sizeof pc);
  CHECK_STATUS(rdmx_context_port_counters(ctx, &pc), RDMX_OK);
  CHECK(pc.unknown_qpn == 0 && pc.wrong_source == 0 && pc.bad_icrc == 0 && pc.malformed == 0 &&
        pc.truncated == 0 && pc.kernel_drops == 0 && pc.async_events == 0);
  uint8_t *buf = malloc(SRV_LEN);
  for (size_t i = 0; i < SRV_LEN; i++) buf[i] = cli_pattern(i);
  rdmx_mr m;
  CHECK_STATUS(rdmx_mr_reg(ctx, buf, SRV_LEN, RDMX_ACCESS_LOCAL_WRITE, &m), RDMX_OK);
  rdmx_remote_region rw = {0}, rdonly = {0};
  rdmx_completion wc[4];

  /* 1. Echo: SEND 8000 bytes, receive 6000 with immediate data. The receive for the
   * server's reply is posted by the on-connect hook, before the server may send. */
  struct hook_arg ha = {{(uint64_t)(uintptr_t)(buf + 32768), 6000, m.lkey}, 0};
  CHECK_STATUS(rdmx_context_set_on_connect(ctx, post_first_recv, &ha), RDMX_OK);
  rdmx_conn *c = dial(ctx, port, &rw, &rdonly);
  CHECK(ha.calls == 1);
  CHECK_STATUS(rdmx_context_set_on_connect(ctx, NULL, NULL), RDMX_OK);
  CHECK(rw.length == SRV_LEN && rdonly.length == RO_LEN && rw.rkey != rdonly.rkey);
  rdmx_sge s = {(uint64_t)(uintptr_t)buf, 8000, m.lkey};
  CHECK_STATUS(rdmx_post_send(c, &s, 1, 10, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 2) == 2);
  int saw_send = 0, saw_recv = 0;
  for (int i = 0; i < 2; i++) {
    if (wc[i].cookie == 10) saw_send = wc[i].status == 0 && wc[i].opcode == 0;
    if (wc[i].cookie == 11)
      saw_recv = wc[i].status == 0 && wc[i].opcode == 128 && wc[i].byte_len == 6000 &&
                 (wc[i].flags & RDMX_WC_WITH_IMM) && wc[i].imm == 0xFEED;
  }
  CHECK(saw_send && saw_recv);
  for (size_t i = 0; i < 6000; i++)
    if (buf[32768 + i] != srv_pattern(i)) { CHECK(!"client: received bytes differ"); break; }

  /* 2. READ 20000 bytes (20 packets) at offset 1000 of the server's region, waiting for
   * its completion on the event fd as an epoll loop would. */
  int efd = rdmx_event_fd(c);
  CHECK(efd >= 0);
  CHECK_STATUS(rdmx_req_notify(c), RDMX_OK);
  rdmx_sge rd = {(uint64_t)(uintptr_t)(buf + 8192), 20000, m.lkey};
  CHECK_STATUS(rdmx_post_read(c, &rd, 1, rw.addr + 1000, rw.rkey, 20, 0), RDMX_OK);
  struct pollfd pfd = {efd, POLLIN, 0};
  CHECK(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN));
  CHECK_STATUS(rdmx_event_clear(c), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1);
  CHECK(wc[0].cookie == 20 && wc[0].status == 0 && wc[0].opcode == 2 && wc[0].byte_len == 20000);
  for (size_t i = 0; i < 20000; i++)
    if (buf[8192 + i] != srv_pattern(1000 + i)) { CHECK(!"client: READ bytes differ"); break; }

  /* 3. WRITE 5000 bytes at offset 40000, then READ them back. */
  rdmx_sge wr = {(uint64_t)(uintptr_t)(buf + 3), 5000, m.lkey};
  CHECK_STATUS(rdmx_post_write(c, &wr, 1, rw.addr + 40000, rw.rkey, 30, 0), RDMX_OK);
  rdmx_sge back = {(uint64_t)(uintptr_t)(buf + 50000), 5000, m.lkey};
  CHECK_STATUS(rdmx_post_read(c, &back, 1, rw.addr + 40000, rw.rkey, 31, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 2) == 2);
  CHECK(wc[0].cookie == 30 && wc[0].status == 0 && wc[0].opcode == 1);
  CHECK(wc[1].cookie == 31 && wc[1].status == 0);
  for (size_t i = 0; i < 5000; i++)
    if (buf[50000 + i] != cli_pattern(i + 3)) { CHECK(!"client: WRITE read-back differs"); break; }
  rdmx_counters k = {.struct_size = sizeof k};
  CHECK_STATUS(rdmx_conn_counters(c, &k), RDMX_OK);
  if (on_verbs()) /* a NIC counts packets per port, not per QP */
    CHECK(k.tx_packets == 0 && k.rx_packets == 0 && k.tx_bytes == 0);
  else
    CHECK(k.tx_packets > 0 && k.rx_packets > 0 && k.icrc_errors == 0);
  /* Work requests, on both providers: a SEND of 8000, READs of 20000 and 5000, a WRITE
   * of 5000, one receive (6000 bytes arrived); five completions, all successful. */
  CHECK(k.wr_send_posted == 4 && k.wr_recv_posted == 1);
  CHECK(k.send_bytes_posted == 8000 && k.read_bytes_posted == 25000 && k.write_bytes_posted == 5000);
  CHECK(k.completions == 5 && k.wc_status[0] == 5 && k.recv_bytes == 6000 && k.async_events == 0);

  /* Post on a closed connection. */
  CHECK_STATUS(rdmx_conn_close(c), RDMX_OK);
  CHECK_STATUS(rdmx_post_send(c, &s, 1, 12, 0), RDMX_CLOSED);
  CHECK_ERR_HAS("closed");
  rdmx_conn_free(c);

  /* 4. READ outside the peer's region: REM_ACCESS_ERR (10). */
  c = dial(ctx, port, &rw, &rdonly);
  CHECK_STATUS(rdmx_post_read(c, &rd, 1, rw.addr + SRV_LEN - 100, rw.rkey, 40, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1);
  CHECK(wc[0].cookie == 40 && wc[0].status == 10);
  CHECK_STREQ(rdmx_wc_status_str(wc[0].status), "remote access error");
  CHECK_STATUS(rdmx_conn_counters(c, &k), RDMX_OK);
  CHECK(k.completions == 1 && k.wc_status[10] == 1 && k.wc_status[0] == 0);
  rdmx_conn_free(c);

  /* 5. A bad lkey: LOC_PROT_ERR (4). */
  c = dial(ctx, port, &rw, &rdonly);
  rdmx_sge bad = {(uint64_t)(uintptr_t)buf, 100, m.lkey ^ 0x5a5a5a5au};
  CHECK_STATUS(rdmx_post_send(c, &bad, 1, 50, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1);
  CHECK(wc[0].cookie == 50 && wc[0].status == 4);
  rdmx_conn_free(c);

  /* 6. WRITE into the region exposed read-only: REM_ACCESS_ERR (10). */
  c = dial(ctx, port, &rw, &rdonly);
  CHECK_STATUS(rdmx_post_write(c, &wr, 1, rdonly.addr, rdonly.rkey, 60, 0), RDMX_OK);
  CHECK(wait_for(c, wc, 1) == 1);
  CHECK(wc[0].cookie == 60 && wc[0].status == 10);
  if (wc[0].status != 10) fprintf(stderr, "case 6: cookie %llu status %u (%s)\n", (unsigned long long)wc[0].cookie, wc[0].status, rdmx_wc_status_str(wc[0].status));
  rdmx_conn_free(c);

  /* 7. Every packet lost (this side drops all it sends): RETRY_EXC_ERR (12) after
   * (retry_cnt + 1) x timeout, and rdmx_conn_error says what happened. Soft only: it
   * drops with soft_drop_ratio and sends junk to the context's UDP port (the verbs
   * black hole runs in tests/soft_failover.rs, under rdmx-ibv). */
  if (on_verbs()) {
    printf("client: case 7 (soft_drop_ratio, UDP port junk) is soft only: skipped\n");
  } else {
    rdmx_config *cfg = NULL;
    CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "path_mtu", "1024"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "soft_drop_ratio", "1"), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "timeout", "8"), RDMX_OK); /* 1 ms */
    CHECK_STATUS(rdmx_config_set(cfg, "retry_cnt", "1"), RDMX_OK);
    /* A known UDP port, for the junk below. */
    uint16_t udp_port = free_udp_port();
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%u", (unsigned)udp_port);
    CHECK(udp_port != 0);
    CHECK_STATUS(rdmx_config_set(cfg, "soft_port", port_text), RDMX_OK);
    CHECK_STATUS(rdmx_config_set(cfg, "soft_addr", "127.0.0.1"), RDMX_OK);
    rdmx_context *lossy = NULL;
    CHECK_STATUS(rdmx_context_new(cfg, &lossy), RDMX_OK);
    rdmx_config_free(cfg);
    rdmx_mr lm;
    CHECK_STATUS(rdmx_mr_reg(lossy, buf, 4096, RDMX_ACCESS_LOCAL_WRITE, &lm), RDMX_OK);
    c = dial(lossy, port, &rw, &rdonly);
    CHECK(rdmx_conn_error(c) == NULL);
    rdmx_sge one = {(uint64_t)(uintptr_t)buf, 64, lm.lkey};
    CHECK_STATUS(rdmx_post_read(c, &one, 1, rw.addr, rw.rkey, 70, 0), RDMX_OK);
    CHECK(wait_for(c, wc, 1) == 1);
    CHECK(wc[0].cookie == 70 && wc[0].status == 12);
    const char *why = rdmx_conn_error(c);
    CHECK(why != NULL);
    if (why) {
      CHECK(strstr(why, "RETRY_EXC_ERR") != NULL);
      CHECK(strstr(why, "2 ACK timeout(s), 1 retries = retry_cnt 1") != NULL);
      CHECK(strstr(why, "timeout 8 = 1.0 ms per try") != NULL);
      CHECK(strstr(why, "peer is gone or the path is down") != NULL);
      CHECK(rdmx_conn_error(c) == why); /* stable while the connection lives */
    }
    rdmx_counters k7 = {.struct_size = sizeof k7};
    CHECK_STATUS(rdmx_conn_counters(c, &k7), RDMX_OK);
    CHECK(k7.ack_timeouts == 2 && k7.injected_drops >= 2);
    /* Port counters: a runt (malformed) and a BTH naming no QP of this context (unknown
     * QPN) sent to its UDP port while its connection's QP keeps the port polled. */
    rdmx_port_counters p7 = {.struct_size = sizeof p7};
    CHECK_STATUS(rdmx_context_port_counters(lossy, &p7), RDMX_OK);
    CHECK(p7.unknown_qpn == 0 && p7.wrong_source == 0 && p7.malformed == 0);
    const uint8_t runt[10] = {0};
    uint8_t stray[32] = {0x11, 0, 0xFF, 0xFF, 0, 0xAB, 0xCD, 0xEF, 0, 0, 0, 1};
    send_junk(udp_port, runt, sizeof runt);
    send_junk(udp_port, stray, sizeof stray);
    for (int i = 0; i < 400 && (p7.malformed < 1 || p7.unknown_qpn < 1); i++) {
      struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
      CHECK_STATUS(rdmx_context_port_counters(lossy, &p7), RDMX_OK);
    }
    CHECK(p7.malformed == 1 && p7.unknown_qpn == 1 && p7.wrong_source == 0 && p7.bad_icrc == 0);
    rdmx_conn_free(c);
    CHECK_STATUS(rdmx_mr_dereg(lossy, lm.lkey), RDMX_OK);
    rdmx_context_free(lossy);
  }
  CHECK(rdmx_conn_error(NULL) == NULL);

  /* NULL and bad arguments. */
  rdmx_conn *none = NULL;
  CHECK_STATUS(rdmx_connect(NULL, "127.0.0.1:1", 10, &none), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_connect(ctx, NULL, 10, &none), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_connect(ctx, "no port here", 10, &none), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("HOST:PORT");
  CHECK_STATUS(rdmx_post_send(NULL, &s, 1, 0, 0), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_poll(NULL, wc, 4, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_mr_reg(ctx, NULL, 10, RDMX_ACCESS_LOCAL_WRITE, &m), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_mr_reg(ctx, buf, 10, RDMX_ACCESS_REMOTE_WRITE, &m), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("LOCAL_WRITE");
  CHECK(rdmx_event_fd(NULL) == -1);
  CHECK(rdmx_context_provider(NULL) == NULL);
  CHECK_STATUS(rdmx_context_port_counters(NULL, &pc), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("ctx");
  CHECK_STATUS(rdmx_context_port_counters(ctx, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("out");
  rdmx_listener_free(NULL);
  rdmx_conn_free(NULL);
  rdmx_context_free(NULL);

  CHECK_STATUS(rdmx_mr_dereg(ctx, m.lkey), RDMX_OK);
  CHECK_STATUS(rdmx_mr_dereg(ctx, m.lkey), RDMX_INVALID_ARGUMENT);
  rdmx_context_free(ctx);
  free(buf);
  return check_failures == 0 ? 0 : 1;
}

/* The address the server wrote to `file`, waiting up to 60 s for it. */
static int read_address(const char *file, char *addr, size_t len) {
  double end = now_s() + 60.0;
  while (now_s() < end) {
    FILE *f = fopen(file, "r");
    if (f != NULL) {
      int ok = fgets(addr, (int)len, f) != NULL;
      fclose(f);
      if (ok) {
        addr[strcspn(addr, "\n")] = 0;
        return 1;
      }
    }
    struct timespec pause = {0, 50000000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "no server address in %s after 60 s\n", file);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "server") == 0) {
    int rc = server(-1, argv[2]);
    return rc == 0 && check_failures == 0 ? 0 : 1;
  }
  if (argc == 3 && strcmp(argv[1], "client") == 0) {
    char addr[64];
    int rc = read_address(argv[2], addr, sizeof addr) ? client(addr) : 1;
    printf("test_conn (C) client: %d checks, %d failed\n", check_count, check_failures);
    return rc == 0 && check_failures == 0 ? 0 : 1;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s [server FILE | client FILE]\n", argv[0]);
    return 2;
  }
  int fds[2];
  if (pipe(fds) != 0) return 2;
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    close(fds[0]);
    _exit(server(fds[1], NULL));
  }
  close(fds[1]);
  uint16_t port = 0;
  CHECK(read(fds[0], &port, sizeof port) == (ssize_t)sizeof port);
  close(fds[0]);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
  int rc = port ? client(addr) : 1;
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  printf("test_conn (C) client: %d checks, %d failed\n", check_count, check_failures);
  return rc == 0 && check_failures == 0 ? 0 : 1;
}
