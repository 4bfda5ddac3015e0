//! The decisions the machine makes, as pure functions of what they read (each tested on
//! literal inputs below). The machine applies them; the driver (`session.rs`, `link.rs`)
//! only carries out what the machine decided with them.

use crate::msgr::messenger::wire::{GRANT_LEN, Header, Kind, SLOT, flags};

/// Where a message's sequence number puts it, `received` being the last one accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The next one: accepted.
    Next,
    /// Delivered or accepted before (a replay): dropped.
    Old,
    /// One is missing: the link cannot have lost it (RC), so the peer is broken: fault.
    Gap,
}

pub fn order(received: u64, seq: u64) -> Order {
    match seq.cmp(&(received + 1)) {
        std::cmp::Ordering::Less => Order::Old,
        std::cmp::Ordering::Equal => Order::Next,
        std::cmp::Ordering::Greater => Order::Gap,
    }
}

/// A data message says its sender is starved (the receiver grows its window) when
/// messages wait behind it and its credits are nearly gone.
pub fn starved(behind: usize, tx: u32) -> bool {
    behind > 0 && tx <= 2
}

/// What a pass's control step reads.
#[derive(Debug, Clone, Copy)]
pub struct ControlIn {
    /// Messages were delivered that the peer was not told of.
    pub ack_owed: bool,
    /// Something went out in this pass (it carried the acknowledgement).
    pub sent_in_pass: bool,
    /// Messages were delivered since the last pass.
    pub delivered_in_pass: bool,
    /// The acknowledgement was held back a pass already.
    pub ack_deferred: bool,
    pub announce_due: bool,
    pub ping_due: bool,
    /// The peer has a data credit left (it is not waiting for ours).
    pub peer_can_send_data: bool,
    pub can_send_control: bool,
    /// Send-queue entries free after this pass's messages.
    pub sq_free: usize,
}

/// What a pass's control step decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// The frame to send (Ack or Ping), if any.
    pub frame: Option<Kind>,
    /// The acknowledgement is held back a pass.
    pub deferred: bool,
    /// A frame is due and the credits forbid it: post a receive for it to announce
    /// ([`crate::msgr::messenger::credits::Credits::room_to_speak`]).
    pub needs_receive: bool,
}

/// The control frame a pass sends, whether the acknowledgement is now held back, and
/// whether a frame waits for a receive to announce. An acknowledgement or announcement due after
/// messages were delivered waits one pass (their callbacks run after it, and a reply sent
/// from one carries both), unless it waited a pass already or the peer is down to its
/// control credit. (Announcing at once cost request/reply a control message each way per
/// round trip, and each consumed a receive whose repost was owed again.)
pub fn control(c: ControlIn) -> Control {
    let mut ack = c.ack_owed && !c.sent_in_pass;
    let mut announce = c.announce_due;
    let mut deferred = c.ack_deferred;
    if (ack || announce) && c.delivered_in_pass && !c.ack_deferred && c.peer_can_send_data {
        deferred = true;
        ack = false;
        announce = false;
    }
    // A send queue full of READs and messages waits for their completions (the data path
    // leaves the control reserve, so only when the QP itself is behind).
    let due = ack || announce || c.ping_due;
    let frame = (due && c.can_send_control && c.sq_free > 0).then_some(if c.ping_due {
        Kind::Ping
    } else {
        Kind::Ack
    });
    Control {
        frame,
        deferred,
        needs_receive: due && !c.can_send_control,
    }
}

/// The credits header `h` announces of `owed`: all of them, or (our receives granted to
/// the peer, `msgr_eager_write`) as many grants as its slot holds after the inline front;
/// the rest wait for a later header. Sets the `GRANTS` flag then.
pub fn announce(h: &mut Header, owed: u32, eager_write: bool) -> u32 {
    if !eager_write {
        return owed;
    }
    h.flags |= flags::GRANTS;
    let room = SLOT.saturating_sub(h.grants_at()) / GRANT_LEN;
    owed.min(room as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_of_sequence_numbers() {
        assert_eq!(order(4, 5), Order::Next);
        assert_eq!(order(4, 4), Order::Old);
        assert_eq!(order(4, 1), Order::Old);
        assert_eq!(order(4, 6), Order::Gap);
        assert_eq!(order(0, 1), Order::Next);
    }

    fn quiet() -> ControlIn {
        ControlIn {
            ack_owed: false,
            sent_in_pass: false,
            delivered_in_pass: false,
            ack_deferred: false,
            announce_due: false,
            ping_due: false,
            peer_can_send_data: true,
            can_send_control: true,
            sq_free: 8,
        }
    }

    #[test]
    fn control_frames() {
        let c = |c: ControlIn| {
            let r = control(c);
            (r.frame, r.deferred)
        };
        assert_eq!(c(quiet()), (None, false));
        let owed = ControlIn {
            ack_owed: true,
            ..quiet()
        };
        assert_eq!(c(owed), (Some(Kind::Ack), false));
        let fresh = ControlIn {
            delivered_in_pass: true,
            ..owed
        };
        assert_eq!(c(fresh), (None, true), "held a pass");
        let again = ControlIn {
            ack_deferred: true,
            ..fresh
        };
        assert_eq!(c(again), (Some(Kind::Ack), true));
        let peer_dry = ControlIn {
            peer_can_send_data: false,
            ..fresh
        };
        assert_eq!(c(peer_dry), (Some(Kind::Ack), false));
        let carried = ControlIn {
            sent_in_pass: true,
            ..owed
        };
        assert_eq!(c(carried), (None, false));
        let ping = ControlIn {
            ping_due: true,
            ..quiet()
        };
        assert_eq!(c(ping), (Some(Kind::Ping), false));
        let no_credit = ControlIn {
            can_send_control: false,
            ..ping
        };
        assert_eq!(c(no_credit), (None, false));
        assert!(control(no_credit).needs_receive);
        assert!(!control(ping).needs_receive);
        let sq_full = ControlIn { sq_free: 0, ..ping };
        assert_eq!(c(sq_full), (None, false));
    }

    #[test]
    fn announcements_fit_the_slot() {
        let mut h = Header::new(Kind::Ack);
        assert_eq!(announce(&mut h, 50, false), 50);
        assert!(!h.has(flags::GRANTS));
        assert_eq!(announce(&mut h, 50, true), 37);
        assert!(h.has(flags::GRANTS));
        let mut m = Header::new(Kind::Msg);
        m.front_len = 440; // padded to 448: (512 - 64 - 448) / 12 = 0
        assert_eq!(announce(&mut m, 5, true), 0);
        m.flags |= flags::RNDV; // the front is in the descriptor block
        assert_eq!(announce(&mut m, 5, true), 5);
    }
}
