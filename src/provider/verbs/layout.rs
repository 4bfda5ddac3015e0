//! The structures rdma-sys defines by hand (not bindgen: `ibv_wc`, `ibv_send_wr`,
//! `ibv_gid`, `ibv_global_route`, `ibv_ah_attr`), `struct ibv_async_event` as `events`
//! reads it, and the `context->ops` slots its re-implementations of verbs.h's
//! `static inline` data-path verbs call through, checked against a C probe compiled on the
//! installed headers: a mismatch would make every post or poll read or write the wrong
//! bytes.

use rdma_sys as ib;
use std::mem::{offset_of, size_of};

macro_rules! facts {
    ($($name:literal => $rust:expr, $c:literal;)*) => {
        (
            vec![$(($name, $rust as usize)),*],
            concat!($("printf(\"%zu\\n\", (size_t)(", $c, "));\n"),*),
        )
    };
}

#[test]
fn hand_written_structures_and_ops_match_the_installed_headers() {
    let (rust, probe): (Vec<(&str, usize)>, &str) = facts! {
        "sizeof ibv_wc" => size_of::<ib::ibv_wc>(), "sizeof(struct ibv_wc)";
        "ibv_wc.status" => offset_of!(ib::ibv_wc, status), "offsetof(struct ibv_wc, status)";
        "ibv_wc.opcode" => offset_of!(ib::ibv_wc, opcode), "offsetof(struct ibv_wc, opcode)";
        "ibv_wc.byte_len" => offset_of!(ib::ibv_wc, byte_len), "offsetof(struct ibv_wc, byte_len)";
        "ibv_wc.imm_data" => offset_of!(ib::ibv_wc, imm_data_invalidated_rkey_union), "offsetof(struct ibv_wc, imm_data)";
        "ibv_wc.qp_num" => offset_of!(ib::ibv_wc, qp_num), "offsetof(struct ibv_wc, qp_num)";
        "ibv_wc.wc_flags" => offset_of!(ib::ibv_wc, wc_flags), "offsetof(struct ibv_wc, wc_flags)";
        "sizeof ibv_send_wr" => size_of::<ib::ibv_send_wr>(), "sizeof(struct ibv_send_wr)";
        "ibv_send_wr.next" => offset_of!(ib::ibv_send_wr, next), "offsetof(struct ibv_send_wr, next)";
        "ibv_send_wr.sg_list" => offset_of!(ib::ibv_send_wr, sg_list), "offsetof(struct ibv_send_wr, sg_list)";
        "ibv_send_wr.num_sge" => offset_of!(ib::ibv_send_wr, num_sge), "offsetof(struct ibv_send_wr, num_sge)";
        "ibv_send_wr.opcode" => offset_of!(ib::ibv_send_wr, opcode), "offsetof(struct ibv_send_wr, opcode)";
        "ibv_send_wr.send_flags" => offset_of!(ib::ibv_send_wr, send_flags), "offsetof(struct ibv_send_wr, send_flags)";
        "ibv_send_wr.imm_data" => offset_of!(ib::ibv_send_wr, imm_data_invalidated_rkey_union), "offsetof(struct ibv_send_wr, imm_data)";
        "ibv_send_wr.wr.rdma.remote_addr" => offset_of!(ib::ibv_send_wr, wr), "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)";
        "ibv_send_wr.wr.rdma.rkey" => offset_of!(ib::ibv_send_wr, wr) + offset_of!(ib::rdma_t, rkey), "offsetof(struct ibv_send_wr, wr.rdma.rkey)";
        "sizeof ibv_sge" => size_of::<ib::ibv_sge>(), "sizeof(struct ibv_sge)";
        "sizeof ibv_recv_wr" => size_of::<ib::ibv_recv_wr>(), "sizeof(struct ibv_recv_wr)";
        "sizeof ibv_gid" => size_of::<ib::ibv_gid>(), "sizeof(union ibv_gid)";
        "sizeof ibv_ah_attr" => size_of::<ib::ibv_ah_attr>(), "sizeof(struct ibv_ah_attr)";
        "ibv_ah_attr.dlid" => offset_of!(ib::ibv_ah_attr, dlid), "offsetof(struct ibv_ah_attr, dlid)";
        "ibv_ah_attr.sl" => offset_of!(ib::ibv_ah_attr, sl), "offsetof(struct ibv_ah_attr, sl)";
        "ibv_ah_attr.is_global" => offset_of!(ib::ibv_ah_attr, is_global), "offsetof(struct ibv_ah_attr, is_global)";
        "ibv_ah_attr.port_num" => offset_of!(ib::ibv_ah_attr, port_num), "offsetof(struct ibv_ah_attr, port_num)";
        "ibv_global_route.sgid_index" => offset_of!(ib::ibv_global_route, sgid_index), "offsetof(struct ibv_global_route, sgid_index)";
        "ibv_global_route.traffic_class" => offset_of!(ib::ibv_global_route, traffic_class), "offsetof(struct ibv_global_route, traffic_class)";
        "sizeof ibv_qp_attr" => size_of::<ib::ibv_qp_attr>(), "sizeof(struct ibv_qp_attr)";
        "ibv_qp_attr.ah_attr" => offset_of!(ib::ibv_qp_attr, ah_attr), "offsetof(struct ibv_qp_attr, ah_attr)";
        "ibv_qp_attr.timeout" => offset_of!(ib::ibv_qp_attr, timeout), "offsetof(struct ibv_qp_attr, timeout)";
        "ibv_context.ops.post_send" => offset_of!(ib::ibv_context, ops) + offset_of!(ib::ibv_context_ops, post_send), "offsetof(struct ibv_context, ops.post_send)";
        "ibv_context.ops.post_recv" => offset_of!(ib::ibv_context, ops) + offset_of!(ib::ibv_context_ops, post_recv), "offsetof(struct ibv_context, ops.post_recv)";
        "ibv_context.ops.poll_cq" => offset_of!(ib::ibv_context, ops) + offset_of!(ib::ibv_context_ops, poll_cq), "offsetof(struct ibv_context, ops.poll_cq)";
        "ibv_context.ops.req_notify_cq" => offset_of!(ib::ibv_context, ops) + offset_of!(ib::ibv_context_ops, req_notify_cq), "offsetof(struct ibv_context, ops.req_notify_cq)";
        "ibv_qp.context" => offset_of!(ib::ibv_qp, context), "offsetof(struct ibv_qp, context)";
        "ibv_cq.context" => offset_of!(ib::ibv_cq, context), "offsetof(struct ibv_cq, context)";
        "IBV_LINK_LAYER_ETHERNET" => super::device::LINK_LAYER_ETHERNET, "IBV_LINK_LAYER_ETHERNET";
        "IBV_WC_WITH_IMM" => ib::ibv_wc_flags::IBV_WC_WITH_IMM.0, "IBV_WC_WITH_IMM";
        "IBV_WC_WITH_INV" => ib::ibv_wc_flags::IBV_WC_WITH_INV.0, "IBV_WC_WITH_INV";
        "IBV_WC_WITH_INV (rc::verbs)" => crate::rc::verbs::wc_flags::WITH_INV, "IBV_WC_WITH_INV";
        "IBV_WC_RECV_RDMA_WITH_IMM" => ib::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, "IBV_WC_RECV_RDMA_WITH_IMM";
        "IBV_WR_RDMA_READ" => crate::rc::WrOpcode::RdmaRead as u8, "IBV_WR_RDMA_READ";
        "IBV_WR_SEND_WITH_IMM" => crate::rc::WrOpcode::SendWithImm as u8, "IBV_WR_SEND_WITH_IMM";
        "IBV_WR_RDMA_WRITE_WITH_IMM" => crate::rc::WrOpcode::RdmaWriteWithImm as u8, "IBV_WR_RDMA_WRITE_WITH_IMM";
        "IBV_WR_SEND_WITH_INV" => crate::rc::WrOpcode::SendWithInv as u8, "IBV_WR_SEND_WITH_INV";
        "IBV_SEND_INLINE" => crate::rc::verbs::send_flags::INLINE, "IBV_SEND_INLINE";
        "sizeof ibv_async_event" => size_of::<super::events::RawEvent>(), "sizeof(struct ibv_async_event)";
        "ibv_async_event.event_type" => offset_of!(super::events::RawEvent, event_type), "offsetof(struct ibv_async_event, event_type)";
        "IBV_EVENT_CQ_ERR" => super::events::kind::CQ_ERR, "IBV_EVENT_CQ_ERR";
        "IBV_EVENT_QP_FATAL" => super::events::kind::QP_FATAL, "IBV_EVENT_QP_FATAL";
        "IBV_EVENT_QP_ACCESS_ERR" => super::events::kind::QP_ACCESS_ERR, "IBV_EVENT_QP_ACCESS_ERR";
        "IBV_EVENT_PATH_MIG_ERR" => super::events::kind::PATH_MIG_ERR, "IBV_EVENT_PATH_MIG_ERR";
        "IBV_EVENT_DEVICE_FATAL" => super::events::kind::DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL";
        "IBV_EVENT_PORT_ERR" => super::events::kind::PORT_ERR, "IBV_EVENT_PORT_ERR";
        "IBV_EVENT_QP_LAST_WQE_REACHED" => super::events::kind::QP_LAST_WQE_REACHED, "IBV_EVENT_QP_LAST_WQE_REACHED";
        "IBV_EVENT_GID_CHANGE" => super::events::kind::GID_CHANGE, "IBV_EVENT_GID_CHANGE";
        "IBV_EVENT_WQ_FATAL" => super::events::kind::WQ_FATAL, "IBV_EVENT_WQ_FATAL";
    };
    let dir = std::env::temp_dir().join(format!("rdmx-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
             int main(void) {{\n{probe}return 0;\n}}\n"
        ),
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(
        out.status.success(),
        "probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let c: Vec<usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(c.len(), rust.len());
    let bad: Vec<String> = rust
        .iter()
        .zip(&c)
        .filter(|((_, r), c)| r != *c)
        .map(|((n, r), c)| format!("{n}: rust {r}, C {c}"))
        .collect();
    assert!(bad.is_empty(), "layout mismatches: {bad:?}");
}
