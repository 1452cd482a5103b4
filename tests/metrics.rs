//! The metrics the library emits (cargo feature `metrics`), read back from an in-memory recorder:
//! every metric the README lists, with its labels, after driving real locks against a real Redis.
#![cfg(feature = "metrics")]

use fairlock_testkit as support;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fairlock::{Client, LostReason};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{wait_until_async, RedisServer};

type Labels = Vec<(String, String)>;

/// The recorder's snapshots, accumulated: a snapshot drains histogram samples, so the samples of
/// every snapshot taken so far are kept here.
struct Recorded {
    snapshotter: Snapshotter,
    samples: Mutex<HashMap<(String, Labels), u64>>,
}

/// Installs the recorder (once per test process; nextest runs each test in its own).
fn recorder() -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this process");
    Recorded {
        snapshotter,
        samples: Mutex::new(HashMap::new()),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut v: Labels = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

impl Recorded {
    /// Takes a snapshot: counters and gauges as they are now, histogram samples added up.
    fn read(&self) -> HashMap<(String, Labels), u64> {
        let mut samples = self.samples.lock().unwrap();
        let mut now = HashMap::new();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut l: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            l.sort();
            let id = (key.name().to_owned(), l);
            match value {
                DebugValue::Counter(c) => {
                    now.insert(id, c);
                }
                DebugValue::Gauge(_) => {
                    now.insert(id, 1);
                }
                DebugValue::Histogram(h) => {
                    *samples.entry(id).or_default() += h.len() as u64;
                }
            }
        }
        for (id, n) in samples.iter() {
            now.insert(id.clone(), *n);
        }
        now
    }

    /// The counter's value, or the number of histogram samples recorded so far.
    fn count(&self, name: &str, want: &[(&str, &str)]) -> u64 {
        self.read()
            .get(&(name.to_owned(), labels(want)))
            .copied()
            .unwrap_or(0)
    }

    /// Whether any metric carries a label named `label`.
    fn any_label(&self, label: &str) -> bool {
        self.read()
            .keys()
            .any(|(_, l)| l.iter().any(|(k, _)| k == label))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_metric_is_emitted_with_its_labels() {
    let s = recorder();
    let server = RedisServer::start();
    let c = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(300))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let d = Client::connect(&server.url()).await.unwrap();

    // Acquired, held, released; timed out; an error; a cancelled call.
    let fair = c.fair_lock("m-fair");
    // A long lease: the head waiter below sleeps until a message, not until the lock's TTL.
    let g = fair.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    // A watchdog lock, renewed every 100 ms (300 ms timeout).
    let renewed = c.non_fair_lock("m-renewed").lock().await.unwrap();
    let timed_out = d
        .fair_lock("m-fair")
        .try_lock(Duration::from_millis(50), None)
        .await
        .unwrap();
    assert!(timed_out.is_none());
    let bad = c
        .non_fair_lock("m-plain")
        .lock_with_lease(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(bad.is_invalid_input());
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), d.fair_lock("m-fair").lock()).await;
    assert!(cancelled.is_err());

    // The cancelled call leaves the queue in the background first.
    let mut raw = server.conn();
    wait_until_async(Duration::from_secs(5), "the cancelled call left", || {
        let n: i64 = redis::Commands::llen(&mut raw, "redisson_lock_queue:{m-fair}").unwrap();
        async move { n == 0 }
    })
    .await;

    // A queued waiter, woken by the release: queue position and hand-over.
    let waiter = {
        let lock = d.fair_lock("m-fair");
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    queued_and_subscribed(&mut raw).await;
    // The watchdog renews while we hold (300 ms timeout: a renewal every 100 ms).
    wait_until_async(Duration::from_secs(5), "a renewal", || {
        let renewed = s.count("fairlock_renewals_total", &[("result", "ok")]) > 0;
        async move { renewed }
    })
    .await;
    g.unlock().await.unwrap();
    renewed.unlock().await.unwrap();
    support::joined(waiter, Duration::from_secs(5), "the waiter").await;
    // The waiter's re-check attempt (sent right after it subscribed) can cross the release and
    // take the hold up from Redis: no message woke it, so no hand-over was timed. Such rounds
    // are run again until one is.
    for _ in 0..10 {
        if s.count("fairlock_handover_seconds", &[("kind", "fair")]) > 0 {
            break;
        }
        let g = fair.lock_with_lease(Duration::from_secs(10)).await.unwrap();
        let waiter = {
            let lock = d.fair_lock("m-fair");
            tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
        };
        queued_and_subscribed(&mut raw).await;
        g.unlock().await.unwrap();
        support::joined(waiter, Duration::from_secs(5), "the waiter").await;
    }

    // A lost lock.
    let short = c
        .non_fair_lock("m-plain")
        .lock_with_lease(Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(short.lost().await, LostReason::LeaseExpired);
    drop(short);

    let fair_kind = [("kind", "fair")];
    for outcome in ["acquired", "timed_out", "cancelled"] {
        let l = [("kind", "fair"), ("outcome", outcome)];
        assert!(s.count("fairlock_acquisitions_total", &l) >= 1, "{outcome}");
        assert!(s.count("fairlock_wait_seconds", &l) >= 1, "{outcome}");
    }
    assert_eq!(
        s.count(
            "fairlock_acquisitions_total",
            &[("kind", "plain"), ("outcome", "error")]
        ),
        1
    );
    assert!(s.count("fairlock_queue_position", &fair_kind) >= 1);
    assert!(
        s.count("fairlock_handover_seconds", &fair_kind) >= 1,
        "{:?}",
        s.read()
    );
    assert!(s.count("fairlock_hold_seconds", &fair_kind) >= 2);
    assert!(s.count("fairlock_hold_seconds", &[("kind", "plain")]) >= 2);
    assert!(s.count("fairlock_renewal_calls_total", &[]) >= 1);
    assert_eq!(
        s.count(
            "fairlock_lost_total",
            &[("kind", "plain"), ("reason", "lease_expired")]
        ),
        1,
        "{:?}",
        s.read()
    );
    assert_eq!(
        s.count("fairlock_driver_pending", &[]),
        1,
        "the gauge exists"
    );
    // No lock names unless asked for.
    assert!(!s.any_label("lock"));
    // Every metric carries its unit and help text (Prometheus `# HELP`).
    let mut described = std::collections::BTreeSet::new();
    for (key, unit, help, _) in s.snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        assert!(unit.is_some(), "{name} has no unit");
        assert!(
            help.is_some_and(|h| h.len() > 10),
            "{name} has no help text"
        );
        described.insert(name);
    }
    assert_eq!(described.len(), 9, "{described:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_output_has_help_lines() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this process");
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    c.fair_lock("help").run(async {}).await.unwrap();
    let text = handle.render();
    for name in [
        "fairlock_acquisitions_total",
        "fairlock_wait_seconds",
        "fairlock_hold_seconds",
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_names_are_labels_only_when_asked_for() {
    let s = recorder();
    let server = RedisServer::start();
    let c = Client::builder()
        .standalone(server.url())
        .metrics_lock_names(true)
        .build()
        .await
        .unwrap();
    c.non_fair_lock("orders:7")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let l = [
        ("kind", "plain"),
        ("lock", "orders:7"),
        ("outcome", "acquired"),
    ];
    assert_eq!(s.count("fairlock_acquisitions_total", &l), 1);
    assert_eq!(
        s.count(
            "fairlock_hold_seconds",
            &[("kind", "plain"), ("lock", "orders:7")]
        ),
        1
    );
}

/// Waits until one waiter is queued on `m-fair` and sleeps on its own channel (subscribed; its
/// re-check attempt may still be on its way).
async fn queued_and_subscribed(raw: &mut redis::Connection) {
    wait_until_async(Duration::from_secs(5), "the waiter queued", || {
        let n: i64 = redis::Commands::llen(raw, "redisson_lock_queue:{m-fair}").unwrap();
        async move { n == 1 }
    })
    .await;
    let head: String = redis::Commands::lindex(raw, "redisson_lock_queue:{m-fair}", 0).unwrap();
    let channel = format!("redisson_lock__channel:{{m-fair}}:{head}");
    wait_until_async(Duration::from_secs(5), "the waiter subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(raw)
            .unwrap();
        async move { n == 1 }
    })
    .await;
}
