//! The Redisson-protocol peer's workload: a few Java "threads" on the same names.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use fairlock_testkit::redisson_peer::{PeerGuard, RedissonPeer, Wait};

use crate::config::*;

pub async fn java_thread(
    peer: RedissonPeer,
    thread: i64,
    seed: u64,
    stop: Arc<AtomicBool>,
    names: Vec<(&'static str, bool)>,
    calls: Arc<AtomicUsize>,
) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::SeqCst) {
        let (name, fair) = *rng.pick(&names);
        // A read-write lock: a read (fixed leases only, see below) or a write.
        let side = is_rw_name(name).then(|| rng.chance(0.35));
        let lease = if side != Some(false) && rng.chance(0.5) {
            None
        } else {
            // Redisson's read renewal sets the lock's TTL to its watchdog timeout, which can cut
            // a fixed lease of another reader short (PROTOCOL 10, F10); the peer's reads take
            // fixed leases, so its renewals never do it to fairlock's readers here.
            Some(rng.ms(100, 1200))
        };
        let how = match rng.below(3) {
            0 => Wait {
                wait: None,
                lease,
                abandon_after: None,
            },
            1 => Wait {
                wait: Some(rng.ms(1, 400)),
                lease,
                abandon_after: None,
            },
            _ => Wait {
                wait: Some(rng.ms(100, 600)),
                lease,
                // An interrupted thread: no give-up, its entry waits out its deadline.
                abandon_after: (fair && rng.chance(0.3)).then(|| rng.ms(5, 300)),
            },
        };
        calls.fetch_add(1, Ordering::SeqCst);
        let Some(guard) = take(&peer, thread, (name, fair), side, how).await else {
            continue;
        };
        tokio::time::sleep(rng.ms(0, 25)).await;
        if rng.chance(0.1) {
            // Re-entry by the same thread (same lease, as a Java caller re-locking would).
            calls.fetch_add(1, Ordering::SeqCst);
            let inner = Wait {
                wait: Some(rng.ms(0, 20)),
                lease,
                abandon_after: None,
            };
            if let Some(g) = take(&peer, thread, (name, fair), side, inner).await {
                tokio::time::sleep(rng.ms(0, 10)).await;
                let _ = peer.unlock(g).await;
            }
        }
        let _ = peer.unlock(guard).await;
    }
}

/// One acquisition: of a mutex, or of a side of a read-write lock (`side`: `Some(write)`).
async fn take(
    peer: &RedissonPeer,
    thread: i64,
    (name, fair): (&str, bool),
    side: Option<bool>,
    how: Wait,
) -> Option<PeerGuard> {
    match side {
        Some(write) => peer.acquire_rw(thread, name, write, how).await,
        None => peer.acquire(thread, name, fair, how).await,
    }
}
