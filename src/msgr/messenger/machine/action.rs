//! What a session machine tells its driver to do ([`Action`]), what it tells the
//! application ([`Notice`]), and what it made of a received frame ([`Verdict`]).

use crate::error::Error;
use crate::msgr::messenger::types::PathEvent;
use crate::msgr::messenger::wire::Header;

/// One step for the driver, in order. `link` names the link (its generation, given by
/// [`super::Machine::link_up`] / [`super::Machine::accept_link`]) an action is about: a
/// driver whose current link has another generation ignores it (that link is gone).
#[derive(Debug)]
pub enum Action {
    /// Connecting side: start a connection attempt on path `path` (its address is the
    /// driver's); report [`super::Machine::link_up`] or [`super::Machine::attempt_failed`].
    Connect { path: usize },
    /// Post a SEND of `header` on the link. `msg`: the data message of that sequence
    /// number (its body: [`super::Machine::unacked`]), None for a control frame (hello,
    /// ack, keepalive, bye). The header's `credits` are decided; `owed` is how many
    /// receives were posted and not announced before it: the frame grants the oldest
    /// `header.credits` of the newest `owed` receives (`wire.rs`, grants).
    Post {
        link: u64,
        header: Header,
        msg: Option<u64>,
        owed: u32,
    },
    /// Post the immediate message `seq` (its WRITEs, the last WITH IMMEDIATE `value`): it
    /// consumes one of the peer's receives and carries no header.
    PostImm { link: u64, seq: u64, value: u32 },
    /// Close the link (its connection is gone for the session; whatever it carried and
    /// was not acknowledged is in doubt). `drain`: let its last SENDs (a bye) go first.
    CloseLink { link: u64, drain: bool },
    /// The session's traffic goes on `link` from now on (a path switch): the driver makes
    /// it its current link; the one that was (if not closed) becomes a standby link, and
    /// what it was receiving is dropped (the peer sends it again on the new one).
    /// Active/active: only which joined link is the primary (pumped first) changes;
    /// nothing is dropped.
    Activate { link: u64 },
    /// Tell the application.
    Notify(Notice),
}

/// The application callbacks the machine decides (messages are handed over by the driver,
/// which holds their data, after [`super::Machine::on_delivered`]).
#[derive(Debug)]
pub enum Notice {
    /// The session is open (once per session).
    Connected,
    /// Send `seq` completed: acknowledged by the peer, or never will be.
    SendDone(u64, Result<(), Error>),
    /// Room again after a send was refused with `Full`.
    Ready,
    /// The session ended by a fault (not by `close`).
    Reset(Error),
    /// Path `0` went down, joined, or became the active one.
    Path(usize, PathEvent),
}

/// What a received frame was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next message in order: the driver queues it for delivery (reads its data) and
    /// reports [`super::Machine::on_delivered`] when it hands it over.
    Accept(u64),
    /// A message delivered before (a replay): dropped.
    Duplicate,
    /// A control frame, handled.
    Consumed,
    /// From a link that is not the session's current one (it failed meanwhile): ignored.
    Stale,
    /// The frame faulted the link (the actions say what follows).
    Fault,
}

/// Send-queue entries free on the link when the driver asks for a pump: data messages
/// leave `reserve` of them for a control frame.
#[derive(Debug, Clone, Copy)]
pub struct SqRoom {
    pub free: usize,
    pub reserve: usize,
}

/// What a connecting side's hello says about it beyond the session: the id its hello
/// claims (its own, but for the takeover tests), its messenger's incarnation and the TCP
/// port it listens on (0: none).
#[derive(Debug, Clone, Copy, Default)]
pub struct HelloId {
    pub claimed: Option<u64>,
    pub incarnation: u64,
    pub port: u16,
}
