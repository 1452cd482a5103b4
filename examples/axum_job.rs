//! A web service whose job handler runs under a fair lock, aborts the job when the lock is lost,
//! and exports fairlock's metrics for Prometheus.
//!
//! Run with `cargo run --example axum_job --features metrics`. It uses `REDIS_URL` when it is set;
//! otherwise it starts a throw-away `redis-server`. It then serves on a free loopback port, sends
//! itself a few concurrent requests for the same job (they queue in FIFO order; the last one
//! gives up waiting), shows one job being cut short because its lock was force-unlocked, prints
//! part of `/metrics`, and exits. With `--serve` it keeps serving instead:
//!
//! ```text
//! curl -X POST localhost:<port>/jobs/report   # run the job "report" under its lock
//! curl localhost:<port>/metrics               # Prometheus text format
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use fairlock::Client;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/throwaway.rs"]
mod throwaway;
use throwaway::ThrowAwayRedis;

#[derive(Clone)]
struct App {
    locks: Client,
    metrics: PrometheusHandle,
}

/// `POST /jobs/{name}`: runs the job under the fair lock `job:{name}`. Callers queue in arrival
/// order for at most 3 s; the job is abandoned the moment the lock can no longer be trusted.
async fn run_job(State(app): State<App>, Path(name): Path<String>) -> (StatusCode, String) {
    let lock = app.locks.fair_lock(format!("job:{name}"));
    let guard = match lock.try_lock(Duration::from_secs(3), None).await {
        Ok(Some(guard)) => guard,
        Ok(None) => return (StatusCode::CONFLICT, format!("{name}: busy, try later\n")),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{name}: {e}\n")),
    };
    let started = Instant::now();
    // `run` drops the job the moment the lock is lost (another instance may be running it now:
    // stop touching its data at once) and releases the lock when the job is done.
    match guard.run(the_job(&name)).await {
        Ok(()) => (
            StatusCode::OK,
            format!("{name}: done in {:?}\n", started.elapsed()),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{name}: aborted: {e}\n"),
        ),
    }
}

/// The work itself: here, a pause. A job named `slow-*` takes long enough to be interrupted.
async fn the_job(name: &str) {
    let pause = if name.starts_with("slow") {
        10_000
    } else {
        1_000
    };
    tokio::time::sleep(Duration::from_millis(pause)).await;
}

/// `GET /metrics`: fairlock's metrics (and anything else recorded) in Prometheus text format.
async fn metrics(State(app): State<App>) -> String {
    app.metrics.render()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let serve = std::env::args().any(|a| a == "--serve");
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = ThrowAwayRedis::start()?;
            let url = server.url();
            println!("started a throw-away redis-server at {url}");
            (Some(server), url)
        }
    };
    let metrics = PrometheusBuilder::new().install_recorder()?;
    // A 3 s watchdog (renewed every second) so that a lock taken away is noticed within a second;
    // the default, 30 s, renews every 10 s.
    let locks = Client::builder()
        .standalone(url.as_str())
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .await?;
    let app = Router::new()
        .route("/jobs/{name}", post(run_job))
        .route("/metrics", get(self::metrics))
        .with_state(App {
            locks: locks.clone(),
            metrics,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr}");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if serve {
        server.await??;
        return Ok(());
    }

    // Five requests for the same job at once: they run one after another, in arrival order; the
    // last ones give up after waiting 3 s.
    let mut calls = Vec::new();
    for i in 0..5u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        calls.push(tokio::spawn(async move {
            let reply = http(addr, "POST", "/jobs/report").await;
            format!("request {i}: {}", reply.unwrap_or_else(|e| e.to_string()))
        }));
    }
    for call in calls {
        print!("{}", call.await?);
    }

    // A long job whose lock an operator force-unlocks: the handler stops it at once.
    let slow = tokio::spawn(async move { http(addr, "POST", "/jobs/slow-export").await });
    let lock = locks.fair_lock("job:slow-export");
    while !lock.is_locked().await? {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.force_unlock().await?;
    print!("forced: {}", slow.await??);

    let page = http(addr, "GET", "/metrics").await?;
    println!("excerpt of /metrics:");
    for line in page.lines().filter(|l| {
        l.starts_with("fairlock_acquisitions_total") || l.starts_with("fairlock_lost_total")
    }) {
        println!("  {line}");
    }
    server.abort();
    locks.shutdown().await;
    Ok(())
}

/// One HTTP/1.1 request on a fresh connection; returns the response body.
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<String, Box<dyn Error + Send + Sync>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response))
}
