//! Runs one uncontended `FairLock::lock()` inside a function of its own, `measured_lock`, for
//! `scripts/lock-path.sh` to trace under Valgrind's callgrind: the script lists the library's
//! source files whose code ran inside that function, which is how many files one `lock()`
//! passes through (issue 35 counts them).
//!
//! It starts a throw-away `redis-server` (the test kit's, on a free loopback port), takes and
//! releases the lock five times first (so the scripts are loaded and the client's lazy state is
//! made), then measures one `lock()` and releases it outside the measured function. A
//! current-thread runtime runs everything, so every task the call wakes (the connection's, the
//! driver's) runs inside the measured function too.
//!
//! With `--cycles N` it instead runs N uncontended lock + unlock cycles inside `measured_cycles`,
//! for `scripts/client-instructions.sh` to count the client's instructions per cycle.

use fairlock::{FairLock, LockGuard};
use fairlock_testkit::RedisServer;
use tokio::runtime::Runtime;

/// The one call traced (`--toggle-collect=measured_lock`): not inlined, not mangled.
#[inline(never)]
#[no_mangle]
pub fn measured_lock(rt: &Runtime, lock: &FairLock) -> LockGuard {
    rt.block_on(lock.lock()).expect("lock")
}

/// N lock + unlock cycles (`--cycles N`), traced the same way.
#[inline(never)]
#[no_mangle]
pub fn measured_cycles(rt: &Runtime, lock: &FairLock, cycles: u32) {
    for _ in 0..cycles {
        let guard = rt.block_on(lock.lock()).expect("lock");
        rt.block_on(guard.unlock()).expect("unlock");
    }
}

fn main() {
    let cycles: Option<u32> = match std::env::args().nth(1).as_deref() {
        Some("--cycles") => Some(
            std::env::args()
                .nth(2)
                .and_then(|n| n.parse().ok())
                .expect("--cycles N"),
        ),
        _ => None,
    };
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt
        .block_on(fairlock::Client::connect(&server.url()))
        .expect("connect");
    let lock = client.fair_lock("lock-path");
    for _ in 0..5 {
        let guard = rt.block_on(lock.lock()).expect("warm-up lock");
        rt.block_on(guard.unlock()).expect("warm-up unlock");
    }
    match cycles {
        Some(n) => measured_cycles(&rt, &lock, n),
        None => {
            let guard = measured_lock(&rt, &lock);
            rt.block_on(guard.unlock()).expect("unlock");
        }
    }
    rt.block_on(client.shutdown());
    drop(server);
}
