//! Work that stops when the lock is lost: `run` on handles and guards, the owned `LostSignal`
//! for spawned subtasks, and `extend` for fixed leases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, LostReason};
use fairlock_testkit as support;
use redis::Commands;
use support::{joined, RedisServer};

async fn client(server: &RedisServer) -> Client {
    Client::builder()
        .standalone(server.url())
        // Renewals every 100 ms: a force unlock is noticed quickly.
        .watchdog_timeout(Duration::from_millis(300))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap()
}

/// Sets its flag when dropped: shows that `run` dropped the work.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_the_output_and_releases_on_both_kinds() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let fair = c.fair_lock("run-fair");
    let out = fair
        .run(async {
            assert!(server.conn().exists::<_, bool>("run-fair").unwrap());
            7
        })
        .await
        .unwrap();
    assert_eq!(out, 7);
    assert!(!fair.is_locked().await.unwrap(), "released after the work");
    let plain = c.non_fair_lock("run-plain");
    let out = plain.run(async { "done" }).await.unwrap();
    assert_eq!(out, "done");
    assert!(!plain.is_locked().await.unwrap());
    // A guard taken another way runs work the same way.
    let guard = fair
        .try_lock(Duration::from_secs(1), Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.run(async { 1 + 1 }).await.unwrap(), 2);
    assert!(!fair.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_drops_the_work_the_moment_the_lock_is_lost() {
    let server = RedisServer::start();
    let (c, other) = (client(&server).await, client(&server).await);
    // Lost to a force unlock: found by the next renewal.
    let dropped = Arc::new(AtomicBool::new(false));
    let work = {
        let flag = DropFlag(dropped.clone());
        async move {
            let _flag = flag;
            std::future::pending::<()>().await
        }
    };
    let lock = c.fair_lock("run-lost");
    let task = tokio::spawn(async move { lock.run(work).await });
    support::wait_until(Duration::from_secs(10), "the lock is taken", || {
        server.conn().exists::<_, bool>("run-lost").unwrap()
    });
    assert!(other.fair_lock("run-lost").force_unlock().await.unwrap());
    let err = joined(task, Duration::from_secs(5), "run ends with the loss")
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        matches!(err, fairlock::Error::Lost { reason: LostReason::Gone, ref name } if name == "run-lost"),
        "{err:?}"
    );
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");

    // Lost to its own lease: at the validity deadline, not later.
    let guard = c
        .non_fair_lock("run-lease")
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    let deadline = guard.valid_until();
    let err = guard.run(std::future::pending::<()>()).await.unwrap_err();
    assert!(Instant::now() >= deadline);
    assert!(
        matches!(
            err,
            fairlock::Error::Lost {
                reason: LostReason::LeaseExpired,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_reaches_spawned_subtasks_on_loss_and_on_release() {
    let server = RedisServer::start();
    let (c, other) = (client(&server).await, client(&server).await);
    let guard = c.fair_lock("signal").lock().await.unwrap();
    let signal = guard.lost_signal();
    assert!(!signal.is_lost());
    let subtasks: Vec<_> = (0..3)
        .map(|_| {
            let signal = signal.clone();
            tokio::spawn(async move { signal.lost().await })
        })
        .collect();
    assert!(other.fair_lock("signal").force_unlock().await.unwrap());
    for task in subtasks {
        let reason = joined(task, Duration::from_secs(5), "every subtask is told").await;
        assert_eq!(reason, LostReason::Gone);
    }
    assert!(signal.is_lost());
    // The reason stays after the guard is gone.
    drop(guard);
    assert_eq!(signal.lost().await, LostReason::Gone);

    // Released: by unlock, and by drop.
    let guard = c.fair_lock("signal").lock().await.unwrap();
    let signal = guard.lost_signal();
    let waiting = {
        let signal = signal.clone();
        tokio::spawn(async move { signal.lost().await })
    };
    guard.unlock().await.unwrap();
    let reason = joined(waiting, Duration::from_secs(5), "told of the unlock").await;
    assert_eq!(reason, LostReason::Released);
    let guard = c.non_fair_lock("signal-2").lock().await.unwrap();
    let signal = guard.lost_signal();
    assert!(!signal.is_lost());
    drop(guard);
    assert!(signal.is_lost());
    assert_eq!(signal.lost().await, LostReason::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_lengthens_a_fixed_lease_and_never_shortens_one() {
    let server = RedisServer::start();
    let (c, other) = (client(&server).await, client(&server).await);
    let lease = Duration::from_millis(400);
    let guard = c.fair_lock("ext").lock_with_lease(lease).await.unwrap();
    let first = guard.valid_until();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    assert!(guard.valid_until() > first + Duration::from_secs(3));
    let pttl: i64 = server.conn().pttl("ext").unwrap();
    assert!(pttl > 4_000, "{pttl}");
    // A shorter extension changes nothing.
    guard.extend(Duration::from_millis(100)).await.unwrap();
    let pttl: i64 = server.conn().pttl("ext").unwrap();
    assert!(pttl > 3_000, "{pttl}");
    // Past the original lease the lock is still held and trusted.
    tokio::time::sleep_until((first + lease).into()).await;
    assert!(!guard.is_lost());
    assert!(server.conn().exists::<_, bool>("ext").unwrap());
    // Another client cannot take it.
    let try_other = other
        .fair_lock("ext")
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(try_other.is_none());
    // A watchdog hold is not extended; a bad lease is refused.
    let watchdog = c.non_fair_lock("ext-wd").lock().await.unwrap();
    assert!(watchdog
        .extend(Duration::from_secs(1))
        .await
        .unwrap_err()
        .is_invalid_argument());
    assert!(guard
        .extend(Duration::ZERO)
        .await
        .unwrap_err()
        .is_invalid_argument());
    // A hold that is gone is not extended, and the guard learns it is lost.
    assert!(other.fair_lock("ext").force_unlock().await.unwrap());
    assert!(guard
        .extend(Duration::from_secs(5))
        .await
        .unwrap_err()
        .is_not_held());
    assert!(guard.is_lost());
    assert!(
        !server.conn().exists::<_, bool>("ext").unwrap(),
        "not recreated"
    );
}
