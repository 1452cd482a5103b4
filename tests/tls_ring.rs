//! `tls-rustls-ring`: an application that installed no crypto provider gets ring, installed by
//! fairlock when it connects (rustls cannot pick one by itself when a build has several, and
//! would fail the first handshake). One test, so its process starts with no provider installed.

use fairlock::redis::TlsCertificates;
use fairlock::Client;
use fairlock_testkit::TlsFiles;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_is_installed_when_the_application_installed_no_provider() {
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "this test's process starts without a provider"
    );
    let tls = TlsFiles::generate();
    let (_server, tls_port) = tls.start_server(false);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let certs = TlsCertificates {
        client_tls: None,
        root_cert: Some(tls.read("ca.pem")),
    };
    let redis = fairlock::redis::Client::build_with_tls(url.as_str(), certs).unwrap();
    let client = Client::from_redis(redis).await.unwrap();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    let guard = client.fair_lock("ring").lock().await.unwrap();
    guard.unlock().await.unwrap();
}
