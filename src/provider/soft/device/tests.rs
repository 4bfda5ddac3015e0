//! The device as a whole: opening its ports, QPs on them, QP numbers, a QP's deadline
//! reaching the device, the receive-lock handover between a poll and the thread.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::cq::Cq;
use super::super::qp::{SoftQp, TxOptions};
use super::super::sys::EventFd;
use super::qps::{QPN_MASK, qpn_assignable};
use super::*;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::rc::QpCaps;

fn settings() -> Settings {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.settings().unwrap()
}

fn cq() -> Arc<Cq> {
    Arc::new(Cq::new(4, Arc::new(EventFd::new().unwrap())))
}

#[test]
fn a_family_without_a_port_is_refused_clearly_and_ports_count_their_qps() {
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dev = SoftDevice::open(&settings(), &[IpAddr::V4(Ipv4Addr::UNSPECIFIED)]).unwrap();
    assert_eq!(dev.udp_addrs().len(), 1);
    assert!(dev.udp_addr_for(IpAddr::V6(Ipv6Addr::LOCALHOST)).is_none());
    let e = dev
        .create_qp(
            QpCaps::default(),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            cq(),
            cq(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("no IPv6 UDP port"), "{e}");
    // An IPv4-mapped address is IPv4.
    let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
    let qp = dev
        .create_qp(QpCaps::default(), mapped, cq(), cq())
        .unwrap();
    assert!(qp.local_udp().is_ipv4());
    let qp2 = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
    assert_eq!(dev.shared.ports[0].qps.load(Ordering::Acquire), 2);
    dev.destroy_qp(qp.qpn());
    dev.destroy_qp(qp2.qpn());
    dev.destroy_qp(qp2.qpn()); // twice: no underflow
    assert_eq!(dev.shared.ports[0].qps.load(Ordering::Acquire), 0);
}

/// A `draw` that returns `seq` in turn.
fn scripted(seq: &[u32]) -> impl FnMut() -> Result<u32> + '_ {
    let mut it = seq.iter();
    move || Ok(*it.next().expect("scripted draws ran out"))
}

#[test]
fn qp_numbers_skip_reserved_and_live_ones_and_never_replace_a_qp() {
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
    let a = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
    let live = a.qpn();
    assert!(qpn_assignable(live), "{live:#x}");
    // Forced collisions: 0, 1 and 0xFFFFFF are reserved, `live` (also with high bits
    // set) is taken; the first free draw wins.
    let draws = [0, 1, QPN_MASK, live, live | 0x5A00_0000, live ^ 0x80_0000];
    let mut draw = scripted(&draws);
    let mut built = Vec::new();
    let b = dev
        .add_qp(
            &mut |qpn| {
                built.push(qpn);
                SoftQp::new(
                    qpn,
                    QpCaps::default(),
                    v4,
                    cq(),
                    cq(),
                    TxOptions::default(),
                    Default::default(),
                )
            },
            &mut draw,
        )
        .unwrap();
    assert_eq!(b.qpn(), live ^ 0x80_0000);
    assert_eq!(built, [b.qpn()]);
    // The live QP is still the one registered under its number.
    assert!(Arc::ptr_eq(&dev.shared.qps.read()[&live], &a));
    assert_eq!(dev.shared.qps.read().len(), 2);
    // A randomness failure is an error, not a QP.
    let e = dev
        .add_qp(&mut |_| unreachable!(), &mut || {
            Err(Error::new(ErrorKind::Io, "kernel randomness: none"))
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    dev.destroy_qp(a.qpn());
    dev.destroy_qp(b.qpn());
}

#[test]
fn consecutive_qp_numbers_are_not_sequential() {
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
    let qps: Vec<_> = (0..4)
        .map(|_| dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap())
        .collect();
    let n: Vec<u32> = qps.iter().map(|q| q.qpn()).collect();
    println!("QP numbers: {n:x?}");
    for w in n.windows(2) {
        assert!(qpn_assignable(w[1]), "{n:x?}");
        // A counter gives w[0] + 1; random numbers do so with probability 2^-24.
        assert_ne!(w[1], (w[0] + 1) & QPN_MASK, "sequential QP numbers: {n:x?}");
    }
    for q in &qps {
        dev.destroy_qp(q.qpn());
    }
}

#[test]
fn a_qps_deadline_is_read_without_its_lock_and_reaches_the_device() {
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
    let qp = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
    assert_eq!(qp.next_deadline(), None);
    assert_eq!(dev.shared.timers.min(), u64::MAX);
    dev.destroy_qp(qp.qpn());
}

/// The progress thread's request to be woken when an application poll ends
/// (`rx_wanted`, set when it found the receive lock taken while it receives for the
/// application) is answered by the next poll, once: the flag is taken and the wake fd
/// signaled. An app-driven caller (the messenger) never answers (no fence per poll;
/// the thread never asks it).
#[test]
fn a_poll_wakes_the_thread_that_waits_for_the_receive_lock() {
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
    let s = &dev.shared;
    dev.progress_inline();
    assert!(!s.rx_wanted.load(Ordering::SeqCst));
    s.rx_wanted.store(true, Ordering::SeqCst);
    dev.progress_inline();
    assert!(!s.rx_wanted.load(Ordering::SeqCst), "the poll answered");
    dev.set_app_driven(true);
    s.rx_wanted.store(true, Ordering::SeqCst);
    dev.progress_inline();
    assert!(
        s.rx_wanted.load(Ordering::SeqCst),
        "an app-driven poll does not look"
    );
}

#[test]
fn opening_needs_the_first_address_only() {
    // A second address of the same family is skipped; a later one that cannot bind is
    // logged and left out (its family is then refused); the first one must bind.
    let s = settings();
    let dev = SoftDevice::open(
        &s,
        &[
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            // Documentation prefix, not on this host: cannot bind.
            "2001:db8::1".parse().unwrap(),
        ],
    )
    .unwrap();
    assert_eq!(dev.udp_addrs().len(), 1);
    assert!(dev.udp_addr().ip().is_loopback());
    assert!(dev.udp_addr_for("::1".parse().unwrap()).is_none());
    let e = SoftDevice::open(&s, &["192.0.2.1".parse().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    let e = SoftDevice::open(&s, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}
