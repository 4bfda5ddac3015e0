//! progress=inline: the application's threads drive the device. Their own passes
//! (`progress_inline`), whether they poll, sleep on the receiving sockets or on a
//! completion channel, and so who receives (they, or the progress thread), and the
//! app-driven mode the messenger turns on.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::answers::AfterPoll;
use super::batching::{ACK_HOLD_NS, VERBS_ACK_HOLD_NS};
use super::{Shared, SoftDevice};
use crate::config::Progress;

impl SoftDevice {
    /// For an application that drives the device (progress=inline) from threads that
    /// answer what they receive, as the messenger does (it turns this on; off by default):
    /// - its passes hold positive ACKs back until its answer, a post on the same QP,
    ///   carries them (`held_acks`);
    /// - while it polls or watches the sockets, the progress thread runs passes only for a
    ///   due timer or a side-channel event, instead of taking the receive lock it polls
    ///   with (a messenger worker found it taken ~100,000 times a second at 60K rpc/s).
    ///
    /// A raw connection user keeps the plain behaviour: it may receive and then stop
    /// polling, and its peer must not wait for its next poll. A verbs application holds
    /// ACKs only once it lands RDMA WRITEs (`device/answers.rs`).
    pub fn set_app_driven(&self, on: bool) {
        self.shared.hold_acks.store(on, Ordering::Relaxed);
        if on {
            self.shared.thread_rx.store(false, Ordering::SeqCst);
        }
        if !on {
            self.shared.release_acks(self.shared.now(), 0);
        }
    }

    /// One pass of progress from the caller's thread (progress=inline, or busy polling):
    /// receive what is queued, run due timers. Skipped if another thread is at it.
    pub fn progress_inline(&self) {
        // The pass reads the clock anyway; reuse its reading (a poll loop calls this
        // millions of times a second).
        let s = &self.shared;
        let inline = s.settings.progress == Progress::Inline;
        // A verbs program (not app-driven) that lands WRITEs holds its ACKs for its answer
        // too, unless it waits on a channel (`answers.rs`).
        let verbs = inline
            && !s.hold_acks.load(Ordering::Relaxed)
            && s.armed_cqs.load(Ordering::Relaxed) == 0;
        let hold_ns = if !inline {
            0
        } else if s.hold_acks.load(Ordering::Relaxed) {
            ACK_HOLD_NS
        } else if verbs && s.answers.app_holds() {
            VERBS_ACK_HOLD_NS
        } else {
            0
        };
        let now = match s.progress_once(false, hold_ns) {
            Some(pass) => {
                if verbs {
                    s.answers.app_landed(pass.silent);
                }
                pass.now
            }
            None => s.now(),
        };
        s.last_app_poll.store(now, Ordering::Relaxed);
        s.rx_free();
    }

    /// After a verbs application's poll (progress=inline) that returned `completions`: for a
    /// program found spinning on memory, the application receives while the peer's WRITEs
    /// come with the ACKs it polls for, and the progress thread (woken now if it sleeps
    /// without the sockets) when an ACK came alone and the WRITE is still to come
    /// (`device/answers.rs`).
    pub fn after_app_poll(&self, completions: bool) {
        let s = &self.shared;
        if !completions
            || s.settings.progress != Progress::Inline
            || s.hold_acks.load(Ordering::Relaxed)
            || s.armed_cqs.load(Ordering::Relaxed) != 0
        {
            return;
        }
        match s.answers.after_completions() {
            AfterPoll::Keep => {}
            AfterPoll::App => {
                if s.thread_rx.load(Ordering::Relaxed) {
                    s.thread_rx.store(false, Ordering::SeqCst);
                }
            }
            AfterPoll::Thread => {
                // SeqCst with the thread's store of `thread_watching` before it reads
                // `thread_rx` (as `app_stops_polling`).
                if !s.thread_rx.swap(true, Ordering::SeqCst)
                    && !s.thread_watching.load(Ordering::SeqCst)
                {
                    s.timers.wake.signal();
                }
            }
        }
    }

    /// progress=inline: the receiving sockets an application thread may sleep on itself
    /// (poll(2) for POLLIN) between [`SoftDevice::app_watch`]`(true)` and `(false)`, and
    /// then receive with its next poll, and last the device's wake fd: readable once the
    /// progress thread ran a pass after this call (an app-driven device: it completes work
    /// on its own only for due timers and side-channel events, and drains the sockets when
    /// it does). Call it before looking at the CQs to decide what to wait for; the caller
    /// does not read the fds (the next call resets the wake fd). Nothing with
    /// progress=thread.
    pub fn rx_fds(&self, out: &mut Vec<RawFd>) {
        if self.shared.settings.progress != Progress::Inline {
            return;
        }
        let at = out.len();
        for p in &self.shared.ports {
            if p.qps.load(Ordering::Acquire) > 0 {
                out.push(p.sock.raw_fd());
            }
        }
        if out.len() > at {
            // Reset now: a pass of the progress thread after this call (completions the
            // caller has not seen when it decides what to wait for) makes it readable.
            self.shared.app_wake.clear();
            out.push(self.shared.app_wake.raw_fd());
        }
    }

    /// An application thread starts (`true`) or stops (`false`) sleeping on
    /// [`SoftDevice::rx_fds`]. While one does, the progress thread does not wait on the
    /// sockets (as while the application polls: it wakes for timers, side channels and
    /// every handover interval, and receives what is queued then); a stop counts as a
    /// poll, so the progress thread takes over only after the usual handover time. What
    /// waits on the doorbell list (held ACKs, batched posts) is sent first: the progress
    /// thread does not run passes while a thread watches.
    pub fn app_watch(&self, on: bool) {
        if on {
            let now = self.shared.now();
            self.shared.ring_doorbells(now);
            self.shared.release_acks(now, 0);
            self.shared.app_watchers.fetch_add(1, Ordering::AcqRel);
        } else {
            self.shared
                .last_app_poll
                .store(self.shared.now(), Ordering::Relaxed);
            self.shared.app_watchers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// As [`SoftDevice::app_watch`], for a thread that waits for completion events this way
    /// (rdmx-ibv's `ibv_get_cq_event`): from then on the progress thread also stays off
    /// the sockets for the handover time after such a thread's last watch or poll, the gap
    /// in which it takes its event, polls and re-arms (it would otherwise sleep on them
    /// then and wake with the watcher for the next datagram, both racing for it).
    pub fn app_watch_events(&self, on: bool) {
        if on {
            self.shared.event_watcher.store(true, Ordering::Relaxed);
        }
        self.app_watch(on);
    }

    /// The application is about to sleep on a completion channel instead of polling
    /// (progress=inline): the progress thread takes over receiving at once rather than
    /// after the inline handover time; what waits on the doorbell list is sent now. The
    /// thread is woken only if it sleeps without the receiving sockets.
    pub fn app_sleeping(&self) {
        self.app_stops_polling(true);
    }

    /// What [`SoftDevice::app_sleeping`] does; `wake`: wake the progress thread if it
    /// does not watch the sockets.
    fn app_stops_polling(&self, wake: bool) {
        let s = &self.shared;
        if s.settings.progress == Progress::Inline {
            let now = s.now();
            s.ring_doorbells(now);
            s.release_acks(now, 0);
            s.last_app_poll.store(0, Ordering::Relaxed);
            // SeqCst with the thread's store of `thread_watching` before it reads
            // `thread_rx`/`armed_cqs`: either it sees this arming, or this sees it did
            // not watch and wakes it.
            if wake && !s.thread_watching.load(Ordering::SeqCst) {
                s.timers.wake.signal();
            }
        }
    }

    /// As [`SoftDevice::app_sleeping`], for a verbs application that armed a CQ
    /// (`ibv_req_notify_cq`): such an application waits on its channel, polls once after
    /// each event and re-arms, so the thread also keeps receiving across that gap
    /// (`thread_rx`) until it finds the application polling for what it waits for.
    pub fn app_waits_on_channel(&self) {
        let s = &self.shared;
        if s.settings.progress == Progress::Inline
            && !s.hold_acks.load(Ordering::Relaxed)
            && s.thread_rx.swap(true, Ordering::SeqCst)
        {
            // The thread already receives for this application (the re-arming after an
            // event, every iteration of `ibv_rc_pingpong -e`): it sleeps on the sockets,
            // or is awake and will (only it clears `thread_rx`, and not while a CQ is
            // armed). Waking it would cost an eventfd write here and an empty pass there.
            self.app_stops_polling(false);
            return;
        }
        self.app_sleeping();
    }

    /// The tally of armed CQs the progress thread looks at: a verbs CQ counts itself in
    /// it while armed ([`Cq::count_armings_in`](super::super::cq::Cq::count_armings_in)).
    pub fn armed_cqs(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.shared.armed_cqs)
    }
}

impl Shared {
    /// progress=inline: whether the application receives for itself, by polling: it
    /// polled within the inline handover time, arms no CQ, and has not been found to
    /// wait without polling (`thread_rx`). The progress thread then leaves the sockets to
    /// it, and posts wait for its next poll (the doorbell list).
    pub(super) fn app_polls(&self, now: u64) -> bool {
        self.settings.progress == Progress::Inline
            && self.armed_cqs.load(Ordering::SeqCst) == 0
            && !self.thread_rx.load(Ordering::SeqCst)
            && now.saturating_sub(self.last_app_poll.load(Ordering::Relaxed))
                < inline_handover_ns(self)
    }

    /// progress=inline: an application thread that waits for its events on the sockets
    /// ([`SoftDevice::app_watch_events`]) watched or polled within the handover time: it
    /// is between two such waits, and receives again in a moment.
    pub(super) fn event_watcher_recent(&self, now: u64) -> bool {
        self.event_watcher.load(Ordering::Relaxed)
            && now.saturating_sub(self.last_app_poll.load(Ordering::Relaxed))
                < inline_handover_ns(self)
    }

    /// After an application's poll (its pass released the receive lock, or skipped): if
    /// the progress thread found the lock taken and waits for it (`rx_wanted`), wake it to
    /// receive what the poll left (a datagram that came after its receive). A load per
    /// poll otherwise. The fence pairs with the thread's between setting the flag and
    /// trying the lock again: either this sees the flag, or the thread's try finds the
    /// lock free.
    /// (An app-driven caller, the messenger, never has the thread wait: no fence per poll.)
    #[inline]
    fn rx_free(&self) {
        if self.hold_acks.load(Ordering::Relaxed) {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.rx_wanted.load(Ordering::Relaxed) && self.rx_wanted.swap(false, Ordering::AcqRel) {
            self.timers.wake.signal();
        }
    }
}

/// How long after the application's last poll the thread takes over receiving
/// (progress=inline): `polling_us`, at most 1 ms. While the application polls, the thread
/// looks this often whether it still does (a passive side, e.g. a target only serving RDMA
/// READs, that stops polling is answered within this), and whether it left datagrams
/// queued (then it waits elsewhere: `thread_rx`). 0: the thread always receives.
pub(super) fn inline_handover_ns(s: &Shared) -> u64 {
    u64::from(s.settings.polling_us).min(MAX_HANDOVER_US) * 1000
}

/// The cap on `polling_us` as the inline handover time.
const MAX_HANDOVER_US: u64 = 1000;
