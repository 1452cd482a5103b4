//! A small TCP proxy on a free loopback port in front of a server (normally a `redis-server`), for
//! network faults a real server cannot produce by itself: latency per direction, replies that are
//! lost after the command ran, requests that never arrive, connections reset (RST) under the
//! client, and connection attempts refused for a while.
//!
//! The proxy runs on its own thread with its own single-threaded tokio runtime, so its controls are
//! plain thread-safe methods, usable from sync and async tests alike, and it keeps forwarding while
//! the test's runtime is busy.
//!
//! **Stream integrity.** A RESP connection whose bytes were dropped in one direction is out of step
//! for good: the client would pair later replies with earlier requests. So a connection that lost
//! any byte is *tainted*: it keeps dropping everything in that direction until it is reset, and
//! switching the blackhole off resets every tainted connection. A client therefore sees a lost
//! reply as a timeout followed by a dropped connection, never as a wrong reply.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// Which way bytes travel through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server (requests).
    Up,
    /// Server to client (replies).
    Down,
}

/// Fault settings, read by every pump at each chunk.
#[derive(Debug, Default)]
struct Faults {
    latency_up: Duration,
    latency_down: Duration,
    /// Extra latency, each way, of connections accepted from then on (for the whole life of
    /// each such connection).
    new_conn_latency: Duration,
    refuse_until: Option<Instant>,
}

/// One proxied connection, as the controls see it.
struct ConnCtl {
    /// Set to `true` to reset (RST) both sides.
    kill: watch::Sender<bool>,
    /// The proxy's own address on its connection to the server (what `CLIENT LIST` shows).
    upstream_local: Option<SocketAddr>,
    tainted: Arc<Taint>,
}

/// Which directions of one connection have lost bytes (and so keep dropping them until reset).
#[derive(Default)]
struct Taint {
    up: AtomicBool,
    down: AtomicBool,
}

impl Taint {
    fn flag(&self, dir: Direction) -> &AtomicBool {
        match dir {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        }
    }

    fn any(&self) -> bool {
        self.up.load(Ordering::SeqCst) || self.down.load(Ordering::SeqCst)
    }
}

struct Shared {
    upstream: SocketAddr,
    faults: Mutex<Faults>,
    blackhole_up: AtomicBool,
    blackhole_down: AtomicBool,
    conns: Mutex<HashMap<u64, ConnCtl>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// Chunks thrown away so far, client to server and server to client.
    dropped_up: AtomicU64,
    dropped_down: AtomicU64,
}

impl Shared {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ConnCtl>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn latency(&self, dir: Direction) -> Duration {
        let f = self.faults();
        match dir {
            Direction::Up => f.latency_up,
            Direction::Down => f.latency_down,
        }
    }

    fn blackholed(&self, dir: Direction) -> bool {
        match dir {
            Direction::Up => self.blackhole_up.load(Ordering::SeqCst),
            Direction::Down => self.blackhole_down.load(Ordering::SeqCst),
        }
    }

    /// Resets the connections `which` selects; returns how many.
    fn reset_where(&self, which: impl Fn(&ConnCtl) -> bool) -> usize {
        let conns = self.conns();
        let mut n = 0;
        for ctl in conns.values().filter(|c| which(c)) {
            let _ = ctl.kill.send(true);
            n += 1;
        }
        n
    }
}

/// A TCP proxy from a free loopback port to `127.0.0.1:<upstream port>`. Dropping it stops the
/// proxy thread and resets every connection.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy in front of `127.0.0.1:upstream_port`, passing bytes through unchanged until
    /// a fault is switched on.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind proxy port");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            faults: Mutex::new(Faults::default()),
            blackhole_up: AtomicBool::new(false),
            blackhole_down: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dropped_up: AtomicU64::new(0),
            dropped_down: AtomicU64::new(0),
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let task_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        _ = accept_loop(listener, task_shared.clone()) => {}
                        _ = stop_rx => {}
                    }
                    task_shared.reset_where(|_| true);
                });
                // Dropping the runtime drops every connection task (and so every socket).
            })
            .unwrap();
        Proxy {
            port,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk by `up` (client to server) and `down` (server to client) from the
    /// moment it is read. Order is kept. Applies to chunks read from now on.
    pub fn set_latency(&self, up: Duration, down: Duration) {
        let mut f = self.shared.faults();
        f.latency_up = up;
        f.latency_down = down;
    }

    /// Every connection accepted from now on carries `extra` latency each way for its whole life
    /// (on top of [`set_latency`](Self::set_latency)); connections already open are not
    /// touched. A client's lazily opened connection (its pub/sub one) can so be slowed alone.
    pub fn set_new_connection_latency(&self, extra: Duration) {
        self.shared.faults().new_conn_latency = extra;
    }

    /// While on, replies are read from the server and thrown away: commands run, their replies
    /// are lost. Switching it off resets every connection that lost a byte (see the module docs).
    pub fn set_blackhole_replies(&self, on: bool) {
        self.shared.blackhole_down.store(on, Ordering::SeqCst);
        if !on {
            self.reset_tainted();
        }
    }

    /// While on, requests are read from the client and thrown away: they never run. Switching it
    /// off resets every connection that lost a byte.
    pub fn set_blackhole_requests(&self, on: bool) {
        self.shared.blackhole_up.store(on, Ordering::SeqCst);
        if !on {
            self.reset_tainted();
        }
    }

    /// Resets (RST) every connection that has lost a byte; returns how many.
    pub fn reset_tainted(&self) -> usize {
        self.shared.reset_where(|c| c.tainted.any())
    }

    /// Resets (RST, both sides) every open connection; returns how many.
    pub fn reset_all(&self) -> usize {
        self.shared.reset_where(|_| true)
    }

    /// New connections are accepted and reset at once for `d` (existing ones are untouched).
    pub fn refuse_for(&self, d: Duration) {
        self.shared.faults().refuse_until = Some(Instant::now() + d);
    }

    /// Accept new connections again.
    pub fn stop_refusing(&self) {
        self.shared.faults().refuse_until = None;
    }

    /// Every fault off: no latency, no blackhole (tainted connections are reset), no refusal.
    pub fn clear(&self) {
        self.set_latency(Duration::ZERO, Duration::ZERO);
        self.set_new_connection_latency(Duration::ZERO);
        self.stop_refusing();
        self.set_blackhole_replies(false);
        self.set_blackhole_requests(false);
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.conns().len()
    }

    /// Connections accepted (and forwarded) so far, and connection attempts refused so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.accepted.load(Ordering::SeqCst),
            self.shared.refused.load(Ordering::SeqCst),
        )
    }

    /// How many chunks (reads of one side) travelling in `dir` were thrown away so far: a test
    /// waits on it to know that a request (or reply) met the blackhole.
    pub fn dropped(&self, dir: Direction) -> u64 {
        match dir {
            Direction::Up => self.shared.dropped_up.load(Ordering::SeqCst),
            Direction::Down => self.shared.dropped_down.load(Ordering::SeqCst),
        }
    }

    /// The proxy's local addresses on its server-side connections: the `addr` field `CLIENT LIST`
    /// shows for the clients behind this proxy (for a targeted `CLIENT KILL ADDR`).
    pub fn upstream_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .conns()
            .values()
            .filter_map(|c| c.upstream_local)
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let refusing = {
            let mut f = shared.faults();
            match f.refuse_until {
                Some(until) if Instant::now() < until => true,
                Some(_) => {
                    f.refuse_until = None;
                    false
                }
                None => false,
            }
        };
        if refusing {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (kill_tx, kill_rx) = watch::channel(false);
        let tainted = Arc::new(Taint::default());
        shared.conns().insert(
            id,
            ConnCtl {
                kill: kill_tx,
                upstream_local: None,
                tainted: tainted.clone(),
            },
        );
        let shared = shared.clone();
        tokio::spawn(async move {
            let extra = shared.faults().new_conn_latency;
            serve(client, &shared, id, kill_rx, tainted, extra).await;
            shared.conns().remove(&id);
        });
    }
}

/// Forwards one connection until either side closes or the connection is reset.
async fn serve(
    client: TcpStream,
    shared: &Arc<Shared>,
    id: u64,
    mut kill: watch::Receiver<bool>,
    tainted: Arc<Taint>,
    extra: Duration,
) {
    let connect = tokio::select! {
        c = TcpStream::connect(shared.upstream) => c,
        _ = kill.wait_for(|k| *k) => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    let upstream = match connect {
        Ok(s) => s,
        Err(_) => {
            // The server is down: the client sees a reset, as it would connecting directly.
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if let Some(ctl) = shared.conns().get_mut(&id) {
        ctl.upstream_local = upstream.local_addr().ok();
    }
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let reset = {
        let up = pump(&mut cr, &mut uw, Direction::Up, shared, &tainted, extra);
        let down = pump(&mut ur, &mut cw, Direction::Down, shared, &tainted, extra);
        tokio::select! {
            r = up => r.is_err(),
            r = down => r.is_err(),
            _ = kill.wait_for(|k| *k) => true,
        }
    };
    if reset {
        let _ = cr.as_ref().set_zero_linger();
        let _ = ur.as_ref().set_zero_linger();
    }
    // Dropping the halves closes both sockets (RST when the linger is zero).
}

/// Copies `from` to `to` in one direction, applying the proxy's latency and blackhole. Ends with
/// `Ok` at end of stream, `Err` on an I/O error.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    dir: Direction,
    shared: &Shared,
    tainted: &Taint,
    extra: Duration,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            // Once a direction has dropped a byte it drops everything until the reset: the other
            // direction keeps flowing, so requests still run while their replies are lost.
            let flag = tainted.flag(dir);
            if shared.blackholed(dir) || flag.load(Ordering::SeqCst) {
                flag.store(true, Ordering::SeqCst);
                match dir {
                    Direction::Up => &shared.dropped_up,
                    Direction::Down => &shared.dropped_down,
                }
                .fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let at = Instant::now() + shared.latency(dir) + extra;
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at.into()).await;
            to.write_all(&bytes).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    // The writer drains what was read before end of stream, then the pump ends.
    let (r, w) = tokio::join!(read, write);
    r.and(w)
}
