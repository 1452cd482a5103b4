//! The proxy and the peer on their own, against a real redis-server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::Client;
use fairlock_testkit::history::{Event, Outcome};
use fairlock_testkit::redisson_peer::{RedissonPeer, Sink, Wait};
use fairlock_testkit::{Proxy, RedisServer};

use crate::config::*;
use fairlock_testkit::wait_until;
use redis::Commands;

fn conn_via(proxy: &Proxy, read_timeout: Duration) -> redis::Connection {
    let c = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    c.set_read_timeout(Some(read_timeout)).unwrap();
    c
}

#[test]
fn proxy_passes_commands_and_shows_its_upstream_addresses() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut c = conn_via(&proxy, Duration::from_secs(2));
    let _: () = c.set("k", "v").unwrap();
    assert_eq!(c.get::<_, String>("k").unwrap(), "v");
    assert_eq!(proxy.open_connections(), 1);
    let addrs = proxy.upstream_addrs();
    assert_eq!(addrs.len(), 1);
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    assert!(list.contains(&format!("addr={}", addrs[0])), "{list}");
}

#[test]
fn proxy_latency_delays_replies() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut c = conn_via(&proxy, Duration::from_secs(5));
    proxy.set_latency(Duration::from_millis(100), Duration::from_millis(150));
    let started = Instant::now();
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    assert!(started.elapsed() < Duration::from_millis(250));
}

#[test]
fn a_blackholed_reply_is_lost_after_the_command_ran_and_the_connection_is_then_reset() {
    let server = RedisServer::start();
    let mut direct = server.conn();
    let proxy = Proxy::start(server.port());
    let mut c = conn_via(&proxy, Duration::from_millis(300));
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    proxy.set_blackhole_replies(true);
    let r: redis::RedisResult<()> = c.set("ran", "yes");
    assert!(r.unwrap_err().is_timeout());
    // The command ran all the same.
    assert_eq!(
        direct.get::<_, Option<String>>("ran").unwrap().as_deref(),
        Some("yes")
    );
    proxy.set_blackhole_replies(false);
    // The connection that lost a reply is reset, never handed a later reply for an earlier
    // request.
    let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
    assert!(r.is_err(), "{r:?}");
    let mut fresh = conn_via(&proxy, Duration::from_secs(2));
    let _: String = redis::cmd("PING").query(&mut fresh).unwrap();
}

#[test]
fn a_blackholed_request_never_runs() {
    let server = RedisServer::start();
    let mut direct = server.conn();
    let proxy = Proxy::start(server.port());
    let mut c = conn_via(&proxy, Duration::from_millis(300));
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    proxy.set_blackhole_requests(true);
    let r: redis::RedisResult<()> = c.set("ran", "yes");
    assert!(r.unwrap_err().is_timeout());
    proxy.set_blackhole_requests(false);
    assert_eq!(direct.get::<_, Option<String>>("ran").unwrap(), None);
}

#[test]
fn reset_drops_open_connections_and_refusal_turns_new_ones_away() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut c = conn_via(&proxy, Duration::from_secs(2));
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(proxy.reset_all(), 1);
    let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
    let e = r.unwrap_err();
    assert!(e.is_connection_dropped() || e.is_io_error(), "{e:?}");
    wait_until(
        Duration::from_secs(5),
        "the reset connection is gone",
        || proxy.open_connections() == 0,
    );
    proxy.refuse_for(Duration::from_secs(30));
    let refused = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(refused.is_err());
    assert!(proxy.counts().1 >= 1);
    proxy.stop_refusing();
    let mut c = conn_via(&proxy, Duration::from_secs(2));
    let _: String = redis::cmd("PING").query(&mut c).unwrap();
}

/// The peer queues behind a fairlock holder, is woken by our release on its own channel (long
/// before its TTL-based re-poll), shifts every deadline by its wait when it takes the lock,
/// and its release wakes our waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redisson_peer_queues_and_hands_over_with_fairlock() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let sink: Sink = Arc::new(Mutex::new(Vec::new()));
    let peer = RedissonPeer::start(&server.url(), "java", peer_config(), 7, sink.clone()).await;
    let c = Client::connect(&server.url()).await.unwrap();
    let held = c.fair_lock("handover").fenced().lock().await.unwrap();
    assert_eq!(held.fencing_token(), Some(1));
    let p = peer.clone();
    let java = tokio::spawn(async move {
        let how = Wait {
            wait: Some(Duration::from_secs(20)),
            lease: None,
            abandon_after: None,
        };
        let g = p.acquire(101, "handover", true, how).await;
        (Instant::now(), g)
    });
    let queue = "redisson_lock_queue:{handover}";
    wait_until(Duration::from_secs(10), "the peer queued", || {
        raw.lrange::<_, Vec<String>>(queue, 0, -1).unwrap() == vec![peer.field(101)]
    });
    let lc = c.fair_lock("handover");
    let ours = tokio::spawn(async move { lc.try_lock(Duration::from_secs(20), None).await });
    wait_until(
        Duration::from_secs(10),
        "our waiter queued behind it",
        || raw.llen::<_, i64>(queue).unwrap() == 2,
    );
    let released = Instant::now();
    held.unlock().await.unwrap();
    let (at, g) = java.await.unwrap();
    let g = g.expect("the peer got the lock");
    assert!(
        at - released < Duration::from_secs(5),
        "woken by message, not by polling"
    );
    // Taking the lock shifted every deadline by the peer's wait (recorded for the checker).
    assert!(sink
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, Event::Shift { ms: 20_000, .. })));
    assert_eq!(peer.unlock(g).await, Ok(1));
    let guard = ours
        .await
        .unwrap()
        .unwrap()
        .expect("our waiter got it next");
    guard.unlock().await.unwrap();
    let calls: Vec<Event> = sink.lock().unwrap().clone();
    assert!(calls.iter().any(|e| matches!(
        e,
        Event::End {
            outcome: Outcome::Granted,
            token: Some(2),
            ..
        }
    )));
}
