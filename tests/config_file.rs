//! `ClientConfig` (crate feature `serde`): the client's settings read from an application's
//! configuration, here JSON, as deadpool's `Config` is.

use fairlock::{ClientConfig, Error};
use fairlock_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_from_a_configuration_file_make_a_working_client() {
    let server = RedisServer::start();
    let text = format!(
        r#"{{ "url": "{}/2", "watchdog_timeout_ms": 9000, "command_timeout_ms": 1500,
             "metrics_lock_names": true }}"#,
        server.url()
    );
    let config: ClientConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(config.watchdog_timeout_ms, Some(9000));
    let client = config.connect().await.unwrap();
    let guard = client.fair_lock("from-config").lock().await.unwrap();
    // The URL's database is used, and the watchdog timeout is the configured one.
    let mut raw = server.conn();
    let _: () = redis::cmd("SELECT").arg(2).query(&mut raw).unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg("from-config")
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 8000 && pttl <= 9000, "pttl {pttl}");
    guard.unlock().await.unwrap();
}

#[test]
fn bad_settings_are_refused_with_typed_errors() {
    // Unknown fields are refused by serde (a typo does not silently keep a default).
    assert!(
        serde_json::from_str::<ClientConfig>(r#"{ "url": "redis://x", "watchdog": 1 }"#).is_err()
    );
    // Exactly one way to name the servers.
    for text in [
        r#"{}"#,
        r#"{ "url": "redis://a", "cluster": ["redis://b"] }"#,
    ] {
        let config: ClientConfig = serde_json::from_str(text).unwrap();
        assert!(
            matches!(
                config.builder(),
                Err(Error::InvalidArgument {
                    argument: "servers",
                    ..
                })
            ),
            "{text}"
        );
    }
    let config: ClientConfig =
        serde_json::from_str(r#"{ "url": "redis://a", "pubsub": "loud" }"#).unwrap();
    assert!(matches!(
        config.builder(),
        Err(Error::InvalidArgument {
            argument: "pubsub",
            ..
        })
    ));
}
