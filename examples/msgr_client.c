/* A messenger client: sends a message with a 4 KiB payload, handles the reply, says bye.
 * Usage: msgr_client HOST:PORT (an echo server: ffi-tests/msgr_echo_server.c).
 * Build: cc msgr_client.c $(pkg-config --cflags --libs rdmx) */
#include <rdmx.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  static char page[4096];
  memset(page, 'x', sizeof page);
  rdmx_msgr *m = NULL;
  uint64_t s, bye = 0;
  rdmx_msg_iov data = {.kind = RDMX_SEG_COPY, .addr = page, .length = sizeof page};
  if (argc != 2 || rdmx_msgr_new(NULL, NULL, NULL, &m) != RDMX_OK ||
      rdmx_msgr_connect(m, argv[1], RDMX_POLICY_LOSSLESS, &s) != RDMX_OK ||
      rdmx_session_send(m, s, 1, "ping", 4, &data, 1, NULL) != RDMX_OK) {
    fprintf(stderr, "setup: %s\n", rdmx_last_error());
    rdmx_msgr_free(m);
    return 1;
  }
  for (;;) { /* msgr_threads = 0 (the default): polling makes the progress */
    rdmx_msgr_event ev[8];
    size_t n = 0;
    if (rdmx_msgr_poll(m, 1000, ev, 8, &n) != RDMX_OK) break;
    for (size_t i = 0; i < n; i++) {
      if (ev[i].kind == RDMX_MSGR_EVENT_MESSAGE) { /* the reply: ours to free */
        size_t len = 0;
        const char *front = rdmx_msg_front(ev[i].msg, &len);
        printf("reply: type %u, front '%.*s', %zu data bytes\n", rdmx_msg_type(ev[i].msg),
               (int)len, front, rdmx_msg_seg_len(ev[i].msg, 0));
        rdmx_msg_free(ev[i].msg);
        rdmx_session_send(m, s, 2, NULL, 0, NULL, 0, &bye); /* type 2: done */
      } else if (ev[i].kind == RDMX_MSGR_EVENT_SEND_COMPLETE && ev[i].send_id == bye) {
        rdmx_session_close(m, s);
        rdmx_msgr_free(m);
        return ev[i].status == RDMX_OK ? 0 : 1;
      } else if (ev[i].kind == RDMX_MSGR_EVENT_RESET) {
        fprintf(stderr, "session reset: %s\n", ev[i].text);
        rdmx_msgr_free(m);
        return 1;
      }
    }
  }
  fprintf(stderr, "poll: %s\n", rdmx_last_error());
  rdmx_msgr_free(m);
  return 1;
}
