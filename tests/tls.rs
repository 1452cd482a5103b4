//! TLS with certificates of one's own (crate feature `tls-rustls`): a `redis::Client` built with
//! a private CA and a client certificate carries the command and the subscription connections,
//! and a client without them is refused. With `tls-rustls` the application installs rustls's
//! crypto provider, as each test here does first (nextest runs each test in its own process);
//! fairlock keeps the one installed (`tests/tls_ring.rs`: what `tls-rustls-ring` does when none is).

/// What an application using `tls-rustls` does once, before it connects: installs rustls's
/// crypto provider (here ring; aws-lc-rs works the same). Returns the provider installed.
fn install_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    rustls::crypto::CryptoProvider::get_default()
        .expect("a provider is installed")
        .clone()
}

use std::time::Duration;

use fairlock::redis::{ClientTlsConfig, TlsCertificates};
use fairlock::Client;
use fairlock_testkit as support;
use support::{joined, queue_len, wait_until, TlsFiles};

/// `CLIENT LIST` lines of the connections named `name`.
fn named(server: &support::RedisServer, name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|kv| kv == format!("name={name}")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_its_own_ca_and_client_certificate_locks_and_waits_over_tls() {
    let provider = install_provider();
    let tls = TlsFiles::generate();
    let (server, tls_port) = tls.start_server(true);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let certs = |client_cert: bool| TlsCertificates {
        client_tls: client_cert.then(|| ClientTlsConfig {
            client_cert: tls.read("client.pem"),
            client_key: tls.read("client.key"),
        }),
        root_cert: Some(tls.read("ca.pem")),
    };
    let client = || async {
        let redis = fairlock::redis::Client::build_with_tls(url.as_str(), certs(true)).unwrap();
        Client::builder()
            .standalone_client(redis)
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (client().await, client().await);
    // The application's provider is the one in use: fairlock did not replace it.
    assert!(std::sync::Arc::ptr_eq(
        rustls::crypto::CryptoProvider::get_default().unwrap(),
        &provider
    ));
    let held = a.fair_lock("secured").lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock("secured");
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "the waiter is queued", || {
        queue_len(&mut server.conn(), "secured") == 1
    });
    held.unlock().await.unwrap();
    let guard = joined(
        waiter,
        Duration::from_secs(5),
        "the waiter is woken through its TLS subscription connection",
    )
    .await
    .unwrap();
    // Both of the waiter's connections reached the server on its TLS port.
    for role in ["cmd", "sub"] {
        let lines = named(&server, &format!("fairlock:{}:{role}", b.id()));
        assert_eq!(lines.len(), 1, "{role}: {lines:?}");
        assert!(
            lines[0].contains(&format!("laddr=127.0.0.1:{tls_port} ")),
            "{role} over TLS: {}",
            lines[0]
        );
    }
    guard.unlock().await.unwrap();

    // The server requires a client certificate: without one the handshake fails.
    let no_cert = fairlock::redis::Client::build_with_tls(url.as_str(), certs(false)).unwrap();
    let err = Client::builder()
        .standalone_client(no_cert)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    // A `rediss://` URL alone trusts the system's roots, which do not know this CA.
    let err = Client::builder()
        .standalone(url.as_str())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_redis(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_trust_the_ca_file_named_by_ssl_cert_file() {
    install_provider();
    // How a private CA reaches connections fairlock opens from URLs alone (a Sentinel's master
    // among them): with `tls-rustls`, the system's roots are loaded by rustls-native-certs, and
    // SSL_CERT_FILE replaces them. (nextest runs every test in its own process, so the variable
    // stays within this test.)
    let tls = TlsFiles::generate();
    let (server, tls_port) = tls.start_server(false);
    std::env::set_var("SSL_CERT_FILE", tls.path("ca.pem"));
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let client = Client::connect(&url).await.unwrap();
    let guard = client.fair_lock("ca-file").lock().await.unwrap();
    assert!(redis::cmd("EXISTS")
        .arg("ca-file")
        .query::<bool>(&mut server.conn())
        .unwrap());
    guard.unlock().await.unwrap();
}
