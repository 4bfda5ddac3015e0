//! Handshake cost with and without side-channel authentication (bench/auth.sh runs it):
//! N connects to a listener in this process, alternating auth=required and auth=none
//! one connect at a time, each timed from `Context::connect` to its return (TCP,
//! authentication, QP, tagged hellos, ready step). Prints the medians, p90s and their
//! ratio. Usage: `auth_handshake [N]` (default 200 each).

use rdmx::config::Config;
use rdmx::msgr::Context;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn context(keyring: Option<&str>, entity: &str) -> Context {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("auth_entity", entity).unwrap();
    if let Some(k) = keyring {
        c.set("auth_keyring", k).unwrap();
    }
    Context::new(&c).unwrap()
}

/// A listener on `ctx` accepting on its own thread; returns its address.
fn serve(ctx: &Context, stop: &Arc<AtomicBool>) -> (String, std::thread::JoinHandle<()>) {
    let l = ctx.listen("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{}", l.local_addr().port());
    let stop = Arc::clone(stop);
    let t = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(c) = l.accept(Some(Duration::from_millis(20))) {
                drop(c);
            }
        }
    });
    (addr, t)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("rdmx-auth-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ring = dir.join("keyring");
    std::fs::write(
        &ring,
        "[client.bench]\n    key = AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n",
    )
    .unwrap();
    std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ring = ring.to_str().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let (auth_server, plain_server) = (context(Some(&ring), "osd.0"), context(None, "osd.0"));
    let (auth_addr, t1) = serve(&auth_server, &stop);
    let (plain_addr, t2) = serve(&plain_server, &stop);
    let (auth_client, plain_client) = (
        context(Some(&ring), "client.bench"),
        context(None, "client.bench"),
    );
    let (mut with, mut without) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..2 * n {
        // Alternating, the order swapped every other pair.
        let auth = (i % 2 == 0) ^ ((i / 2) % 2 == 1);
        let (c, a) = if auth {
            (&auth_client, &auth_addr)
        } else {
            (&plain_client, &plain_addr)
        };
        let t0 = Instant::now();
        let conn = c.connect(a, Duration::from_secs(10)).unwrap();
        let us = t0.elapsed().as_secs_f64() * 1e6;
        drop(conn);
        if auth { &mut with } else { &mut without }.push(us);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = (t1.join(), t2.join());
    let _ = std::fs::remove_dir_all(&dir);
    let (m_with, m_without) = (pct(&mut with, 0.5), pct(&mut without, 0.5));
    println!(
        "handshake (connect to return) over {n} connects each, alternating: auth=required \
         median {m_with:.0} us (p90 {:.0}), auth=none median {m_without:.0} us (p90 {:.0}); \
         ratio {:.2}",
        pct(&mut with, 0.9),
        pct(&mut without, 0.9),
        m_with / m_without
    );
}
