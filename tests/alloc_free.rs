//! The hot path of the C ABI allocates nothing: after warm-up, `rdmx_poll` (with
//! completions and without) and a `rdmx_post_send` refused because the send queue is full
//! make no heap allocation on the calling thread, and `rdmx_last_error()` still says ""
//! after a success and names the full queue after a refusal.
//!
//! A counting global allocator counts the allocations of the thread that measures (other
//! threads, e.g. a context's timer thread, are not counted: they are not the caller's
//! call). The pair is two contexts in this process, connected over 127.0.0.1 through the
//! public `extern "C"` entry points, as a C program would.

use rdmx::ffi::config::{rdmx_config, rdmx_config_free, rdmx_config_new, rdmx_config_set};
use rdmx::ffi::conn::{
    rdmx_completion, rdmx_conn, rdmx_conn_free, rdmx_conn_remote_region, rdmx_connect,
    rdmx_listener, rdmx_listener_accept, rdmx_listener_free, rdmx_listener_new, rdmx_listener_port,
    rdmx_poll, rdmx_post_send, rdmx_post_write, rdmx_remote_region, rdmx_sge,
};
use rdmx::ffi::context::{
    RDMX_ACCESS_LOCAL_WRITE, RDMX_ACCESS_REMOTE_WRITE, rdmx_context, rdmx_context_free,
    rdmx_context_new, rdmx_mr, rdmx_mr_dereg, rdmx_mr_reg,
};
use rdmx::ffi::rdmx_status;
use rdmx::ffi::status::rdmx_last_error;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts the allocations (and reallocations) of threads that asked for it.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator unchanged; counting touches only
// atomics and a const-initialized thread-local (no allocation, no reentrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// (allocations, bytes) made by this thread while `f` runs.
fn measure<T>(f: impl FnOnce() -> T) -> (T, (u64, u64)) {
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    let d = (
        ALLOCS.load(Ordering::Relaxed) - a0,
        BYTES.load(Ordering::Relaxed) - b0,
    );
    (r, d)
}

fn last_error() -> String {
    // SAFETY: rdmx_last_error returns a live NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(rdmx_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn ok(st: rdmx_status, what: &str) {
    assert_eq!(st, rdmx_status::RDMX_OK, "{what}: {}", last_error());
}

fn context(max_send_wr: &str) -> *mut rdmx_context {
    let mut cfg: *mut rdmx_config = std::ptr::null_mut();
    // SAFETY: `cfg` is writable.
    ok(unsafe { rdmx_config_new(&mut cfg) }, "config_new");
    for (k, v) in [
        ("soft_port", "0"),
        ("path_mtu", "1024"),
        ("max_send_wr", max_send_wr),
        // The receiver never posts a receive: SENDs wait on RNR NAKs forever, keeping the
        // send queue full.
        ("rnr_retry", "7"),
    ] {
        let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
        // SAFETY: live config, NUL-terminated strings.
        ok(
            unsafe { rdmx_config_set(cfg, k.as_ptr(), v.as_ptr()) },
            "config_set",
        );
    }
    let mut ctx: *mut rdmx_context = std::ptr::null_mut();
    // SAFETY: live config, writable out.
    ok(unsafe { rdmx_context_new(cfg, &mut ctx) }, "context_new");
    // SAFETY: from rdmx_config_new, freed once.
    unsafe { rdmx_config_free(cfg) };
    ctx
}

fn register(ctx: *mut rdmx_context, buf: &mut [u8], access: u32) -> rdmx_mr {
    let mut mr = rdmx_mr {
        addr: 0,
        length: 0,
        lkey: 0,
        rkey: 0,
        access: 0,
    };
    // SAFETY: the buffer outlives the registration (deregistered before it is dropped).
    ok(
        unsafe { rdmx_mr_reg(ctx, buf.as_mut_ptr().cast(), buf.len(), access, &mut mr) },
        "mr_reg",
    );
    mr
}

/// A raw handle moved to the accepting thread.
struct Handle<T>(*mut T);
// SAFETY: the handles are used by one thread at a time (the listener only by the accepting
// thread until it is joined).
unsafe impl<T> Send for Handle<T> {}

/// Connects a client on `a` to a listener on `b`: (client side, server side).
fn connect(a: *mut rdmx_context, b: *mut rdmx_context) -> (*mut rdmx_conn, *mut rdmx_conn) {
    let mut l: *mut rdmx_listener = std::ptr::null_mut();
    // SAFETY: live context, NUL-terminated address, writable out.
    ok(
        unsafe { rdmx_listener_new(b, c"127.0.0.1:0".as_ptr(), &mut l) },
        "listener_new",
    );
    // SAFETY: live listener.
    let port = unsafe { rdmx_listener_port(l) };
    let lh = Handle(l);
    let server = std::thread::spawn(move || {
        let lh = lh;
        let mut c: *mut rdmx_conn = std::ptr::null_mut();
        // SAFETY: live listener, used by this thread only; writable out.
        let st = unsafe { rdmx_listener_accept(lh.0, 10_000, &mut c) };
        assert_eq!(st, rdmx_status::RDMX_OK, "accept: {}", last_error());
        Handle(c)
    });
    let addr = CString::new(format!("127.0.0.1:{port}")).unwrap();
    let mut ca: *mut rdmx_conn = std::ptr::null_mut();
    // SAFETY: live context, NUL-terminated address, writable out.
    ok(
        unsafe { rdmx_connect(a, addr.as_ptr(), 10_000, &mut ca) },
        "connect",
    );
    let cb = server.join().unwrap().0;
    // SAFETY: from rdmx_listener_new; the accepting thread is done with it.
    unsafe { rdmx_listener_free(l) };
    (ca, cb)
}

const EMPTY: rdmx_completion = rdmx_completion {
    cookie: 0,
    status: 0,
    opcode: 0,
    byte_len: 0,
    imm: 0,
    flags: 0,
    qp_num: 0,
};

/// Polls `c` once: how many completions came (each checked successful).
fn poll_once(c: *mut rdmx_conn, out: &mut [rdmx_completion]) -> usize {
    let mut n = 0usize;
    // SAFETY: live connection; `out` valid for its length; `n` writable.
    let st = unsafe { rdmx_poll(c, out.as_mut_ptr(), out.len(), &mut n) };
    assert_eq!(st, rdmx_status::RDMX_OK);
    n
}

/// Blocks this thread once on a parking_lot mutex another thread holds.
fn park_once() {
    let m = parking_lot::Mutex::new(());
    let held = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _g = m.lock();
            held.wait();
            std::thread::sleep(Duration::from_millis(20));
        });
        held.wait();
        drop(m.lock());
    });
}

/// Counts of what the measured loops saw.
#[derive(Debug, Default)]
struct Seen {
    polls_with: u64,
    polls_without: u64,
    allocs_with: (u64, u64),
    allocs_without: (u64, u64),
    /// Allocations of the successful posts (reported, not asserted).
    allocs_posts: (u64, u64),
}

/// `rounds` RDMA WRITEs one at a time, each polled until it completes; every poll is
/// measured (the posts are not).
fn writes_and_polls(
    ca: *mut rdmx_conn,
    src: &rdmx_sge,
    dst: &rdmx_remote_region,
    rounds: u64,
    seen: &mut Seen,
) {
    let mut wc = [EMPTY; 4];
    for i in 0..rounds {
        // SAFETY: live connection; one SGE.
        let (st, d) = measure(|| unsafe { rdmx_post_write(ca, src, 1, dst.addr, dst.rkey, i, 0) });
        seen.allocs_posts.0 += d.0;
        seen.allocs_posts.1 += d.1;
        assert_eq!(st, rdmx_status::RDMX_OK, "post_write: {}", last_error());
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let (n, d) = measure(|| poll_once(ca, &mut wc));
            if n == 0 {
                seen.polls_without += 1;
                seen.allocs_without.0 += d.0;
                seen.allocs_without.1 += d.1;
                assert!(Instant::now() < end, "WRITE {i} did not complete");
                continue;
            }
            seen.polls_with += 1;
            seen.allocs_with.0 += d.0;
            seen.allocs_with.1 += d.1;
            assert_eq!(n, 1);
            assert_eq!((wc[0].cookie, wc[0].status), (i, 0), "WRITE {i}");
            break;
        }
    }
}

#[test]
fn poll_and_a_refused_post_allocate_nothing() {
    const MAX_SEND_WR: u64 = 32;
    const N: u64 = 1000;
    let (a, b) = (context("32"), context("32"));
    let mut a_buf = vec![7u8; 64 << 10];
    let mut b_buf = vec![0u8; 64 << 10];
    let ma = register(a, &mut a_buf, RDMX_ACCESS_LOCAL_WRITE);
    let mb = register(
        b,
        &mut b_buf,
        RDMX_ACCESS_LOCAL_WRITE | RDMX_ACCESS_REMOTE_WRITE,
    );
    let (ca, cb) = connect(a, b);
    let mut dst = rdmx_remote_region {
        addr: 0,
        length: 0,
        rkey: 0,
        access: 0,
    };
    // SAFETY: live connection, writable out.
    ok(
        unsafe { rdmx_conn_remote_region(ca, 0, &mut dst) },
        "remote_region",
    );
    let src = rdmx_sge {
        addr: ma.addr,
        length: 512,
        lkey: ma.lkey,
    };

    // parking_lot allocates a thread's parking data (and may grow its global table, 1024 + 32
    // bytes seen) the first time that thread blocks on a contended lock: a one-time cost of
    // the thread, not of any call (it showed up in the refused posts only when a post first
    // met the progress thread on a lock). The measuring thread parks once first.
    park_once();

    // Polls, with and without completions: warm-up, then measured.
    let mut warm = Seen::default();
    writes_and_polls(ca, &src, &dst, 50, &mut warm);
    let mut seen = Seen::default();
    writes_and_polls(ca, &src, &dst, N, &mut seen);
    // Empty polls on an idle connection too.
    let mut wc = [EMPTY; 4];
    for _ in 0..N {
        let (n, d) = measure(|| poll_once(ca, &mut wc));
        assert_eq!(n, 0);
        seen.polls_without += 1;
        seen.allocs_without.0 += d.0;
        seen.allocs_without.1 += d.1;
    }
    assert_eq!(last_error(), "", "a successful poll leaves no error");

    // Fill the send queue: SENDs the peer has no receive for (RNR, retried forever).
    for k in 0..MAX_SEND_WR {
        // SAFETY: live connection; one SGE.
        let st = unsafe { rdmx_post_send(ca, &src, 1, 1_000 + k, 0) };
        assert_eq!(st, rdmx_status::RDMX_OK, "send {k}: {}", last_error());
    }
    let refuse = || {
        // SAFETY: live connection; one SGE.
        let st = unsafe { rdmx_post_send(ca, &src, 1, 9_999, 0) };
        assert_eq!(st, rdmx_status::RDMX_FULL);
    };
    for _ in 0..10 {
        refuse();
    }
    let ((), refused) = measure(|| {
        for _ in 0..N {
            refuse();
        }
    });
    let msg = last_error();
    assert_eq!(
        msg, "rdmx_post_send: post_send: send queue full (32 WRs outstanding = max_send_wr)",
        "the refusal's message"
    );
    // A success clears it, still without allocating.
    let (n, d) = measure(|| poll_once(ca, &mut wc));
    assert_eq!(n, 0);
    assert_eq!(last_error(), "");
    seen.polls_without += 1;
    seen.allocs_without.0 += d.0;
    seen.allocs_without.1 += d.1;

    eprintln!(
        "polls with completions: {} ({} allocations, {} bytes); without: {} ({} allocations, \
         {} bytes); refused posts: {N} ({} allocations, {} bytes); successful WRITE posts: {N} ({} \
         allocations, {} bytes)",
        seen.polls_with,
        seen.allocs_with.0,
        seen.allocs_with.1,
        seen.polls_without,
        seen.allocs_without.0,
        seen.allocs_without.1,
        refused.0,
        refused.1,
        seen.allocs_posts.0,
        seen.allocs_posts.1
    );
    assert_eq!(seen.polls_with, N);
    assert!(seen.polls_without >= N);
    assert_eq!(
        seen.allocs_with,
        (0, 0),
        "rdmx_poll with completions allocated"
    );
    assert_eq!(
        seen.allocs_without,
        (0, 0),
        "rdmx_poll without completions allocated"
    );
    assert_eq!(refused, (0, 0), "refused rdmx_post_send allocated");

    // SAFETY: from connect/accept, freed once; nothing uses them afterwards.
    unsafe {
        rdmx_conn_free(ca);
        rdmx_conn_free(cb);
    }
    // SAFETY: live contexts; the connections naming the regions are gone.
    unsafe {
        ok(rdmx_mr_dereg(a, ma.lkey), "dereg a");
        ok(rdmx_mr_dereg(b, mb.lkey), "dereg b");
        rdmx_context_free(a);
        rdmx_context_free(b);
    }
    drop((a_buf, b_buf));
}
