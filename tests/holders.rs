//! Holder identity (issue 21): every acquisition call is its own holder, so calls exclude each
//! other even as futures of one task; re-entry happens only when asked for, from a guard or
//! through a `Holder` the caller passes; one holder uses one kind of lock per name.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use fairlock::{Client, Error, Holder, LockGuard};
use redis::Commands;
use support::RedisServer;

const ROUNDS: u32 = 12;

/// `lock()` on `name` through a fair or a plain handle of `client`, as one fresh holder.
async fn take(client: &Client, fair: bool, name: &str) -> LockGuard {
    if fair {
        client.fair_lock(name).lock().await.unwrap()
    } else {
        client.non_fair_lock(name).lock().await.unwrap()
    }
}

/// `force_unlock()` on `name` through a fair or a plain handle.
async fn force(client: &Client, fair: bool, name: &str) -> bool {
    if fair {
        client.fair_lock(name).force_unlock().await.unwrap()
    } else {
        client.non_fair_lock(name).force_unlock().await.unwrap()
    }
}

/// `try_lock(ZERO, None)` on `name` through a fair or a plain handle.
async fn try_now(client: &Client, fair: bool, name: &str) -> Option<LockGuard> {
    if fair {
        client.fair_lock(name).try_lock(Duration::ZERO, None).await
    } else {
        client
            .non_fair_lock(name)
            .try_lock(Duration::ZERO, None)
            .await
    }
    .unwrap()
}

/// Three futures of one task each lock, hold for a few ms (the critical section's work, not a
/// wait for an event) and unlock, `ROUNDS` times. Returns how many critical sections began while
/// another was inside.
async fn overlaps_of_three_joined_futures(client: &Client, fair: bool, name: &str) -> u32 {
    let inside = AtomicBool::new(false);
    let overlaps = AtomicU32::new(0);
    let section = || async {
        for _ in 0..ROUNDS {
            let guard = take(client, fair, name).await;
            if inside.swap(true, Ordering::SeqCst) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.store(false, Ordering::SeqCst);
            guard.unlock().await.unwrap();
        }
    };
    tokio::join!(section(), section(), section());
    overlaps.load(Ordering::SeqCst)
}

async fn futures_of_one_task_exclude_each_other() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    for fair in [true, false] {
        let name = if fair { "join-fair" } else { "join-plain" };
        let overlaps = overlaps_of_three_joined_futures(&client, fair, name).await;
        assert_eq!(overlaps, 0, "{name}: critical sections overlapped");
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left locked");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn futures_of_one_task_exclude_each_other_on_a_current_thread_runtime() {
    futures_of_one_task_exclude_each_other().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_of_one_task_exclude_each_other_on_a_multi_thread_runtime() {
    futures_of_one_task_exclude_each_other().await;
}

/// A task that holds a lock and calls `lock` again without asking to re-enter waits like anyone
/// else (as with `tokio::sync::Mutex`): its bounded second call runs out, and Redis never shows
/// a second hold.
#[tokio::test(flavor = "current_thread")]
async fn a_task_holding_a_lock_waits_for_its_own_second_call() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    for fair in [true, false] {
        let name = if fair { "again-fair" } else { "again-plain" };
        let (held, again) = if fair {
            let lock = client.fair_lock(name);
            let held = lock.lock().await.unwrap();
            (held, lock.try_lock(Duration::from_millis(150), None).await)
        } else {
            let lock = client.non_fair_lock(name);
            let held = lock.lock().await.unwrap();
            (held, lock.try_lock(Duration::from_millis(150), None).await)
        };
        assert!(again.unwrap().is_none(), "{name}: a second call re-entered");
        let hash: Vec<(String, i64)> = raw.hgetall(name).unwrap();
        assert_eq!(hash, vec![(held.owner_field().to_owned(), 1)], "{name}");
        held.unlock().await.unwrap();
        // The timed-out call gives its queue entry up in the background (no I/O in `Drop`); if
        // the release reaches Redis first, it hands the lock to that entry, and the give-up
        // passes it on: either way nothing is left.
        // (Waited for without blocking: on this one-thread runtime the give-up runs between
        // our polls.)
        support::wait_until_async(Duration::from_secs(5), "nothing left", || {
            let left = raw.exists::<_, bool>(name).unwrap();
            async move { !left }
        })
        .await;
    }
}

/// `reenter` takes one more hold at once (Redis shows Redisson's reentrant count), each hold is
/// released on its own, and a lost guard cannot re-enter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reenters_explicitly_and_redis_counts_the_holds() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    for fair in [true, false] {
        let name = if fair {
            "reenter-fair"
        } else {
            "reenter-plain"
        };
        let outer = take(&client, fair, name).await;
        let field = outer.owner_field().to_owned();
        let inner = outer.reenter(Some(Duration::from_secs(20))).await.unwrap();
        assert_eq!(inner.owner_field(), field);
        assert_eq!(inner.holder(), outer.holder());
        assert!(outer.holder().is_minted());
        let count: i64 = raw.hget(name, &field).unwrap();
        assert_eq!(count, 2, "{name}");
        assert_eq!(outer.hold_count(), 2);
        drop(inner);
        support::wait_until(Duration::from_secs(5), "one hold released", || {
            raw.hget::<_, _, i64>(name, &field).unwrap() == 1
        });
        assert_eq!(outer.hold_count(), 1);
        // Another client cannot take it meanwhile.
        assert!(try_now(&other, fair, name).await.is_none(), "{name}");
        outer.unlock().await.unwrap();
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left locked");
    }

    // A guard whose lock was taken away cannot re-enter, even once the lock is free again.
    let gone = client.fair_lock("reenter-lost").lock().await.unwrap();
    assert!(client
        .fair_lock("reenter-lost")
        .force_unlock()
        .await
        .unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(30), gone.lost())
        .await
        .expect("the loss is found at the next renewal");
    assert_eq!(reason, fairlock::LostReason::Gone);
    assert!(gone.reenter(None).await.unwrap_err().is_not_held());
    assert!(!raw.exists::<_, bool>("reenter-lost").unwrap());
}

/// A minted holder shared on purpose re-enters from other tasks and from another thread; calls
/// without it still wait. Raw ids are the non-negative ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_shared_on_purpose_reenters_across_tasks_and_threads() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    let me = client.holder();
    assert!(me.is_minted());
    assert_ne!(me, client.holder(), "every minted holder is new");
    let lock = client.fair_lock("shared").with_holder(me);
    let first = lock.lock().await.unwrap();

    let in_task = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(Duration::ZERO, None).await })
            .await
            .unwrap()
            .unwrap()
            .expect("the shared holder re-enters from another task")
    };
    let runtime = tokio::runtime::Handle::current();
    let in_thread = {
        let lock = lock.clone();
        std::thread::spawn(move || runtime.block_on(lock.lock()))
            .join()
            .unwrap()
            .expect("the shared holder re-enters from another thread")
    };
    let count: i64 = raw.hget("shared", first.owner_field()).unwrap();
    assert_eq!(count, 3);
    assert_eq!(lock.hold_count().await.unwrap(), 3);
    // Without the holder, a call of the same client waits.
    let stranger = client.fair_lock("shared");
    assert!(stranger
        .try_lock(Duration::from_millis(100), None)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        stranger.hold_count().await.unwrap(),
        3,
        "all of this client's holds"
    );

    drop(in_task);
    drop(in_thread);
    first.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("shared").unwrap());

    let raw_holder = Holder::from_raw(42).unwrap();
    assert_eq!(raw_holder.id(), 42);
    let g = client
        .non_fair_lock("raw")
        .with_holder(raw_holder)
        .lock()
        .await
        .unwrap();
    assert_eq!(g.owner_field(), format!("{}:42", client.id()));
    g.unlock().await.unwrap();
    assert!(Holder::from_raw(-5).unwrap_err().is_invalid_input());
}

/// Review defect 1: a holder that holds a name as a `NonFairLock` and then asks for it as a
/// `FairLock` (or the other way round) used to get a second account on the same owner field: the
/// fair unlock released both holds and deleted the key while the plain guard still believed it
/// held the lock. Now the second kind is refused before anything is sent, and the first hold is
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_cannot_use_one_name_as_both_kinds() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    for plain_first in [true, false] {
        let name = if plain_first { "kinds-1" } else { "kinds-2" };
        let me = client.holder();
        let plain = client.non_fair_lock(name).with_holder(me);
        let fair = client.fair_lock(name).with_holder(me);
        let (first, second) = if plain_first {
            let g = plain.lock().await.unwrap();
            (g, fair.try_lock(Duration::ZERO, None).await)
        } else {
            let g = fair.lock().await.unwrap();
            (g, plain.try_lock(Duration::ZERO, None).await)
        };
        match second {
            Err(Error::KindConflict {
                name: n, held_as, ..
            }) => {
                assert_eq!(n, name);
                assert_eq!(held_as, if plain_first { "plain" } else { "fair" });
            }
            other => panic!("{name}: expected a kind conflict, got {other:?}"),
        }
        let count: i64 = raw.hget(name, first.owner_field()).unwrap();
        assert_eq!(count, 1, "{name}: the refused call wrote nothing");
        assert!(try_now(&other, false, name).await.is_none());
        assert!(!first.is_lost());
        first.unlock().await.unwrap();
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left locked");
        // Once the first kind's state is gone, the holder may use the other kind.
        let g = if plain_first {
            fair.lock().await.unwrap()
        } else {
            plain.lock().await.unwrap()
        };
        g.unlock().await.unwrap();
    }
}

/// Calls without a holder never share an owner field, even one after another in one task.
#[tokio::test(flavor = "current_thread")]
async fn every_call_writes_its_own_owner_field() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let lock = client.non_fair_lock("fields");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let g = lock.lock().await.unwrap();
        assert!(
            seen.insert(g.owner_field().to_owned()),
            "a field was reused"
        );
        g.unlock().await.unwrap();
    }
}

/// `reenter` on a guard whose holds were taken away unnoticed (a force unlock the watchdog has
/// not seen yet), while the lock is free: the call takes the lock afresh as a hold of its own,
/// and the older guard is reported lost at once rather than believing it still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentering_a_lock_taken_away_unnoticed_takes_it_afresh_and_reports_the_old_guard_lost() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    for fair in [true, false] {
        let name = if fair {
            "unnoticed-fair"
        } else {
            "unnoticed-plain"
        };
        let old = take(&client, fair, name).await;
        assert!(force(&other, fair, name).await);
        assert!(!old.is_lost(), "{name}: no renewal has run yet");
        let fresh = old.reenter(None).await.unwrap();
        let count: i64 = raw.hget(name, fresh.owner_field()).unwrap();
        assert_eq!(count, 1, "{name}: a hold of its own, not a second one");
        assert!(
            old.is_lost(),
            "{name}: the old guard learns it lost its hold"
        );
        assert!(!fresh.is_lost());
        assert!(old.unlock().await.unwrap_err().is_not_held());
        assert_eq!(raw.hget::<_, _, i64>(name, fresh.owner_field()).unwrap(), 1);
        fresh.unlock().await.unwrap();
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left locked");
    }
}
