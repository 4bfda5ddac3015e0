//! THE key table: every knob rdmx has, with its allowed values, default and meaning.
//! Looking for a knob? Search this file for a word of what it does.

use std::fmt::Write as _;

/// The form a key's value takes and the values it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A decimal integer in `min..=max`; `note` explains special values ("7 = infinite").
    Uint {
        min: u64,
        max: u64,
        note: &'static str,
    },
    /// A power of two in `min..=max`.
    PowerOfTwo { min: u64, max: u64 },
    /// One number of a fixed list.
    Numbers(&'static [u64]),
    /// One word of a fixed list (case-insensitive).
    Words(&'static [&'static str]),
    /// Any of a fixed list of words, comma-separated, each at most once (case-insensitive;
    /// spaces around commas allowed); empty = none. Kept in list order.
    WordSet(&'static [&'static str]),
    /// true/false, also 1/0, yes/no, on/off.
    Bool,
    /// An RDMA device name as in /sys/class/infiniband; empty = the first device.
    DeviceName,
    /// A profile name (see `profiles.rs`) or "none".
    Profile,
    /// An IPv4 or IPv6 address (no port, no brackets); empty = none.
    IpAddr,
    /// A decimal fraction in 0..=1 with at most 9 decimals, e.g. 0.001 (kept as parts per
    /// billion so values compare exactly).
    Ratio,
    /// Free text on one line (a file path, an entity name), at most 4096 bytes; empty =
    /// unset.
    Text,
}

impl Kind {
    /// What this kind allows, as in messages: "0..7 (7 = infinite)", "one of busy, event".
    pub fn allowed(self) -> String {
        super::value::allowed(self)
    }
}

/// One configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    pub name: &'static str,
    pub kind: Kind,
    /// The default, written as a user would write it.
    pub default: &'static str,
    /// What the knob does, in one line.
    pub help: &'static str,
}

const fn uint(min: u64, max: u64) -> Kind {
    Kind::Uint { min, max, note: "" }
}

const fn uint_note(min: u64, max: u64, note: &'static str) -> Kind {
    Kind::Uint { min, max, note }
}

const fn key(name: &'static str, kind: Kind, default: &'static str, help: &'static str) -> KeySpec {
    KeySpec {
        name,
        kind,
        default,
        help,
    }
}

/// Queue depths: 32768 is the common verbs device limit (max_qp_wr) on current NICs.
const MAX_WR: u64 = 32768;
/// CQ entries: 4M is the largest max_cqe current NICs report.
const MAX_CQE: u64 = 4_194_304;
const AUTO_CQ: &str = "0 = auto: 2 x the WRs sharing the CQ";

/// The QP attributes `qp_override` may name (config keys of the same names hold the values).
pub const QP_OVERRIDE_ATTRS: &[&str] = &["timeout", "retry_cnt", "rnr_retry", "min_rnr_timer"];

/// Every key, in the order `dump()` prints them. Defaults follow the seed article where it
/// measured something (QP depth 256, batch 32, Ceph "after" timers) and Ceph otherwise.
pub static KEYS: &[KeySpec] = &[
    // --- device ---
    key(
        "provider",
        Kind::Words(&["auto", "soft", "verbs"]),
        "auto",
        "device API: verbs = real NIC or kernel soft-RoCE, soft = RoCEv2 over UDP in-process; auto = verbs if a device exists, else soft",
    ),
    key(
        "device",
        Kind::DeviceName,
        "",
        "RDMA device name (e.g. mlx5_0, rxe0); empty = the first device",
    ),
    key(
        "port",
        uint(1, 255),
        "1",
        "device port number (ports count from 1)",
    ),
    key(
        "gid_index",
        uint(0, 255),
        "0",
        "GID table index: selects the RoCEv2 source address",
    ),
    // --- queue pair and completion queues ---
    key(
        "max_send_wr",
        uint(1, MAX_WR),
        "256",
        "send queue depth (WRs in flight per QP); seed: 256 beats 128 by 23%, flat past 384",
    ),
    key(
        "max_recv_wr",
        uint(1, MAX_WR),
        "256",
        "receive queue depth (receives posted per QP); matches max_send_wr",
    ),
    key(
        "max_send_sge",
        uint(1, 32),
        "2",
        "scatter/gather entries per send WR (header + payload)",
    ),
    key(
        "max_recv_sge",
        uint(1, 32),
        "1",
        "scatter/gather entries per receive WR (one pooled chunk)",
    ),
    key(
        "max_inline_data",
        uint(0, 1024),
        "64",
        "largest payload (bytes) copied into the WR instead of DMA-read; 64 covers message headers",
    ),
    key(
        "send_cq_size",
        uint_note(0, MAX_CQE, AUTO_CQ),
        "0",
        "send completion queue entries (the shared CQ when separate_cqs = false); seed: 1.5-2x the WRs",
    ),
    key(
        "recv_cq_size",
        uint_note(0, MAX_CQE, AUTO_CQ),
        "0",
        "receive completion queue entries; must be 0 when separate_cqs = false",
    ),
    key(
        "separate_cqs",
        Kind::Bool,
        "true",
        "one CQ for sends and one for receives (true) or one shared CQ (false); seed: separate CQs cut p99.9",
    ),
    key(
        "signal_interval",
        uint(1, MAX_WR),
        "16",
        "request a completion for every Nth send WR only (fewer CQEs to poll)",
    ),
    key(
        "post_batch",
        uint(1, MAX_WR),
        "32",
        "WRs chained into one post call; seed: 32 beats 16 by 37% for small messages",
    ),
    // --- RC transport timers and limits ---
    key(
        "timeout",
        uint_note(0, 31, "0 = no ACK timer"),
        "14",
        "local ACK timeout code, 4.096 us x 2^t; 14 = 67 ms, a dead peer is declared after (retry_cnt + 1) x that = 537 ms. 14, not the seed's 10 (4.2 ms, profile ceph-after): a NIC ACKs whatever the host does, a userspace responder only when scheduled, and on a loaded 2-core host it was away up to 28 ms (docs/busy-hosts.md)",
    ),
    key(
        "retry_cnt",
        uint_note(0, 7, "7 = seven retries"),
        "7",
        "retransmissions after an ACK timeout or sequence NAK before RETRY_EXC_ERR",
    ),
    key(
        "rnr_retry",
        uint_note(0, 7, "7 = infinite"),
        "2",
        "retries after an RNR NAK before RNR_RETRY_EXC_ERR; seed: 7 -> 2 gives up instead of hanging",
    ),
    key(
        "min_rnr_timer",
        uint_note(0, 31, "timer code; 0 = 655.36 ms, the longest"),
        "12",
        "RNR timer code this side puts in its RNR NAKs; 12 = 0.64 ms (seed: 0 -> 12)",
    ),
    key(
        "qp_override",
        Kind::WordSet(QP_OVERRIDE_ATTRS),
        "",
        "QP attributes whose configured values (above: timeout, retry_cnt, rnr_retry, min_rnr_timer) replace what a verbs application passes to ibv_modify_qp under rdmx-ibv, each logged once per QP and counted; e.g. Ceph hard-codes timeout 18, retry_cnt 7, rnr_retry 7, min_rnr_timer 18 with no option to tune them. Empty = the application's values",
    ),
    key(
        "path_mtu",
        Kind::Numbers(&[256, 512, 1024, 2048, 4096]),
        "1024",
        "path MTU in bytes (payload per packet), at most: each connection caps it at the largest that fits the link to the peer (1500 -> 1024, 9000 and loopback -> 4096) and uses the smaller of both sides' offers",
    ),
    key(
        "max_rd_atomic",
        uint(0, 255),
        "16",
        "RDMA READ/atomic requests this side may have outstanding (the 4K read path needs depth)",
    ),
    key(
        "max_dest_rd_atomic",
        uint(0, 255),
        "16",
        "incoming RDMA READ/atomic requests this side serves at once",
    ),
    key("sl", uint(0, 15), "0", "service level (fabric priority)"),
    key(
        "traffic_class",
        uint(0, 255),
        "0",
        "GRH traffic class byte (DSCP << 2 | ECN)",
    ),
    // --- memory ---
    key(
        "chunk_size",
        Kind::PowerOfTwo {
            min: 512,
            max: 2_097_152,
        },
        "4096",
        "bytes per pooled registered buffer; 4096 holds one 4K block",
    ),
    key(
        "pool_chunks",
        uint(1, 16_777_216),
        "1024",
        "chunks per buffer pool; 1024 x 4K = 4 MiB pinned (Ceph pins ~1 GiB at start)",
    ),
    key(
        "hugepages",
        Kind::Words(&["auto", "on", "off"]),
        "auto",
        "2 MiB pages for pools: auto = hugetlb, else THP, else plain; on = require; off = plain pages",
    ),
    key(
        "rcache_entries",
        uint_note(0, 1_048_576, "0 = cache off"),
        "1024",
        "memory registration cache entries (reuse registrations instead of one per IO)",
    ),
    // --- completion polling and flow control ---
    key(
        "poll_mode",
        Kind::Words(&["busy", "event", "adaptive"]),
        "adaptive",
        "completions: busy = always poll, event = sleep on the event fd, adaptive = poll polling_us, then sleep",
    ),
    key(
        "polling_us",
        uint(0, 1_000_000),
        "1000",
        "adaptive mode: microseconds of empty polls before sleeping (Ceph's default too). On a host whose cores are busy, 1000 kept read_bw at 0.75x the UDP loop where 100 fell to 0.25x: an answer often takes longer than 100 us, and a thread that slept waits for a core to wake (docs/busy-hosts.md). The messenger (and the block path on it) polls 200 us unless poll_mode or polling_us is set, and backs off for 100 ms when preempted while polling (docs/messenger.md). The soft device (progress=inline) also takes it, capped at 1 ms, as the time after an application's last poll during which its progress thread leaves receiving to that application (0: the thread always receives), and a verbs program's thread in ibv_get_cq_event polls that long before it sleeps (poll_mode=event: not at all; docs/ibv-device.md)",
    ),
    key(
        "poll_batch",
        uint(1, 1024),
        "32",
        "completions taken per poll call (Ceph polls 32)",
    ),
    key(
        "credits",
        uint_note(0, MAX_WR, "0 = auto = max_recv_wr"),
        "0",
        "messages a peer may send before it must wait for credit; never more than posted receives",
    ),
    // --- soft provider ---
    key(
        "soft_port",
        uint_note(0, 65535, "0 = any free port"),
        "4791",
        "UDP port of the soft provider; 4791 is RoCEv2's, so tshark decodes the traffic",
    ),
    key(
        "soft_addr",
        Kind::IpAddr,
        "",
        "IP address the soft provider's UDP port binds (peers send RoCEv2 there); empty = every address (0.0.0.0, and [::] where the host has IPv6)",
    ),
    key(
        "soft_drop_ratio",
        Kind::Ratio,
        "0",
        "soft provider: drop this fraction of outgoing packets (loss injection for experiments; 0 = off)",
    ),
    key(
        "soft_gso",
        Kind::Bool,
        "true",
        "soft provider: send runs of 2+ equal-length packets to the same peer as one UDP GSO message (IPv6; IPv4 to local addresses); false = one datagram per packet, so that a capture on lo shows every packet instead of GSO super-frames. A 4 KiB messenger reply (4096 + header = 2 packets) costs the server half the CPU with it",
    ),
    key(
        "soft_pin",
        Kind::Bool,
        "true",
        "soft provider: a registration pins its pages (mlock) within RLIMIT_MEMLOCK (CAP_IPC_LOCK lifts it), as a NIC driver does: beyond it registering fails (ResourceLimit; ENOMEM through rdmx0); false = nothing is pinned and the limit bounds no registration. For a host whose limit cannot be raised (no CAP_SYS_RESOURCE) where a production one would run unlimited (Ceph's LimitMEMLOCK=infinity): the soft device copies through the kernel, so it needs no page resident",
    ),
    key(
        "progress",
        Kind::Words(&["thread", "inline"]),
        "inline",
        "soft provider: who receives: the caller's poll (a thread runs timers, and receives when the caller stops polling), or a progress thread (2 cores shared by client and server: inline 2.7x read_bw; thread with poll_mode=busy, where the caller's poll receives too, matches inline)",
    ),
    key(
        "poll_yield_after",
        uint_note(0, 1_000_000, "0 = never yield"),
        "64",
        "soft device through rdmx-ibv: after this many empty ibv_poll_cq calls in a row on one thread, each further empty poll yields the core (sched_yield). A software device's NIC is the host's CPU: a program that spins on an empty CQ (Ceph polls 1 ms after every completion) takes the core its peers and its own other threads need. Ceph randread under load: 1.8-1.95x the IOPS with it (docs/ibv-device.md)",
    ),
    // --- messenger (src/msgr/messenger, docs/messenger.md) ---
    key(
        "msgr_policy",
        Kind::Words(&["lossless", "lossy"]),
        "lossless",
        "session policy of Messenger::connect: lossless = reconnect and replay after a fault (exactly once, in order); lossy = a fault ends the session (unacknowledged sends fail, reset callback)",
    ),
    key(
        "msgr_threads",
        uint_note(0, 64, "0 = the caller drives progress with poll()"),
        "0",
        "messenger worker threads running progress and callbacks (Ceph's ms_async_op_threads); sessions are spread over them",
    ),
    key(
        "msgr_keepalive_ms",
        uint_note(0, 3_600_000, "0 = no keepalive"),
        "1000",
        "an idle session sends a keepalive this often (ms)",
    ),
    key(
        "msgr_keepalive_timeout_ms",
        uint(1, 3_600_000),
        "5000",
        "a session that heard nothing from its peer for this long (ms) is faulted (dead or black-holed peer)",
    ),
    key(
        "msgr_reconnect_min_ms",
        uint(1, 60_000),
        "10",
        "lossless: first reconnect delay (ms); doubles per failed attempt up to msgr_reconnect_max_ms",
    ),
    key(
        "msgr_reconnect_max_ms",
        uint(1, 60_000),
        "1000",
        "lossless: longest delay between reconnect attempts (ms)",
    ),
    key(
        "msgr_reconnect_timeout_ms",
        uint(1, 86_400_000),
        "60000",
        "lossless: give up (reset, sends fail) after reconnecting for this long (ms); the accepting side drops a session whose peer stayed away twice this long",
    ),
    key(
        "msgr_reconnect_attempts",
        uint_note(0, 1_000_000, "0 = no limit but the timeout"),
        "0",
        "lossless: give up after this many failed reconnect attempts",
    ),
    key(
        "msgr_send_queue_msgs",
        uint(1, 1_048_576),
        "4096",
        "messages a session holds (waiting for credits or for the peer's acknowledgement) before send returns Full",
    ),
    key(
        "msgr_send_queue_bytes",
        uint(4096, 1 << 40),
        "67108864",
        "data bytes a session holds (waiting or unacknowledged) before send returns Full",
    ),
    key(
        "msgr_recv_window",
        uint(4, MAX_WR),
        "64",
        "most receives (credits) a session posts for its peer; grown to from msgr_recv_window_min while the peer runs out of credits",
    ),
    key(
        "msgr_recv_window_min",
        uint(2, MAX_WR),
        "4",
        "receives a new or idle session keeps posted (each holds a 4 KiB pool chunk: the idle memory per session)",
    ),
    key(
        "msgr_pool_chunks",
        uint(64, 16_777_216),
        "16384",
        "4 KiB chunks the messenger's data pool may hold (receives, received data, copies, alloc_chunk); arenas are mapped as needed",
    ),
    key(
        "msgr_eager_max",
        uint(0, 4096),
        "4096",
        "largest single data segment sent eagerly (SEND into the receiver's posted chunk); larger ones are RDMA READ by the receiver",
    ),
    key(
        "msgr_eager_write",
        Kind::Bool,
        "true",
        "eager data goes as an RDMA WRITE into the data chunk of the receive the receiver granted (with its credits), then a short SEND of the header: a 4 KiB message is one full packet plus a small one, and a batch of them two runs of equal packets (one GSO message each with the soft provider); the data pool is then registered with remote write. false = the data rides in the SEND after the 512-byte header slot",
    ),
    key(
        "msgr_path_failback",
        Kind::Bool,
        "true",
        "a session with several paths (Messenger::connect_paths) moves its traffic back to a preferred (lower-index) path when that path rejoins after a failure; false = it stays on the path it failed over to until that one fails",
    ),
    key(
        "msgr_scoped_rkeys",
        Kind::Bool,
        "true",
        "the messenger's pools and the buffers it sends from are registered without remote rights; a peer reaches them only through memory windows bound to its own QP over the bytes meant for it, revoked when that use ends (rendezvous data until the peer acknowledges it, a granted receive until it is consumed): no session can read or write another's buffers. soft provider only (verbs: see docs/security.md); false = one pool rkey for all sessions, as before (for comparison)",
    ),
    key(
        "msgr_rx_batch",
        uint_note(0, 65_536, "0 = no limit"),
        "16",
        "messages a session takes from its connection per progress pass: the answers its callbacks send leave before the next ones are taken, so a peer with many requests outstanding gets the first replies while the rest are served and both sides work at once, instead of one batch of every request going back and forth between sides that take turns",
    ),
    key(
        "msgr_worker_slice_us",
        uint_note(0, 100_000, "0 = the kernel's default slice"),
        "0",
        "the CPU time slice each messenger worker thread asks the kernel for (sched_setattr, Linux 6.12+; ignored before). Its share of the CPU is unchanged; a shorter slice than the other threads' lets a worker woken by a message run at once instead of waiting for a busy thread's slice to end (EEVDF). The kernel keeps it within 100-100000 us. Off by default: 100 us gave msg_bw under 2 CPU hogs 0.78x of the kernel's default (bench/load.sh SLICE_AB=1, 5 pairs; docs/busy-hosts.md)",
    ),
    key(
        "msgr_max_message_bytes",
        uint(4096, 1 << 30),
        "16777216",
        "most data bytes (all segments) in one message: a send over it is refused (InvalidArgument), and a peer's message over it is refused, counted (oversized) and ends the session; received data is READ into the data pool before delivery, so at most half of msgr_pool_chunks x 4 KiB (the default is lowered to that)",
    ),
    key(
        "msgr_max_segments",
        uint(1, 64),
        "64",
        "most data segments in one message, sent or received (a peer's message with more is refused like an oversized one)",
    ),
    // --- authentication and handshake bounds (src/msgr/auth, docs/security.md) ---
    key(
        "auth",
        Kind::Words(&["auto", "required", "none"]),
        "auto",
        "side-channel authentication: required = both ends prove the client entity's key from auth_keyring before any QP number, address or region is sent; none = no authentication (warned at listen/connect; benchmarks); auto = required when auth_keyring is set, else none",
    ),
    key(
        "auth_keyring",
        Kind::Text,
        "",
        "Ceph-style keyring file ([client.NAME] key = BASE64), mode 600 or stricter (refused if group or others may read it); setting it makes authentication required",
    ),
    key(
        "auth_entity",
        Kind::Text,
        "client.admin",
        "this side's entity name: a connecting side proves the key of this entity; a listener sends it as its name",
    ),
    key(
        "handshake_first_bytes_ms",
        uint(1, 60_000),
        "500",
        "a new side-channel connection must send its first auth frame (and each next one) within this (ms), or it is dropped (counted, logged)",
    ),
    key(
        "handshake_timeout_ms",
        uint(1, 600_000),
        "10000",
        "the whole side-channel handshake (auth, QP hellos, ready step) must end within this (ms)",
    ),
    key(
        "handshake_max",
        uint(1, 65_536),
        "256",
        "handshakes a listener runs at once (unauthenticated, setting up, or set up and not yet accepted); more connections are refused (counted, logged)",
    ),
    key(
        "handshake_per_source",
        uint(1, 65_536),
        "32",
        "unauthenticated handshakes one source IP address may have at once on a listener; more are refused (counted, logged)",
    ),
    key(
        "msgr_max_pending_links",
        uint(1, 1_048_576),
        "256",
        "accepted connections a messenger holds waiting for their session hello; more are closed (counted, logged)",
    ),
    key(
        "msgr_max_sessions",
        uint(1, 16_777_216),
        "4096",
        "sessions a listening messenger accepts at once; a new session beyond it is refused (counted, logged)",
    ),
    key(
        "msgr_max_sessions_per_entity",
        uint(1, 16_777_216),
        "1024",
        "sessions one authenticated entity may hold on a listening messenger (with auth=none: one peer IP address)",
    ),
    // --- multipath block client (src/blk/paths.rs, docs/failover.md) ---
    key(
        "blk_path_policy",
        Kind::Words(&["standby", "active"]),
        "standby",
        "multipath block client: standby = all IO on one path (the first listed that is up), the others connected and idle until it fails (two targets or NICs where one is preferred, or a target pair that should not both serve); active = each IO on the up path with the fewest IOs outstanding (spreads load over two NIC ports to one target)",
    ),
    key(
        "blk_failback",
        Kind::Bool,
        "true",
        "multipath block client, standby: when a path listed before the active one rejoins, new IO moves back to it (false: IO stays on the path it failed over to)",
    ),
    key(
        "io_fail_timeout_ms",
        uint(1, 86_400_000),
        "30000",
        "multipath block client: an IO fails (-EIO) only when no path has answered for this long (ms) since it was submitted; until then it waits for a path to rejoin (NVMe-oF's fast_io_fail_tmo, off by default there)",
    ),
    key(
        "blk_path_retry_min_ms",
        uint(1, 60_000),
        "10",
        "multipath block client: first delay before reconnecting a failed path (ms); doubles per failed attempt up to blk_path_retry_max_ms",
    ),
    key(
        "blk_path_retry_max_ms",
        uint(1, 600_000),
        "1000",
        "multipath block client: longest delay between reconnect attempts of a failed path (ms)",
    ),
    // --- profiles ---
    key(
        "profile",
        Kind::Profile,
        "none",
        "named set of values applied beneath file, env and set values (ceph-before, ceph-after, trading, throughput)",
    ),
];

/// The index of `name` (already normalized) in [`KEYS`].
pub(crate) fn index_of(name: &str) -> Option<usize> {
    KEYS.iter().position(|k| k.name == name)
}

/// Normalizes a key as users may write it: trimmed, case-insensitive, runs of spaces and
/// dashes become one underscore ("RNR retry" and "rnr-retry" are "rnr_retry").
pub fn normalize_key(raw: &str) -> String {
    let lower = raw.trim().to_ascii_lowercase().replace('-', " ");
    lower.split_whitespace().collect::<Vec<_>>().join("_")
}

/// One line per key: name, default, allowed values and meaning (for `--help` texts).
pub fn keys_text() -> String {
    let mut out = String::new();
    for spec in KEYS {
        let _ = writeln!(
            out,
            "{} [default {:?}] allowed {}: {}",
            spec.name,
            spec.default,
            spec.kind.allowed(),
            spec.help
        );
    }
    out
}
