//! The server's side of a run, asked for over the run's own connection: `rdmx-perf tune`
//! sends a SEND whose first byte is [`REQUEST`]; the server answers with a SEND with
//! immediate [`ANSWER_IMM`] carrying [`ServerStats`] (its process CPU time from getrusage,
//! its device's stall accounting, and the counters of that connection's QP). Asked before
//! and after a run, the difference is what the server spent on it, so CPU per op counts
//! both ends and the advisor sees the responder's stalls.

use rdmx::msgr::{Connection, Context};

/// First byte of a stats request (PING is 0x50, send_bw payloads start with 0).
pub const REQUEST: u8 = 0x53; // 'S'
/// Immediate data of the answer.
pub const ANSWER_IMM: u32 = 0x5354_4154; // "STAT"
/// Bytes of the answer (the fields below, little-endian u64 each, zero-padded).
pub const ANSWER_LEN: usize = 128;
/// Fields in the answer, in order.
const FIELDS: usize = 11;

/// What the server reports (cumulative since it started, or since the connection opened for
/// the per-connection counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Process user + system CPU time (getrusage RUSAGE_SELF), ns.
    pub cpu_ns: u64,
    /// The server device's stall accounting: progress passes that came late, their total
    /// and longest, ns (`ProgressStats`).
    pub stalls: u64,
    pub stalled_ns: u64,
    pub max_stall_ns: u64,
    /// The connection's QP counters, server side.
    pub retransmits: u64,
    pub duplicates_received: u64,
    pub ack_timeouts: u64,
    pub rnr_naks_sent: u64,
    pub seq_naks_sent: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
}

impl ServerStats {
    fn fields(&self) -> [u64; FIELDS] {
        [
            self.cpu_ns,
            self.stalls,
            self.stalled_ns,
            self.max_stall_ns,
            self.retransmits,
            self.duplicates_received,
            self.ack_timeouts,
            self.rnr_naks_sent,
            self.seq_naks_sent,
            self.tx_packets,
            self.rx_packets,
        ]
    }

    pub fn encode(&self) -> [u8; ANSWER_LEN] {
        let mut b = [0u8; ANSWER_LEN];
        for (i, v) in self.fields().iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Decodes an answer; `None` if it is shorter than the fields.
    pub fn decode(b: &[u8]) -> Option<ServerStats> {
        if b.len() < FIELDS * 8 {
            return None;
        }
        let f = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        Some(ServerStats {
            cpu_ns: f(0),
            stalls: f(1),
            stalled_ns: f(2),
            max_stall_ns: f(3),
            retransmits: f(4),
            duplicates_received: f(5),
            ack_timeouts: f(6),
            rnr_naks_sent: f(7),
            seq_naks_sent: f(8),
            tx_packets: f(9),
            rx_packets: f(10),
        })
    }

    /// `self - before`, field by field (saturating). The longest stall is `self`'s when it
    /// grew during the run; else the run's mean stall (a lower bound: the server keeps only
    /// its all-time longest, which an earlier run may hold).
    pub fn since(&self, before: &ServerStats) -> ServerStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        ServerStats {
            cpu_ns: d(self.cpu_ns, before.cpu_ns),
            stalls: d(self.stalls, before.stalls),
            stalled_ns: d(self.stalled_ns, before.stalled_ns),
            max_stall_ns: if self.max_stall_ns > before.max_stall_ns {
                self.max_stall_ns
            } else {
                d(self.stalled_ns, before.stalled_ns)
                    .checked_div(d(self.stalls, before.stalls))
                    .unwrap_or(0)
            },
            retransmits: d(self.retransmits, before.retransmits),
            duplicates_received: d(self.duplicates_received, before.duplicates_received),
            ack_timeouts: d(self.ack_timeouts, before.ack_timeouts),
            rnr_naks_sent: d(self.rnr_naks_sent, before.rnr_naks_sent),
            seq_naks_sent: d(self.seq_naks_sent, before.seq_naks_sent),
            tx_packets: d(self.tx_packets, before.tx_packets),
            rx_packets: d(self.rx_packets, before.rx_packets),
        }
    }
}

/// This process's user + system CPU time, ns (every thread: the progress thread too).
pub fn process_cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage writes the struct we pass.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(r.ru_utime) + ns(r.ru_stime)
}

/// The server's answer to a stats request on `conn`.
pub fn answer(_ctx: &Context, conn: &Connection) -> [u8; ANSWER_LEN] {
    let p = conn.progress_stats();
    let c = conn.counters();
    ServerStats {
        cpu_ns: process_cpu_ns(),
        stalls: p.stalls,
        stalled_ns: p.stalled_ns,
        max_stall_ns: p.max_stall_ns,
        retransmits: c.retransmits,
        duplicates_received: c.duplicates_received,
        ack_timeouts: c.ack_timeouts,
        rnr_naks_sent: c.rnr_naks_sent,
        seq_naks_sent: c.seq_naks_sent,
        tx_packets: c.tx_packets,
        rx_packets: c.rx_packets,
    }
    .encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_round_trips_and_differences_saturate() {
        let a = ServerStats {
            cpu_ns: 5,
            stalls: 2,
            stalled_ns: 900,
            max_stall_ns: 700,
            retransmits: 1,
            duplicates_received: 3,
            ack_timeouts: 4,
            rnr_naks_sent: 6,
            seq_naks_sent: 7,
            tx_packets: 8,
            rx_packets: u64::MAX,
        };
        assert_eq!(ServerStats::decode(&a.encode()), Some(a));
        assert_eq!(ServerStats::decode(&[0u8; 40]), None);
        let b = ServerStats {
            cpu_ns: 15,
            stalls: 3,
            stalled_ns: 1000,
            max_stall_ns: 700,
            ..a
        };
        let d = b.since(&a);
        assert_eq!((d.cpu_ns, d.stalls, d.stalled_ns), (10, 1, 100));
        assert_eq!(d.max_stall_ns, 100, "not grown: the run's mean stall");
        let c = ServerStats {
            max_stall_ns: 800,
            ..b
        };
        assert_eq!(c.since(&a).max_stall_ns, 800);
        assert_eq!(a.since(&a).max_stall_ns, 0);
        assert_eq!(a.since(&b).cpu_ns, 0);
    }
}
