/*
 * The librdmacm structures programs read directly, as the installed headers lay them
 * out: "name value" lines that tests/ibv_cm.rs compares with the provider's (rdma-sys)
 * definitions.
 */
#include <stddef.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#define SZ(t) printf("sizeof " #t " %zu\n", sizeof(struct t))
#define OFF(t, f) printf("offsetof " #t "." #f " %zu\n", offsetof(struct t, f))

int main(void)
{
	SZ(rdma_cm_id);
	OFF(rdma_cm_id, verbs);
	OFF(rdma_cm_id, channel);
	OFF(rdma_cm_id, context);
	OFF(rdma_cm_id, qp);
	OFF(rdma_cm_id, route);
	OFF(rdma_cm_id, ps);
	OFF(rdma_cm_id, port_num);
	OFF(rdma_cm_id, event);
	OFF(rdma_cm_id, send_cq_channel);
	OFF(rdma_cm_id, send_cq);
	OFF(rdma_cm_id, recv_cq_channel);
	OFF(rdma_cm_id, recv_cq);
	OFF(rdma_cm_id, srq);
	OFF(rdma_cm_id, pd);
	OFF(rdma_cm_id, qp_type);
	SZ(rdma_route);
	OFF(rdma_route, path_rec);
	OFF(rdma_route, num_paths);
	SZ(rdma_addr);
	OFF(rdma_addr, dst_addr);
	OFF(rdma_addr, addr);
	SZ(rdma_cm_event);
	OFF(rdma_cm_event, listen_id);
	OFF(rdma_cm_event, event);
	OFF(rdma_cm_event, status);
	OFF(rdma_cm_event, param);
	SZ(rdma_conn_param);
	OFF(rdma_conn_param, private_data_len);
	OFF(rdma_conn_param, responder_resources);
	OFF(rdma_conn_param, initiator_depth);
	OFF(rdma_conn_param, flow_control);
	OFF(rdma_conn_param, retry_count);
	OFF(rdma_conn_param, rnr_retry_count);
	OFF(rdma_conn_param, srq);
	OFF(rdma_conn_param, qp_num);
	SZ(rdma_ud_param);
	OFF(rdma_ud_param, private_data_len);
	OFF(rdma_ud_param, ah_attr);
	OFF(rdma_ud_param, qp_num);
	OFF(rdma_ud_param, qkey);
	SZ(rdma_addrinfo);
	OFF(rdma_addrinfo, ai_src_addr);
	OFF(rdma_addrinfo, ai_dst_addr);
	OFF(rdma_addrinfo, ai_next);
	SZ(rdma_event_channel);
	SZ(ibv_sa_path_rec);
	return 0;
}
