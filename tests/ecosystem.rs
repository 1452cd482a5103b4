//! Fitting into a redis-rs application: connection infos and `redis::Client`s of one's own, the
//! database they name, connection names in `CLIENT LIST` (kept across reconnects), the health
//! call, and the number of connections a client opens.

use std::time::Duration;

use fairlock::redis::{ConnectionInfo, IntoConnectionInfo};
use fairlock::{Client, SubscriberState};
use fairlock_testkit as support;
use support::{joined, queue_len, wait_until, wait_until_async, RedisServer};

/// `CLIENT LIST` as `(id, name, db)` per connection.
fn connections(server: &RedisServer) -> Vec<(u64, String, i64)> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    list.lines()
        .map(|line| {
            let field = |key: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                    .unwrap_or("")
                    .to_owned()
            };
            (
                field("id").parse().unwrap(),
                field("name"),
                field("db").parse().unwrap(),
            )
        })
        .collect()
}

/// The connections named `fairlock:<client>:<role>`.
fn named(server: &RedisServer, client: &Client, role: &str) -> Vec<(u64, i64)> {
    let name = format!("fairlock:{}:{role}", client.id());
    connections(server)
        .into_iter()
        .filter(|(_, n, _)| *n == name)
        .map(|(id, _, db)| (id, db))
        .collect()
}

fn exists_in_db(server: &RedisServer, db: i64, key: &str) -> bool {
    let mut conn = server.conn();
    let _: () = redis::cmd("SELECT").arg(db).query(&mut conn).unwrap();
    redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap()
}

/// Makes `name` wait in `waiter` behind a hold of `holder` (both on database `db`), then hands
/// it over.
async fn wait_once(server: &RedisServer, db: i64, holder: &Client, waiter: &Client, name: &str) {
    let held = holder.fair_lock(name).lock().await.unwrap();
    let call = {
        let lock = waiter.fair_lock(name);
        tokio::spawn(async move { lock.lock().await })
    };
    let mut conn = server.conn();
    let _: () = redis::cmd("SELECT").arg(db).query(&mut conn).unwrap();
    wait_until(Duration::from_secs(10), "the waiter is queued", || {
        queue_len(&mut conn, name) == 1
    });
    held.unlock().await.unwrap();
    joined(call, Duration::from_secs(5), "the waiter gets the lock")
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_infos_and_redis_clients_are_used_as_given_with_their_database() {
    let server = RedisServer::start();
    // A connection info of one's own, naming database 3.
    let info: ConnectionInfo = format!("{}/3", server.url())
        .into_connection_info()
        .unwrap();
    let by_info = Client::builder().standalone(info).build().await.unwrap();
    // A redis::Client of one's own, naming database 4.
    let redis = fairlock::redis::Client::open(format!("{}/4", server.url())).unwrap();
    let by_client = Client::builder()
        .standalone_client(redis)
        .build()
        .await
        .unwrap();
    // A (host, port) pair: database 0.
    let by_pair = Client::builder()
        .standalone(("127.0.0.1", server.port()))
        .build()
        .await
        .unwrap();
    // `connect` takes the same: a `String` naming database 5, a connection info naming 6, and
    // `from_redis` a redis::Client naming 7.
    let by_string = Client::connect(format!("{}/5", server.url()))
        .await
        .unwrap();
    let info6: ConnectionInfo = format!("{}/6", server.url())
        .into_connection_info()
        .unwrap();
    let by_connect_info = Client::connect(info6).await.unwrap();
    let redis7 = fairlock::redis::Client::open(format!("{}/7", server.url())).unwrap();
    let by_from_redis = Client::from_redis(redis7).await.unwrap();
    // The builder takes a `&String` too.
    let url8 = format!("{}/8", server.url());
    let by_ref_string = Client::builder().standalone(&url8).build().await.unwrap();
    for (client, db) in [
        (&by_info, 3),
        (&by_client, 4),
        (&by_pair, 0),
        (&by_string, 5),
        (&by_connect_info, 6),
        (&by_from_redis, 7),
        (&by_ref_string, 8),
    ] {
        let guard = client.fair_lock("db-test").lock().await.unwrap();
        for other in [0, 3, 4, 5, 6, 7, 8] {
            assert_eq!(
                exists_in_db(&server, other, "db-test"),
                other == db,
                "a client of database {db} seen from database {other}"
            );
        }
        guard.unlock().await.unwrap();
        let cmd = named(&server, client, "cmd");
        assert_eq!(cmd.len(), 1, "{cmd:?}");
        assert_eq!(cmd[0].1, db, "the command connection uses database {db}");
    }
    // A waiter in database 4 is woken by a release in database 4 (channels span databases, keys
    // do not).
    let other = Client::builder()
        .standalone(format!("{}/4", server.url()))
        .build()
        .await
        .unwrap();
    wait_once(&server, 4, &other, &by_client, "db-wait").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_named_counted_and_named_again_after_a_reconnect() {
    let server = RedisServer::start();
    let (a, b) = (
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    );
    // Before any wait: one command connection, no subscription connection.
    assert_eq!(named(&server, &b, "cmd").len(), 1);
    assert!(named(&server, &b, "sub").is_empty());
    wait_once(&server, 0, &a, &b, "named").await;
    // After a wait: exactly the two connections the documentation promises, both named.
    let ours = |c: &Client| {
        let prefix = format!("fairlock:{}:", c.id());
        connections(&server)
            .into_iter()
            .filter(|(_, n, _)| n.starts_with(&prefix))
            .count()
    };
    assert_eq!(ours(&b), 2);
    assert_eq!(named(&server, &b, "sub").len(), 1);

    // Kill both of b's connections: they come back under their names.
    let (cmd_id, sub_id) = (
        named(&server, &b, "cmd")[0].0,
        named(&server, &b, "sub")[0].0,
    );
    for id in [cmd_id, sub_id] {
        let _: () = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query(&mut server.conn())
            .unwrap();
    }
    let lock = b.fair_lock("named");
    wait_until_async(
        Duration::from_secs(10),
        "the command connection is back under its name",
        || {
            let lock = lock.clone();
            let server = &server;
            let b = &b;
            async move {
                // A failing command makes the connection manager reconnect.
                let _ = lock.is_locked().await;
                named(server, b, "cmd").iter().any(|(id, _)| *id != cmd_id)
            }
        },
    )
    .await;
    wait_once(&server, 0, &a, &b, "named").await;
    wait_until(
        Duration::from_secs(10),
        "the subscription connection is back under its name",
        || {
            named(&server, &b, "sub")
                .iter()
                .any(|(id, _)| *id != sub_id)
        },
    );
    assert_eq!(ours(&b), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_pings_and_reports_the_subscription_connection() {
    let mut server = RedisServer::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::builder()
        .standalone(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let health = b.health().await.unwrap();
    assert_eq!(health.subscriber, SubscriberState::Idle);
    assert_eq!(b.subscriber_state(), SubscriberState::Idle);
    assert!(health.round_trip < Duration::from_secs(3), "{health:?}");
    wait_once(&server, 0, &a, &b, "health").await;
    assert_eq!(
        b.health().await.unwrap().subscriber,
        SubscriberState::Connected
    );

    // A call waits while the server goes away: the ping fails and the subscriber reconnects.
    let held = a.fair_lock("health-2").lock().await.unwrap();
    let waiting = {
        let lock = b.fair_lock("health-2");
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "the waiter is queued", || {
        queue_len(&mut server.conn(), "health-2") == 1
    });
    server.kill();
    let err = b.health().await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    wait_until(Duration::from_secs(10), "the subscriber notices", || {
        b.subscriber_state() == SubscriberState::Reconnecting
    });
    b.shutdown().await;
    assert!(b.health().await.unwrap_err().is_shutdown());
    let outcome = joined(waiting, Duration::from_secs(10), "the waiting call ends").await;
    assert!(outcome.unwrap_err().is_shutdown());
    drop(held);
}

/// A server that needs a password: `connect` (and the builder's `build`) fail at once with an
/// authentication error when the password is missing or wrong, instead of succeeding and letting
/// the first lock fail with a protocol error. With the right password, locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_when_connecting() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut raw)
        .unwrap();
    let port = server.port();
    for url in [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://nobody:s3cret@127.0.0.1:{port}"),
    ] {
        let e = Client::connect(&url).await.unwrap_err();
        assert!(e.is_authentication(), "{url}: {e:?}");
        assert!(e.to_string().contains("credentials"), "{e}");
        let e = Client::builder()
            .standalone(url.as_str())
            .build()
            .await
            .unwrap_err();
        assert!(e.is_authentication(), "{url}: {e:?}");
    }
    let c = Client::connect(&format!("redis://:s3cret@127.0.0.1:{port}"))
        .await
        .unwrap();
    let guard = c.fair_lock("behind-a-password").lock().await.unwrap();
    guard.unlock().await.unwrap();
}

/// Errors follow the Rust API guidelines: the message shows no cause, and the chain below it shows
/// redis-rs's error once, so anyhow's `{:#}` prints each cause once (it printed the I/O error
/// twice: once in redis-rs's message, once as its source).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_prints_its_cause_once() {
    let port = {
        let server = RedisServer::start();
        server.port()
    };
    let e = Client::builder()
        .standalone(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(e.is_redis(), "{e:?}");
    assert_eq!(e.to_string(), "Redis request failed");
    let cause = e.redis_error().expect("a Redis error").to_string();
    let report = format!("{:#}", anyhow::Error::new(e.clone()));
    assert_eq!(report, format!("Redis request failed: {cause}"));
    assert!(std::error::Error::source(&e)
        .and_then(std::error::Error::source)
        .is_none());
}
