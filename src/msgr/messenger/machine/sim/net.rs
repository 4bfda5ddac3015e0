//! The simulated network: a seeded random source, a virtual clock's event queue, and RC
//! links (reliable and in order until they fail; then whatever was not completed is in
//! doubt: a prefix of the frames in flight arrives, the rest is lost).

use crate::msgr::messenger::wire::Header;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Virtual nanoseconds.
pub type Ns = u64;

pub const US: Ns = 1_000;
pub const MS: Ns = 1_000_000;

/// xorshift64*: small and seedable (the RC simulator's).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    /// A value in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// A SEND (or WRITE WITH IMMEDIATE) on a link: the header, and the message id a data frame
/// carries (what the ledger checks delivery by).
#[derive(Debug, Clone)]
pub struct Frame {
    pub header: Header,
    pub imm: bool,
    pub body: Option<u64>,
}

/// A fault the schedule injects.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// A QP error on one side's end of every link (an error completion there; the other
    /// side learns by the side channel).
    QpError(usize),
    /// One side's side channel closes (both sides learn, in either order, against the
    /// completions in flight).
    SideChannel(usize),
    /// Nothing crosses the network for this long (the side channels stay up).
    BlackHole(Ns),
    /// A process dies and starts again with a new incarnation.
    Restart(usize),
    /// A QP error on one side's end of the links of one path (side, path).
    PathQpError(usize, usize),
    /// The side channel of one path's links closes (side, path).
    PathSideChannel(usize, usize),
    /// Nothing crosses one path for this long (path, length).
    PathHole(usize, Ns),
}

#[derive(Debug)]
pub enum Ev {
    Arrive {
        link: usize,
        to: usize,
        frame: Frame,
    },
    /// Send-queue entries of `side` retired by a completion.
    SqDone {
        link: usize,
        side: usize,
        entries: usize,
    },
    /// `side`'s end of `link` failed (an error completion or the side channel's end).
    LinkErr {
        link: usize,
        side: usize,
        why: &'static str,
    },
    /// A connection attempt of process 0's session `sess` (of incarnation `inc`) ends.
    Connected {
        sess: usize,
        inc: u64,
        path: usize,
    },
    Wake {
        side: usize,
    },
    AppSend {
        side: usize,
    },
    /// The slow consumer of `side` gives chunks back.
    Release {
        side: usize,
    },
    Fault(Fault),
}

/// Events by virtual time, in insertion order within a time.
#[derive(Default)]
pub struct Queue {
    heap: BinaryHeap<Reverse<(Ns, u64)>>,
    slab: Vec<Option<Ev>>,
}

impl Queue {
    pub fn push(&mut self, at: Ns, ev: Ev) {
        let k = self.slab.len() as u64;
        self.slab.push(Some(ev));
        self.heap.push(Reverse((at, k)));
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn pop(&mut self) -> Option<(Ns, Ev)> {
        let Reverse((t, k)) = self.heap.pop()?;
        self.slab[k as usize].take().map(|e| (t, e))
    }
}

/// One RC connection between the processes (end 0 at process 0, the connecting side).
#[derive(Debug, Default)]
pub struct Link {
    /// Each end's link id in its session's machine (None: not attached yet, the
    /// accepting side waits for the hello) and its session's index.
    pub lid: [Option<u64>; 2],
    pub sess: [Option<usize>; 2],
    /// The end is held by its process (not closed).
    pub open: [bool; 2],
    /// Posts are refused (the QP is in error).
    pub failed: bool,
    /// Receives end `s` posted and that no frame consumed yet, and frames on their way
    /// to it: a sender may have at most `posted - in_flight` more in flight.
    pub posted: [u32; 2],
    pub in_flight: [u32; 2],
    /// Send-queue entries in use at each end.
    pub sq: [usize; 2],
    /// The last arrival time towards each end (RC keeps order).
    pub last_arrival: [Ns; 2],
    /// Frames arriving at end `s` after this are lost (the link failed).
    pub cutoff: [Ns; 2],
    /// A retry-exceeded error is already scheduled for the end.
    pub retry_at: [Option<Ns>; 2],
    /// The incarnations of the processes at the ends when the link was made.
    pub inc: [u64; 2],
    /// The path it is a connection of.
    pub path: usize,
}
