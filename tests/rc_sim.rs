//! The RC engine under a seeded faulty network: every SEND delivered exactly once, in
//! order, with identical bytes; READs and WRITEs move exactly the right bytes; completions
//! in WR order; nothing completes that did not happen; a permanent partition ends in
//! RETRY_EXC_ERR and flushes the rest. A failing run prints its seed; rerun one with
//! `RDMX_SIM_SEED=<seed> cargo test --test rc_sim one_seed`.

mod common;

use common::{Faults, Params, Rng, Sim};
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{QpCaps, RecvWr, SendWr, Sge, SgeList, WcOpcode, WcStatus, WrOpcode, smallvec};

// Node A's regions: SRC (what A sends/writes), DST (where A's READs land).
const A_SRC: u32 = 1;
const A_DST: u32 = 2;
// Node B's regions: RECV (receive buffers), WTGT (WRITE target), RSRC (READ source).
const B_RECV: u32 = 11;
const B_WTGT: u32 = 12;
const B_RSRC: u32 = 13;
const SLOT: u64 = 2048; // bytes per message slot; messages are at most SLOT long
const A_BASE: u64 = 0x1000_0000;
const B_BASE: u64 = 0x2000_0000;

#[derive(Debug, Clone)]
struct Posted {
    wr_id: u64,
    opcode: WrOpcode,
    len: u64,
    slot: u64,
}

fn addr(base: u64, region: u32, slot: u64) -> u64 {
    base + u64::from(region) * 0x100_0000 + slot * SLOT
}

fn setup(sim: &mut Sim, nmsg: u64) {
    let n = (nmsg * SLOT) as usize;
    let a = &mut sim.nodes[0].mem;
    a.add_region(addr(A_BASE, A_SRC, 0), n, A_SRC, 0, access::LOCAL_WRITE);
    a.add_region(addr(A_BASE, A_DST, 0), n, A_DST, 0, access::LOCAL_WRITE);
    let mut fill = Rng::new(nmsg ^ 0xABCD);
    for b in a.region_mut(A_SRC).unwrap() {
        *b = fill.next() as u8;
    }
    let b = &mut sim.nodes[1].mem;
    b.add_region(addr(B_BASE, B_RECV, 0), n, B_RECV, 0, access::LOCAL_WRITE);
    b.add_region(
        addr(B_BASE, B_WTGT, 0),
        n,
        B_WTGT,
        0x7712,
        access::LOCAL_WRITE | access::REMOTE_WRITE,
    );
    b.add_region(
        addr(B_BASE, B_RSRC, 0),
        n,
        B_RSRC,
        0x5531,
        access::REMOTE_READ,
    );
    for x in b.region_mut(B_RSRC).unwrap() {
        *x = fill.next() as u8;
    }
}

/// One seeded run: random WRs from A, receives at B with a dry period, random faults.
/// Returns Err(description) on any violated invariant.
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let heavy = rng.chance(0.5);
    let faults = Faults {
        loss: if heavy {
            0.05
        } else {
            rng.below(3) as f64 / 100.0
        },
        dup: rng.below(4) as f64 / 100.0,
        corrupt: rng.below(3) as f64 / 100.0,
        delay: 1_000,
        jitter: rng.below(20_000),
        partition: rng.chance(0.3).then(|| {
            let s = rng.below(200_000);
            (s, s + rng.below(400_000))
        }),
    };
    let mtu = [256u32, 512, 1024][rng.below(3) as usize];
    let p = Params {
        mtu,
        timeout: 6, // 262 us: well above the simulated RTT
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1 + rng.below(4) as u8,
        max_rd_atomic: 1 + rng.below(4) as u8,
        max_dest_rd_atomic: 4,
        ..Params::default()
    };
    let caps = QpCaps {
        max_unacked_psns: 8 + rng.below(64) as u32,
        ..QpCaps::default()
    };
    // Start PSNs anywhere, including just below the 24-bit wrap.
    let psn_a = if rng.chance(0.3) {
        0xFF_FFF0
    } else {
        rng.below(1 << 24) as u32
    };
    let psn_b = rng.below(1 << 24) as u32;
    let mut sim = Sim::pair(seed, faults, p, p, caps, psn_a, psn_b);
    let nmsg = 4 + rng.below(20);
    setup(&mut sim, nmsg);

    // Post A's WRs (all signaled so every one is checked) and some of B's receives.
    let mut posted = Vec::new();
    for i in 0..nmsg {
        let opcode = [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
        ][rng.below(5) as usize];
        let len = match rng.below(4) {
            0 => 0,
            1 => rng.below(u64::from(mtu)) + 1,
            _ => rng.below(SLOT) + 1,
        };
        let local = if opcode == WrOpcode::RdmaRead {
            A_DST
        } else {
            A_SRC
        };
        // Split the local buffer into up to three SGEs to exercise scatter/gather.
        let cut1 = rng.below(len + 1);
        let cut2 = cut1 + rng.below(len - cut1 + 1);
        let base = addr(A_BASE, local, i);
        let sges: SgeList = [(0, cut1), (cut1, cut2), (cut2, len)]
            .iter()
            .filter(|(s, e)| e > s)
            .map(|&(s, e)| Sge {
                addr: base + s,
                length: (e - s) as u32,
                lkey: local,
            })
            .collect();
        let (remote_addr, rkey) = match opcode {
            WrOpcode::RdmaRead => (addr(B_BASE, B_RSRC, i), 0x5531),
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => (addr(B_BASE, B_WTGT, i), 0x7712),
            _ => (0, 0),
        };
        let fence = if rng.chance(0.1) {
            send_flags::FENCE
        } else {
            0
        };
        sim.nodes[0]
            .qp
            .post_send(SendWr {
                wr_id: 1000 + i,
                opcode,
                flags: send_flags::SIGNALED | fence,
                sges,
                remote_addr,
                rkey,
                imm: 0xC0DE_0000 + i as u32,
            })
            .map_err(|e| format!("post_send: {e}"))?;
        posted.push(Posted {
            wr_id: 1000 + i,
            opcode,
            len,
            slot: i,
        });
    }
    let needs_recv: Vec<&Posted> = posted
        .iter()
        .filter(|w| {
            matches!(
                w.opcode,
                WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
            )
        })
        .collect();
    // Receives: some now, the rest after a dry period (RNR NAKs meanwhile).
    let early = rng.below(needs_recv.len() as u64 + 1) as usize;
    let dry_end = rng.below(500_000);
    let post_recv = |sim: &mut Sim, k: usize| {
        let a = addr(B_BASE, B_RECV, k as u64);
        sim.nodes[1]
            .qp
            .post_recv(RecvWr {
                wr_id: 5000 + k as u64,
                sges: smallvec![Sge {
                    addr: a,
                    length: SLOT as u32,
                    lkey: B_RECV,
                }],
            })
            .unwrap();
    };
    for k in 0..early {
        post_recv(&mut sim, k);
    }
    let mut late_posted = false;
    let limit = 2_000_000_000; // 2 s of virtual time; a healthy run needs far less
    let mut steps = 0;
    let mut a_done = Vec::new();
    let mut b_done = Vec::new();
    loop {
        if !late_posted && sim.now >= dry_end {
            for k in early..needs_recv.len() {
                post_recv(&mut sim, k);
            }
            late_posted = true;
        }
        let busy = sim.advance(limit);
        while let Some(c) = sim.nodes[0].qp.poll_completion() {
            a_done.push(c);
        }
        while let Some(c) = sim.nodes[1].qp.poll_completion() {
            b_done.push(c);
        }
        steps += 1;
        if steps > 2_000_000 {
            return Err("no end after 2M steps".into());
        }
        if !busy {
            if !late_posted {
                sim.now = dry_end;
                continue;
            }
            break;
        }
    }

    // Completions at A: exactly one per WR, in WR order, all successful.
    if a_done.len() != posted.len() {
        return Err(format!(
            "A has {} completions for {} WRs: {a_done:?}",
            a_done.len(),
            posted.len()
        ));
    }
    for (c, w) in a_done.iter().zip(&posted) {
        if c.wr_id != w.wr_id || c.status != WcStatus::Success || c.opcode != w.opcode.wc_opcode() {
            return Err(format!("A completion {c:?} for {w:?}"));
        }
    }
    // Receives at B: one per SEND / WRITE_WITH_IMM, in order, with the right bytes.
    if b_done.len() != needs_recv.len() {
        return Err(format!(
            "B has {} receive completions for {} messages",
            b_done.len(),
            needs_recv.len()
        ));
    }
    let a_src = sim.nodes[0].mem.region(A_SRC).unwrap().to_vec();
    let a_dst = sim.nodes[0].mem.region(A_DST).unwrap();
    let b_recv = sim.nodes[1].mem.region(B_RECV).unwrap();
    let b_wtgt = sim.nodes[1].mem.region(B_WTGT).unwrap();
    let b_rsrc = sim.nodes[1].mem.region(B_RSRC).unwrap();
    for (k, (c, w)) in b_done.iter().zip(&needs_recv).enumerate() {
        let want_op = if w.opcode == WrOpcode::RdmaWriteWithImm {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        let want_imm = (w.opcode != WrOpcode::Send).then_some(0xC0DE_0000 + w.slot as u32);
        if c.wr_id != 5000 + k as u64
            || c.status != WcStatus::Success
            || c.opcode != want_op
            || u64::from(c.byte_len) != w.len
            || c.imm != want_imm
        {
            return Err(format!("B completion #{k} {c:?} for {w:?}"));
        }
        if w.opcode != WrOpcode::RdmaWriteWithImm {
            let s = (w.slot * SLOT) as usize;
            let r = k * SLOT as usize;
            if b_recv[r..r + w.len as usize] != a_src[s..s + w.len as usize] {
                return Err(format!("SEND {w:?} delivered wrong bytes"));
            }
        }
    }
    for w in &posted {
        let s = (w.slot * SLOT) as usize;
        let e = s + w.len as usize;
        let slot_end = s + SLOT as usize;
        let (dst, src) = match w.opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => (b_wtgt, &a_src[..]),
            WrOpcode::RdmaRead => (a_dst, b_rsrc),
            _ => continue,
        };
        // Exactly the message's bytes, and nothing past its end.
        if dst[s..e] != src[s..e] || dst[e..slot_end].iter().any(|&x| x != 0) {
            return Err(format!("{w:?} moved wrong bytes"));
        }
    }
    Ok(())
}

fn seeds() -> u64 {
    std::env::var("RDMX_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

#[test]
fn ten_thousand_seeded_runs_hold_every_invariant() {
    let n = seeds();
    let mut failures = Vec::new();
    for seed in 0..n {
        if let Err(e) = run(seed) {
            failures.push(format!("seed {seed}: {e}"));
            if failures.len() >= 5 {
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing seeds (rerun with RDMX_SIM_SEED=N):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn one_seed() {
    if let Some(seed) = std::env::var("RDMX_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        run(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

#[test]
fn permanent_partition_ends_in_retry_exc_err_and_flushes_the_rest() {
    let faults = Faults {
        delay: 1_000,
        partition: Some((0, u64::MAX)),
        ..Faults::NONE
    };
    let p = Params {
        timeout: 4,
        retry_cnt: 3,
        ..Params::default()
    };
    let mut sim = Sim::pair(7, faults, p, p, QpCaps::default(), 100, 200);
    setup(&mut sim, 4);
    for i in 0..4u64 {
        let sge = Sge {
            addr: addr(A_BASE, A_SRC, i),
            length: 100,
            lkey: A_SRC,
        };
        sim.nodes[0]
            .qp
            .post_send(SendWr {
                wr_id: i,
                opcode: WrOpcode::Send,
                flags: 0,
                sges: smallvec![sge],
                remote_addr: 0,
                rkey: 0,
                imm: 0,
            })
            .unwrap();
    }
    while sim.advance(10_000_000_000) {}
    let done: Vec<_> = std::iter::from_fn(|| sim.nodes[0].qp.poll_completion()).collect();
    let statuses: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ],
        "unsignaled WRs still get error completions"
    );
    assert_eq!(sim.nodes[0].qp.state(), rdmx::rc::QpState::Err);
    // retry_cnt = 3: the first transmission, three retries, and the expiry that gives up.
    assert_eq!(sim.nodes[0].qp.counters().ack_timeouts, 4);
}
