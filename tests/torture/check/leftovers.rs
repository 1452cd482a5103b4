//! Leftovers, checked against Redis itself at the end of a run rather than over the history
//! (reported as `[run]` problems): every lock can be taken once more, every permit of the
//! semaphore is back, and then nothing but the fencing counters is left (no key, no channel, no
//! shard channel).

use std::time::{Duration, Instant};

use crate::child::{build_client, Acq, AcqKind, Handle, Kind};
use crate::config::*;
use crate::faults::admin_conn;

/// Takes every lock once more with a fresh client (after the liveness window, so dead waiters
/// get purged), then waits until nothing but the fencing counters is left in Redis.
pub async fn leftovers(port: u16) -> (Vec<String>, Option<i64>) {
    let mut problems = Vec::new();
    let url = format!("redis://127.0.0.1:{port}");
    let c = build_client(&url).await;
    tokio::time::sleep(TIMING.liveness).await; // the window itself is the scenario
    let names = FAIR_NAMES
        .iter()
        .map(|n| (*n, Kind::Fair))
        .chain(PLAIN_NAMES.iter().map(|n| (*n, Kind::Plain)))
        // The write side: free only when every reader left or died (its lease keys expired).
        .chain(RW_NAMES.iter().map(|n| (*n, Kind::Write)));
    for (name, kind) in names {
        let h = Handle::new(&c, name, kind, c.holder());
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let acq = Acq {
                kind: AcqKind::Try(Duration::ZERO, Some(Duration::from_millis(200))),
                cancel_after: None,
            };
            if let Ok(Some(g)) = h.run(&acq).await {
                let _ = g.unlock().await;
                break;
            }
            if Instant::now() >= until {
                let state = h.describe().await;
                problems.push(format!(
                    "{name} could not be taken 15 s after the load stopped: {state}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every permit back once the dead holders' leases ran out (the count call reclaims them, at
    // most 1,000 a call), then the semaphore is deleted so that the key check below sees nothing
    // of it.
    for name in [SEM_NAME, BIG_SEM_NAME] {
        let limit = sem_limit(name) as i64;
        let sem = c.expirable_semaphore(name);
        let until = Instant::now() + Duration::from_secs(15);
        let mut counted = None;
        loop {
            let now = (sem.available().await, sem.acquired().await);
            if let (Ok(available), Ok(acquired)) = &now {
                counted = Some((*available, *acquired));
                if *available == limit && *acquired == 0 {
                    break;
                }
            }
            if Instant::now() >= until {
                problems.push(format!(
                    "permits lost: {name} has (available, in use) {counted:?} 15 s after the load \
                     stopped, not ({limit}, 0)"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = sem.delete().await;
    }
    // The plain semaphore: its count is read here and judged against the history by the
    // parent (killed holders' permits never come back); then it goes too.
    let plain = c.semaphore(SEM_PLAIN_NAME);
    let plain_count = plain.available().await.ok();
    let _ = plain.delete().await;
    c.shutdown().await;
    drop(c);
    let mut admin = admin_conn(port).expect("admin connection at teardown");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut admin).unwrap();
        let keys: Vec<String> = keys
            .into_iter()
            .filter(|k| !k.starts_with("redisson_lock_token:"))
            .collect();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("*")
            .query(&mut admin)
            .unwrap();
        // Redis 6.2 has no sharded pub/sub (nor `PUBSUB SHARDCHANNELS`): nothing to leave there.
        let shard: Vec<String> = if fairlock_testkit::test_server().kind.has_sharded_pubsub() {
            redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg("*")
                .query(&mut admin)
                .unwrap()
        } else {
            Vec::new()
        };
        if keys.is_empty() && channels.is_empty() && shard.is_empty() {
            break;
        }
        if Instant::now() >= until {
            let mut described = Vec::new();
            for k in &keys {
                let ty: String = redis::cmd("TYPE").arg(k).query(&mut admin).unwrap();
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut admin).unwrap();
                described.push(format!("{k} ({ty}, pttl {ttl})"));
            }
            problems.push(format!(
                "left behind 10 s after the final touch: keys {described:?}, channels {channels:?}, \
                 shard channels {shard:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (problems, plain_count)
}
