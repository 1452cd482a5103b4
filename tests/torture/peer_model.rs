//! The Redisson-protocol peer's own bookkeeping, against a real server: what it claims a Java
//! thread may trust is what the checker holds every other hold against, so a claim too generous
//! shows up as a mutual-exclusion violation between two Java holds (run 39 of
//! `benches/RESULTS.md`, seed 2865610217141582574).

use std::time::Duration;

use fairlock_testkit::history::Event;
use fairlock_testkit::redisson_peer::{RedissonPeer, Sink, Wait};
use fairlock_testkit::{wait_until_async, RedisServer};

use crate::check::fixtures::hist;
use crate::check::{check, History};
use crate::config::peer_config;

fn try_for(lease_ms: u64) -> Wait {
    Wait {
        wait: Some(Duration::from_secs(2)),
        lease: Some(Duration::from_millis(lease_ms)),
        abandon_after: None,
    }
}

/// A thread's re-entry that finds its earlier hold expired (its lease ran out, here while it
/// slept; in run 39 while the server slept) is a new grant: Redisson's reply cannot tell it from
/// a re-entry that extended a live hold. The earlier hold must be trusted no longer than its own
/// lease, since another thread took the lock in the gap; extending it by the re-entry's lease made
/// the checker see two holders at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_reentry_after_the_hold_lapsed_does_not_extend_it() {
    let server = RedisServer::start();
    let sink: Sink = Default::default();
    let peer = RedissonPeer::start(&server.url(), "java", peer_config(), 7, sink.clone()).await;
    let name = "peer-model-plain";

    let outer = peer
        .acquire(1, name, false, try_for(60))
        .await
        .expect("free lock");
    let mut conn = server.async_conn().await;
    wait_until_async(
        Duration::from_secs(5),
        "the outer hold's key expired",
        || {
            let mut conn = conn.clone();
            async move {
                let n: i64 = redis::cmd("EXISTS")
                    .arg(name)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                n == 0
            }
        },
    )
    .await;
    let other = peer
        .acquire(2, name, false, try_for(1000))
        .await
        .expect("expired lock");
    let other_call = other.call_id().to_owned();
    peer.unlock(other).await.expect("the other thread's unlock");

    let inner = peer
        .acquire(1, name, false, try_for(1000))
        .await
        .expect("free again");
    assert!(outer.is_lost(), "the lapsed outer hold is lost");
    assert!(!inner.is_lost(), "the new grant is a hold of its own");
    let outer_call = outer.call_id().to_owned();
    let _ = peer.unlock(inner).await;
    let _ = peer.unlock(outer).await;
    let _: () = redis::cmd("DEL")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap();

    let events: Vec<Event> = sink.lock().unwrap().clone();
    let granted_other = events
        .iter()
        .find_map(|e| match e {
            Event::End { id, t, .. } if *id == other_call => Some(*t),
            _ => None,
        })
        .expect("the other thread's grant");
    let outer_vu = events
        .iter()
        .find_map(|e| match e {
            Event::Release { id, vu, .. } if *id == outer_call => Some(*vu),
            _ => None,
        })
        .expect("the outer release");
    assert!(
        outer_vu < granted_other,
        "the outer hold claimed validity past the other thread's grant"
    );
    let mut h: History = hist();
    h.add_events(events);
    let (violations, _) = check(&h, 9);
    assert!(
        violations.iter().all(|v| v.rule != "mutual-exclusion"),
        "{violations:?}"
    );
}
