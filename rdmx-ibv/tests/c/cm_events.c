/*
 * The connection manager's events as a program sees them through unmodified librdmacm
 * calls (the provider's, under rdmx-ibv exec): a reject carrying private data, an accept
 * carrying private data, a disconnect, and a peer that dies. Every wait is bounded
 * (poll on the channel fd, which also checks that the fd signals queued events).
 *
 *   cm_events server ADDR PORT reject|accept|accept-disconnect PDATA
 *   cm_events client ADDR PORT PDATA [EXPECT]
 *
 * The server prints what the request carried and the events that follow; the client
 * prints every event with its status and private data. Lines start with "EVENT " so
 * the test can read them. Exit status 0 when the sequence is the expected one.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int wait_event(struct rdma_event_channel *ch, int ms,
		      struct rdma_cm_event **ev)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int n = poll(&p, 1, ms);

	if (n == 0) {
		printf("EVENT timeout after %d ms\n", ms);
		fflush(stdout);
		return -1;
	}
	if (n < 0 || rdma_get_cm_event(ch, ev)) {
		perror("rdma_get_cm_event");
		return -1;
	}
	{
		const struct rdma_cm_event *e = *ev;
		const char *pd = e->param.conn.private_data;
		int len = e->param.conn.private_data_len;

		printf("EVENT %s status=%d len=%d pdata=%.*s\n",
		       rdma_event_str(e->event), e->status, len,
		       pd ? (int)strnlen(pd, (size_t)len) : 0, pd ? pd : "");
		fflush(stdout);
	}
	return 0;
}

static int expect(struct rdma_event_channel *ch, int ms,
		  enum rdma_cm_event_type want, struct rdma_cm_event **ev)
{
	if (wait_event(ch, ms, ev))
		return -1;
	if ((*ev)->event != want) {
		fprintf(stderr, "expected %s\n", rdma_event_str(want));
		return -1;
	}
	return 0;
}

static int resolve(const char *addr, const char *port, struct addrinfo **res)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };

	return getaddrinfo(addr, port, &hints, res);
}

static int make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	if (rdma_create_qp(id, NULL, &attr)) {
		perror("rdma_create_qp");
		return -1;
	}
	return 0;
}

static int server(const char *addr, const char *port, const char *mode,
		  const char *pdata)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id, *id;
	struct rdma_cm_event *ev;
	struct addrinfo *ai;
	struct rdma_conn_param param = { 0 };

	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    resolve(addr, port, &ai) || rdma_bind_addr(listen_id, ai->ai_addr) ||
	    rdma_listen(listen_id, 4)) {
		perror("server setup");
		return 1;
	}
	freeaddrinfo(ai);
	printf("LISTENING\n");
	fflush(stdout);
	if (expect(ch, 20000, RDMA_CM_EVENT_CONNECT_REQUEST, &ev))
		return 1;
	id = ev->id;
	if (ev->listen_id != listen_id || ev->param.conn.qp_num == 0) {
		fprintf(stderr, "bad connect request (listen_id, qp_num)\n");
		return 1;
	}
	rdma_ack_cm_event(ev);
	if (!strcmp(mode, "reject")) {
		if (rdma_reject(id, pdata, (uint8_t)(strlen(pdata) + 1))) {
			perror("rdma_reject");
			return 1;
		}
		printf("REJECT_SENT\n");
		fflush(stdout);
		/* Give the REJ time to leave before the id (and its connection) goes. */
		usleep(300000);
		rdma_destroy_id(id);
		rdma_destroy_id(listen_id);
		rdma_destroy_event_channel(ch);
		return 0;
	}
	if (make_qp(id))
		return 1;
	param.private_data = pdata;
	param.private_data_len = (uint8_t)(strlen(pdata) + 1);
	param.responder_resources = 1;
	param.initiator_depth = 1;
	if (rdma_accept(id, &param)) {
		perror("rdma_accept");
		return 1;
	}
	if (expect(ch, 20000, RDMA_CM_EVENT_ESTABLISHED, &ev))
		return 1;
	rdma_ack_cm_event(ev);
	if (!strcmp(mode, "accept-disconnect")) {
		if (rdma_disconnect(id)) {
			perror("rdma_disconnect");
			return 1;
		}
	}
	/* Either our DREQ's answer or the peer's DREQ / death. */
	if (expect(ch, 30000, RDMA_CM_EVENT_DISCONNECTED, &ev))
		return 1;
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return 0;
}

static int client(const char *addr, const char *port, const char *pdata,
		  const char *want)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_conn_param param = { 0 };
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	int ok;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    resolve(addr, port, &ai) ||
	    rdma_resolve_addr(id, NULL, ai->ai_addr, 2000)) {
		perror("client setup");
		return 1;
	}
	freeaddrinfo(ai);
	if (expect(ch, 5000, RDMA_CM_EVENT_ADDR_RESOLVED, &ev))
		return 1;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000) ||
	    expect(ch, 5000, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev))
		return 1;
	rdma_ack_cm_event(ev);
	if (!id->verbs || make_qp(id))
		return 1;
	param.private_data = pdata;
	param.private_data_len = (uint8_t)(strlen(pdata) + 1);
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	if (rdma_connect(id, &param)) {
		perror("rdma_connect");
		return 1;
	}
	if (wait_event(ch, 30000, &ev))
		return 1;
	ok = !strcmp(rdma_event_str(ev->event), want);
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
		rdma_ack_cm_event(ev);
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
		rdma_destroy_event_channel(ch);
		return ok ? 0 : 1;
	}
	rdma_ack_cm_event(ev);
	printf("CONNECTED\n");
	fflush(stdout);
	/* Until the server disconnects (or the test kills this process). */
	if (expect(ch, 30000, RDMA_CM_EVENT_DISCONNECTED, &ev))
		return 1;
	rdma_ack_cm_event(ev);
	if (rdma_disconnect(id)) {
		perror("rdma_disconnect after DISCONNECTED");
		return 1;
	}
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 6 && !strcmp(argv[1], "server"))
		return server(argv[2], argv[3], argv[4], argv[5]);
	if (argc == 6 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3], argv[4], argv[5]);
	fprintf(stderr,
		"usage: cm_events server ADDR PORT reject|accept|accept-disconnect PDATA\n"
		"       cm_events client ADDR PORT PDATA EXPECTED_EVENT\n");
	return 2;
}
