//! Smoke tests of the test harness itself (`tests/support`): real processes, real ports.

use fairlock_testkit as support;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Commands};
use support::{info_field, wait_until, RedisCluster, RedisServer, SentinelGroup};

fn refuses_connections(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_serves_commands_and_kill_closes_the_port() {
    support::init_tracing();
    let mut server = RedisServer::start();
    assert!((20_000..=40_000).contains(&server.port()));
    assert!(server.is_running());
    assert!(server.dir().is_dir());

    let mut conn = server.conn();
    let _: () = conn.set("greeting", "hello").unwrap();
    let got: String = conn.get("greeting").unwrap();
    assert_eq!(got, "hello");

    let mut aconn = server.async_conn().await;
    let got: String = aconn.get("greeting").await.unwrap();
    assert_eq!(got, "hello");

    // The work dir holds the server's log, and INFO reports the pid we hold.
    assert!(server.log_tail(50).contains("Ready to accept connections"));
    let info = server.info("server");
    assert_eq!(
        info_field(&info, "process_id"),
        Some(&*server.pid().to_string())
    );

    server.kill();
    assert!(!server.is_running());
    assert!(refuses_connections(server.port()));
}

#[test]
fn a_killed_servers_port_stays_claimed_until_the_value_is_dropped() {
    // Sentinels and cluster nodes keep a killed server's address; handing the number to
    // another test's fresh server would pull it into a group it does not belong to.
    let mut server = RedisServer::start();
    let port = server.port();
    assert!(support::port_claimed(port));
    assert!(
        support::port_claimed(port + 10_000),
        "the cluster bus number too"
    );
    server.kill();
    assert!(refuses_connections(port));
    assert!(
        support::port_claimed(port),
        "killed, but the value still claims it"
    );
    drop(server);
    assert!(!support::port_claimed(port));
    assert!(!support::port_claimed(port + 10_000));
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_comes_back_on_the_same_port_without_data() {
    let mut server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    let port = server.port();
    let first_pid = server.pid();
    let _: () = server.conn().set("k", "v").unwrap();

    server.kill();
    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first_pid);
    let mut conn = server.conn();
    // Persistence is off, and the extra arguments are applied again.
    let got: Option<String> = conn.get("k").unwrap();
    assert_eq!(got, None);
    let maxmemory: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query(&mut conn)
        .unwrap();
    assert_eq!(maxmemory, ["maxmemory", "10485760"]);

    // SIGTERM: graceful exit, then restart again.
    let second_pid = server.pid();
    server.stop();
    assert!(!server.is_running());
    assert!(refuses_connections(port));
    assert!(server.log_tail(20).contains("ready to exit, bye bye"));
    server.restart();
    assert_ne!(server.pid(), second_pid);
    let pong: String = redis::cmd("PING").query(&mut server.conn()).unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_server_answers_nothing_until_resumed() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let short_conn = || {
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        conn
    };

    // Connect first: the connection handshake itself needs answers from the server.
    let mut conn = short_conn();
    server.pause();
    assert!(server.is_running(), "a paused process is still alive");
    // The frozen process never answers.
    let paused = redis::cmd("PING").query::<String>(&mut conn);
    let err = paused.expect_err("PING answered while paused");
    assert!(err.is_timeout(), "{err:?}");

    server.resume();
    let mut conn = short_conn();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_receives_writes_made_on_the_master() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let info = replica.info("replication");
    assert_eq!(info_field(&info, "role"), Some("slave"));
    assert_eq!(info_field(&info, "master_link_status"), Some("up"));

    let _: () = master.conn().set("replicated", "yes").unwrap();
    let mut on_replica = replica.conn();
    wait_until(
        Duration::from_secs(5),
        "the replica to have the key",
        || on_replica.get::<_, Option<String>>("replicated").unwrap() == Some("yes".into()),
    );
    // A replica refuses writes.
    let refused: redis::RedisResult<()> = on_replica.set("direct", 1);
    assert!(refused.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_is_ok_and_key_slots_match_the_server() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes.len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    for node in &cluster.nodes {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.conn())
            .unwrap();
        assert_eq!(info_field(&info, "cluster_state"), Some("ok"), "{info}");
        assert_eq!(
            info_field(&info, "cluster_slots_ok"),
            Some("16384"),
            "{info}"
        );
    }

    // CRC16/XMODEM check value.
    assert_eq!(RedisCluster::key_slot("123456789"), 0x31C3);
    let keys = [
        "",
        "a",
        "foo",
        "bar",
        "123456789",
        "fairlock:lock",
        "redisson_lock_queue:{mylock}",
        "redisson_lock_timeout:{mylock}",
        "{mylock}",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "}{",
        "{a",
        "a}b{c}",
        "{{}}",
        "x{\u{e9}t\u{e9}}y",
        "tail{",
    ];
    let mut conn = cluster.nodes[0].conn();
    for key in keys {
        let server: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(RedisCluster::key_slot(key), server, "key {key:?}");
    }
    assert_eq!(
        RedisCluster::key_slot("{user1000}.following"),
        RedisCluster::key_slot("{user1000}.followers")
    );

    // master_for_slot names the node that accepts the write (no MOVED).
    for key in ["a", "b", "c", "{mylock}", "foo{bar}{zap}"] {
        let node = &cluster.nodes[cluster.master_for_key(key)];
        let _: () = node.conn().set(key, "here").unwrap();
    }

    // A real cluster client sees the same data.
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut cc = client.get_async_connection().await.unwrap();
    let got: String = cc.get("{mylock}").await.unwrap();
    assert_eq!(got, "here");
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinels_fail_over_when_the_master_dies() {
    let mut group = SentinelGroup::start();
    assert_eq!(group.sentinels.len(), 3);
    assert_eq!(group.replicas.len(), 2);
    assert_eq!(group.sentinel_urls().len(), 3);
    let old = group.master.port();
    assert_eq!(group.current_master_port(), old);

    group.master.kill();
    let new = group.wait_for_failover(old, Duration::from_secs(30));
    assert_ne!(new, old);
    assert!(group.replicas.iter().any(|r| r.port() == new));
    let mut conn = group.server_on(new).conn();
    let _: () = conn.set("after-failover", 1).unwrap();
    assert_eq!(group.current_master_port(), new);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_master_whose_replica_will_not_fail_over_is_taken_over() {
    let mut cluster = RedisCluster::start();
    let slot = RedisCluster::key_slot("takeover");
    let master = cluster.master_for_slot(slot);
    let replica = cluster
        .replica_of(master)
        .expect("every master has a replica");
    // This replica never starts an automatic failover, standing in for a failure detector that
    // is too slow: the helper has to force the takeover after half its deadline.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("cluster-replica-no-failover")
        .arg("yes")
        .query(&mut cluster.nodes[replica].conn())
        .unwrap();
    cluster.nodes[master].kill();
    let started = Instant::now();
    let promoted = cluster.wait_for_new_master(slot, master, Duration::from_secs(10));
    assert_eq!(promoted, replica);
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The new master serves the slot.
    let _: () = cluster.nodes[replica].conn().set("{takeover}x", 1).unwrap();
}
