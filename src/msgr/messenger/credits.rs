//! Credit flow control: a sender never sends more messages than the receiver has posted
//! receives for it, so a receiver never has to RNR-NAK.
//!
//! Each side counts `tx` (sends it may still make: receives the peer posted for it and
//! announced) and, for its own receive queue, `posted` (receives posted now) and `owed`
//! (posted but not yet announced). Every header announces `owed` (then 0). A side keeps
//! its last credit for control messages (acknowledgements, credits, keepalive, hello):
//! data needs two. And the last credit goes only on a frame that announces credits: a side
//! that spends it leaves the peer at least one, so the peer can always announce what it
//! owes in turn, and two sides that both ran dry of data credits cannot deadlock.
//!
//! (Until the session machine's simulator found it, an acknowledgement or keepalive that
//! announced nothing could take the last credit: two sides doing so at once, each with
//! the other's messages in flight, were left at zero credits, each owing the other the
//! receives those messages consumed and unable to say so: seed 48 of
//! `machine::sim`, reproduced by the test `the_last_credit_goes_only_with_credits` below.)
//!
//! The window (receives kept posted) starts at `msgr_recv_window_min` and doubles up to
//! `msgr_recv_window` while the peer says it is starved (a header flag); a session idle
//! for a keepalive interval falls back to the minimum (consumed receives beyond it are not
//! reposted), which is what keeps idle sessions small.
//!
//! A receiver may **pause** a session ([`Credits::set_paused`], the application's
//! `Messenger::pause_receive`): the window drops to one receive, which keeps control
//! frames flowing (a peer needs two credits for data, one for control) and stops the
//! peer's data once the credits it already holds are spent. Its sends then wait in its own
//! queue (`Full` at its `send`): a receiver that cannot keep up stalls the peer, not
//! itself. Each control frame this side sends on its last credit announces one receive
//! (see above), so a paused peer may get one data message through per such frame: a
//! trickle bounded by this side's control traffic, not by the peer.

/// One link's credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Sends this side may still make.
    pub tx: u32,
    /// Receives posted for the peer now.
    pub posted: u32,
    /// Posted receives not yet announced to the peer.
    pub owed: u32,
    /// Receives this side aims to keep posted.
    pub window: u32,
    min: u32,
    max: u32,
    /// The receiver paused the session: the window stays at one receive.
    paused: bool,
}

impl Credits {
    /// A new link with `posted` receives already posted (by the on-connect hook). The
    /// first send (the hello) may use the one receive both sides post at least; the hello
    /// announces the rest.
    pub fn new(posted: u32, min: u32, max: u32) -> Credits {
        Credits {
            tx: 1,
            posted,
            owed: posted.saturating_sub(1),
            window: min.max(1),
            min: min.max(1),
            max: max.max(min),
            paused: false,
        }
    }

    /// Pauses (one receive kept posted: control only) or resumes (back to the minimum
    /// window, which grows again while the peer is starved) the peer's data.
    pub fn set_paused(&mut self, paused: bool) {
        if paused {
            self.window = 1;
        } else if self.paused {
            self.window = self.min;
        }
        self.paused = paused;
    }

    /// Whether a data message may go now (keeping one credit for control messages).
    pub fn can_send_data(&self) -> bool {
        self.tx >= 2
    }

    /// Whether a control message may go now: with a credit to spare, or on the last one
    /// when it announces credits (see the module doc).
    pub fn can_send_control(&self) -> bool {
        self.tx >= 2 || (self.tx == 1 && self.owed > 0)
    }

    /// Takes a credit for a send whose header announced `announced` of the credits owed
    /// (as many as its slot had room to grant; the rest wait for a later header).
    pub fn on_send(&mut self, announced: u32) {
        self.tx = self.tx.saturating_sub(1);
        self.owed = self.owed.saturating_sub(announced);
    }

    /// The peer announced `n` more credits.
    pub fn on_grant(&mut self, n: u32) {
        self.tx = self.tx.saturating_add(n);
    }

    /// One of our receives was consumed.
    pub fn on_receive(&mut self) {
        self.posted = self.posted.saturating_sub(1);
    }

    /// How many receives to post to reach the window.
    pub fn deficit(&self) -> u32 {
        self.window.saturating_sub(self.posted)
    }

    /// `n` receives were posted.
    pub fn on_posted(&mut self, n: u32) {
        self.posted += n;
        self.owed += n;
        if self.paused {
            // A receive `room_to_speak` added was posted: paused, the window is one again,
            // so the peer's next data message does not earn a repost.
            self.window = 1;
        }
    }

    /// The peer is starved: double the window (up to the maximum).
    pub fn grow(&mut self) {
        if !self.paused {
            self.window = (self.window * 2).clamp(self.min, self.max);
        }
    }

    /// Idle: back to the minimum window.
    pub fn shrink(&mut self) {
        if !self.paused {
            self.window = self.min;
        }
    }

    /// A control frame is due but the last credit has nothing to announce: one more
    /// receive (within the maximum window) gives it something, so the next pass posts it
    /// and the frame goes with it. (Without it a receiver that only acknowledges, its
    /// window shrunk by a keepalive, waited for the peer's next keepalive to ack.)
    pub fn room_to_speak(&mut self) {
        if self.tx == 1 && self.owed == 0 {
            self.window = self.window.max((self.posted + 1).min(self.max));
        }
    }

    /// Whether the peer may still send a data message on the credits it was told of
    /// (receives announced and not consumed yet), keeping one for control.
    pub fn peer_can_send_data(&self) -> bool {
        self.posted.saturating_sub(self.owed) >= 2
    }

    /// Whether enough credits are owed to announce them in a message of their own: half
    /// the window, or any when the peer's credits are nearly gone. (Until the session
    /// machine's simulator found it, only the first: a side whose pool let it post fewer
    /// than half its window never announced them, and a peer out of credits waited for
    /// ever, or for the next keepalive: seed 25125 of `machine::sim`.)
    pub fn announce_due(&self) -> bool {
        self.owed > 0 && (self.owed >= (self.window / 2).max(1) || !self.peer_can_send_data())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_receiver_grants_control_credits_only() {
        // The peer holds 8 credits, we have 8 posted and announced.
        let mut c = Credits::new(8, 8, 64);
        c.on_send(7);
        assert_eq!((c.posted, c.owed), (8, 0));
        c.set_paused(true);
        assert!(c.paused);
        // The peer spends its 8 credits (one with data, the last on control): nothing is
        // reposted until only one receive is left, then one.
        for _ in 0..7 {
            c.on_receive();
            assert_eq!(c.deficit(), 0);
        }
        c.on_receive();
        assert_eq!(c.deficit(), 1);
        c.on_posted(1);
        assert_eq!(c.deficit(), 0);
        // Starved peers and idleness do not move a paused window.
        c.grow();
        c.shrink();
        assert_eq!(c.deficit(), 0);
        // Speaking on the last credit posts one more, once: the window is one again after.
        c.tx = 1;
        c.owed = 0;
        c.room_to_speak();
        assert_eq!(c.deficit(), 1);
        c.on_posted(1);
        c.on_send(1);
        c.on_receive();
        assert_eq!(c.deficit(), 0, "one receive is posted: nothing to repost");
        // Resumed: back to the minimum window, which grows again.
        c.set_paused(false);
        assert_eq!(c.deficit(), 8 - 1);
        c.grow();
        assert_eq!(c.deficit(), 16 - 1);
    }

    #[test]
    fn data_keeps_one_credit_for_control() {
        let mut c = Credits::new(4, 4, 64);
        assert_eq!(c.owed, 3);
        assert!(!c.can_send_data());
        assert!(c.can_send_control());
        c.on_send(3); // the hello announces the rest
        assert_eq!(c.owed, 0);
        assert_eq!(c.tx, 0);
        c.on_grant(3);
        assert!(c.can_send_data());
        c.on_send(0);
        c.on_send(0);
        assert!(!c.can_send_data());
        assert!(!c.can_send_control(), "the last credit announces something");
        c.on_posted(1);
        assert!(c.can_send_control());
    }

    /// Two sides each down to the last credit, each with nothing to announce: neither may
    /// spend it on an empty acknowledgement. Had both done so, the other's messages in
    /// flight (consumed receives, reposted, owed) could never be announced.
    #[test]
    fn the_last_credit_goes_only_with_credits() {
        let mut a = Credits::new(4, 4, 64);
        a.on_send(3);
        a.on_grant(2);
        assert_eq!((a.tx, a.owed), (2, 0));
        assert!(a.can_send_control());
        a.on_send(0);
        assert!(!a.can_send_control());
        // A message of the peer arrives: its receive reposted is owed, and the last
        // credit may carry the announcement.
        a.on_receive();
        a.on_posted(1);
        assert!(a.can_send_control());
        a.on_send(1);
        assert_eq!(a.tx, 0);
    }

    #[test]
    fn credits_are_announced_when_the_peer_runs_dry_even_below_half_the_window() {
        let mut c = Credits::new(4, 4, 40);
        c.on_send(3);
        c.grow();
        c.grow();
        c.grow(); // window 32: half is 16
        for _ in 0..4 {
            c.on_receive(); // the peer used every receive it was told of
        }
        c.on_posted(10); // the pool allowed 10 of the 32
        assert!(!c.peer_can_send_data());
        assert!(c.announce_due());
        c.on_send(10);
        assert!(c.peer_can_send_data() && !c.announce_due());
    }

    #[test]
    fn a_due_control_frame_gets_a_receive_to_announce() {
        let mut a = Credits::new(4, 4, 8);
        a.on_send(3);
        a.on_grant(1);
        assert_eq!((a.tx, a.owed, a.deficit()), (1, 0, 0));
        a.room_to_speak();
        assert_eq!(a.deficit(), 1);
        a.on_posted(1);
        assert!(a.can_send_control());
        // Never beyond the maximum window.
        let mut b = Credits::new(8, 4, 8);
        b.on_send(7);
        b.room_to_speak();
        assert_eq!(b.deficit(), 0);
    }

    #[test]
    fn window_grows_and_shrinks_within_bounds() {
        let mut c = Credits::new(4, 4, 16);
        c.grow();
        assert_eq!(c.window, 8);
        assert_eq!(c.deficit(), 4);
        c.on_posted(4);
        c.grow();
        c.grow();
        assert_eq!(c.window, 16);
        c.shrink();
        assert_eq!(c.window, 4);
        assert_eq!(c.deficit(), 0);
        for _ in 0..8 {
            c.on_receive();
        }
        assert!(c.announce_due());
    }
}
