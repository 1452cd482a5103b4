//! A client that speaks Redisson's lock protocol (PROTOCOL 3-4) the way a Java service using
//! Redisson 4.7 does, with raw redis-rs commands and the scripts in `tests/support/lua/redisson_*`.
//! The torture test queues it in the same locks as fairlock's clients.
//!
//! It is one Java client (one random UUID) whose "threads" are holder ids. What it does, as
//! Redisson does:
//! * fair polls with the caller's clock, the front-only purge, the enqueue rule (the tail's
//!   deadline, else the lock's PTTL), and on every grant the shift of EVERY deadline by its own
//!   wait (300000 ms for `lock()`); a queued waiter's poll answers `max(0, PTTL)`;
//! * a `tryLock` that runs out of time gives up (shifting those behind it by its wait); an
//!   interrupted waiter does not ([`Wait::abandon_after`]) and stays queued until its deadline;
//! * waiters sleep on their per-waiter channel (`redisson_lock__channel:{NAME}:<field>`) or, for a
//!   non-fair lock, the lock's channel, and poll again when the returned TTL runs out;
//! * locks taken without a lease are renewed every `renew_every` to `watchdog` (30 s / 10 s in
//!   Redisson; short in the test);
//! * read-write locks ([`RedissonPeer::acquire_rw`]) as `RReadWriteLock` does: `mode`, read and
//!   `:write` fields, one lease key per read hold, the dead-reader scan of a read unlock, read
//!   renewals of every lease key and the hash, `0` / `1` on `redisson_rwlock:{NAME}` (a `1` wakes
//!   every waiter of the channel, a `0` one), nothing published on a downgrade.
//!
//! Deviations, all for the test's sake: sleeps between polls have a floor of `min_poll` (Redisson
//! polls again at once on a TTL of 0); a waiter told to stop at teardown gives up even from
//! `lock()`; an abandoned waiter whose deadline is far away gives up instead (Redisson would leave
//! the lock blocked for minutes). Every call, grant, release, loss and deadline shift is recorded
//! as a [`crate::history::Event`] under the process name given at start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use tokio::sync::Notify;
use tokio_stream::StreamExt;

use super::history::{epoch_ms, mono_ns, Event, Outcome};
use super::raw::{derived_key, release_channel, waiter_channel};

const PROLOGUE: &str = include_str!("lua/redisson_prologue.lua");

/// The detail of a `tryLock` that ran out of time and whose give-up failed: its entry may still
/// be queued (until its thread's next call takes the place up, or its deadline passes).
pub const GIVE_UP_FAILED: &str = "give-up-failed";

fn fair_script(body: &str) -> redis::Script {
    redis::Script::new(&format!("{PROLOGUE}\n{body}"))
}

struct Scripts {
    fair_acquire: redis::Script,
    fair_give_up: redis::Script,
    fair_unlock: redis::Script,
    lock_acquire: redis::Script,
    lock_unlock: redis::Script,
    renew: redis::Script,
    rw_read_acquire: redis::Script,
    rw_write_acquire: redis::Script,
    rw_read_unlock: redis::Script,
    rw_write_unlock: redis::Script,
    rw_read_renew: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            fair_acquire: fair_script(include_str!("lua/redisson_fair_acquire.lua")),
            fair_give_up: redis::Script::new(include_str!("lua/redisson_fair_give_up.lua")),
            fair_unlock: fair_script(include_str!("lua/redisson_fair_unlock.lua")),
            lock_acquire: redis::Script::new(include_str!("lua/redisson_lock_acquire.lua")),
            lock_unlock: redis::Script::new(include_str!("lua/redisson_lock_unlock.lua")),
            renew: redis::Script::new(include_str!("lua/redisson_renew.lua")),
            rw_read_acquire: redis::Script::new(include_str!("lua/redisson_rw_read_acquire.lua")),
            rw_write_acquire: redis::Script::new(include_str!("lua/redisson_rw_write_acquire.lua")),
            rw_read_unlock: redis::Script::new(include_str!("lua/redisson_rw_read_unlock.lua")),
            rw_write_unlock: redis::Script::new(include_str!("lua/redisson_rw_write_unlock.lua")),
            rw_read_renew: redis::Script::new(include_str!("lua/redisson_rw_read_renew.lua")),
        }
    }
}

/// Timing of the peer (Redisson's defaults in brackets).
#[derive(Debug, Clone, Copy)]
pub struct PeerConfig {
    /// Lease of a lock taken without one [30 s].
    pub watchdog: Duration,
    /// Renewal period of such a lock [10 s].
    pub renew_every: Duration,
    /// The fair wait of `lock()` [300000 ms].
    pub lock_wait: Duration,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// Floor of the sleep between two polls.
    pub min_poll: Duration,
    /// An abandoned waiter whose deadline is further away than this gives up after all.
    pub abandon_limit: Duration,
}

/// Where the peer's events go.
pub type Sink = Arc<Mutex<Vec<Event>>>;

/// How one call waits.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    /// `None`: `lock()` (fair wait `lock_wait`, no deadline); `Some(w)`: `tryLock(w, …)`.
    pub wait: Option<Duration>,
    /// `None`: the watchdog renews it.
    pub lease: Option<Duration>,
    /// Stop waiting after this long without giving up (an interrupted Java thread).
    pub abandon_after: Option<Duration>,
}

/// The Java client.
#[derive(Clone)]
pub struct RedissonPeer {
    inner: Arc<Inner>,
}

struct Inner {
    uuid: String,
    proc: String,
    cfg: PeerConfig,
    conn: ConnectionManager,
    scripts: Scripts,
    hub: Arc<Hub>,
    hub_task: tokio::task::JoinHandle<()>,
    sink: Sink,
    next_call: AtomicU64,
    holds: Mutex<HashMap<(String, String), Arc<Hold>>>,
    /// Holds whose unlock failed (the reply, or the command, was lost): Redis may still count
    /// them, until about this time (their lease), so the thread's next acquisitions there are
    /// re-entries as far as Redis is concerned. A re-entry extends the lease, and so this.
    maybe_held: Mutex<HashMap<(String, String), Instant>>,
    /// Set at teardown: waiters give up.
    stopping: AtomicBool,
    stop_notify: Notify,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.hub_task.abort();
    }
}

/// Which of Redisson's locks a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fair,
    Plain,
    Read,
    Write,
}

/// The channel of a read-write lock (`redisson_rwlock:{NAME}`).
fn rw_channel(name: &str) -> String {
    derived_key("redisson_rwlock", name)
}

/// The lease-key prefix of read field `field` of `name` (`{NAME}:<field>:rwlock_timeout`).
fn lease_prefix(name: &str, field: &str) -> String {
    format!("{}:{field}:rwlock_timeout", lease_base(name))
}

/// What lease keys of `name` are named from: `{NAME}`, or NAME when it has a `{`.
fn lease_base(name: &str) -> String {
    if name.contains('{') {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    }
}

/// One (lock, field) hold shared by a thread's reentrant acquisitions.
struct Hold {
    name: String,
    kind: Kind,
    field: String,
    lease_ms: i64,
    count: AtomicU32,
    /// Local validity deadline (mono ns): send time of the last successful grant or renewal plus
    /// its lease, less a margin.
    validity: AtomicU64,
    lost: AtomicBool,
    /// Call ids of the live acquisitions (for `lost` events).
    calls: Mutex<Vec<String>>,
}

/// One acquisition by the peer.
pub struct PeerGuard {
    hold: Arc<Hold>,
    call: String,
    released: bool,
}

impl PeerGuard {
    pub fn call_id(&self) -> &str {
        &self.call
    }

    pub fn is_lost(&self) -> bool {
        self.hold.lost.load(Ordering::SeqCst)
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        assert!(
            self.released || std::thread::panicking(),
            "a peer guard must be released with RedissonPeer::unlock"
        );
    }
}

fn margin_ns(lease_ms: i64) -> u64 {
    // 1 % + 2 ms, as fairlock's own validity margin.
    (lease_ms.max(0) as u64 * 10_000) + 2_000_000
}

impl RedissonPeer {
    /// Connects (commands and one pub/sub connection) to `url`; events go to `sink` under `proc`.
    pub async fn start(url: &str, proc: &str, cfg: PeerConfig, seed: u64, sink: Sink) -> Self {
        let client = redis::Client::open(url).unwrap();
        let conn = ConnectionManager::new_with_config(
            client.clone(),
            ConnectionManagerConfig::new()
                .set_response_timeout(Some(cfg.command_timeout))
                .set_connection_timeout(Some(cfg.command_timeout))
                .set_number_of_retries(1),
        )
        .await
        .expect("peer connection");
        let hub = Arc::new(Hub {
            client,
            state: Mutex::new(HubState::default()),
        });
        let hub_task = tokio::spawn(hub.clone().run(cfg.command_timeout));
        // A v4-shaped UUID from the seed, so a replay uses the same fields.
        let a = splitmix(seed ^ 0x6a61_7661);
        let b = splitmix(a);
        let uuid = format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48 & 0x3fff),
            b & 0xffff_ffff_ffff
        );
        RedissonPeer {
            inner: Arc::new(Inner {
                uuid,
                proc: proc.to_owned(),
                cfg,
                conn,
                scripts: Scripts::new(),
                hub,
                hub_task,
                sink,
                next_call: AtomicU64::new(1),
                holds: Mutex::new(HashMap::new()),
                maybe_held: Mutex::new(HashMap::new()),
                stopping: AtomicBool::new(false),
                stop_notify: Notify::new(),
            }),
        }
    }

    /// The client's UUID.
    pub fn uuid(&self) -> &str {
        &self.inner.uuid
    }

    /// The owner field of a thread.
    pub fn field(&self, thread: i64) -> String {
        format!("{}:{thread}", self.inner.uuid)
    }

    /// From now on every waiter gives up (and records `Cancelled`).
    pub fn stop_waiting(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.stop_notify.notify_waiters();
    }

    /// Gives up, once more, every entry of this peer still queued in the fair locks `names`, and
    /// returns how many there were. A Redisson give-up lost to a fault (or an abandoned waiter)
    /// leaves its waiter queued until its deadline, minutes away for `lock()`: Redisson's own
    /// behaviour, which the test cannot wait out at teardown.
    pub async fn give_up_leftovers(&self, names: &[&str]) -> redis::RedisResult<usize> {
        let mut conn = self.conn();
        let prefix = format!("{}:", self.uuid());
        let mut n = 0;
        for name in names {
            let queued: Vec<String> = redis::cmd("LRANGE")
                .arg(derived_key("redisson_lock_queue", name))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            for field in queued.iter().filter(|f| f.starts_with(&prefix)) {
                self.give_up(name, field, 300_000).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Marks the recorded call `id` as a re-entry.
    fn mark_reentrant(&self, id: &str) {
        let mut sink = self.inner.sink.lock().unwrap();
        for ev in sink.iter_mut().rev() {
            if let Event::Call {
                id: call,
                reentrant,
                ..
            } = ev
            {
                if call == id {
                    *reentrant = true;
                    return;
                }
            }
        }
    }

    fn record(&self, ev: Event) {
        self.inner.sink.lock().unwrap().push(ev);
    }

    fn conn(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// `lock()` / `tryLock(wait, lease)` of `thread` on `name`. `None` when the wait ran out, the
    /// waiter was abandoned or stopped, or Redis failed past the wait.
    pub async fn acquire(
        &self,
        thread: i64,
        name: &str,
        fair: bool,
        how: Wait,
    ) -> Option<PeerGuard> {
        let kind = if fair { Kind::Fair } else { Kind::Plain };
        self.acquire_kind(thread, name, kind, how).await
    }

    /// `readLock()` (`write` false) or `writeLock()` (`write` true) of `getReadWriteLock(name)`,
    /// `lock()` / `tryLock(wait, lease)`, by `thread`. `None` as for [`acquire`](Self::acquire).
    /// (Redisson hands out no fencing token here: the grant records token 0.)
    pub async fn acquire_rw(
        &self,
        thread: i64,
        name: &str,
        write: bool,
        how: Wait,
    ) -> Option<PeerGuard> {
        let kind = if write { Kind::Write } else { Kind::Read };
        self.acquire_kind(thread, name, kind, how).await
    }

    async fn acquire_kind(
        &self,
        thread: i64,
        name: &str,
        kind: Kind,
        how: Wait,
    ) -> Option<PeerGuard> {
        let fair = kind == Kind::Fair;
        let inner = &self.inner;
        let mut field = self.field(thread);
        if kind == Kind::Write {
            field.push_str(":write");
        }
        let id = format!(
            "{}.{}",
            inner.proc,
            inner.next_call.fetch_add(1, Ordering::SeqCst)
        );
        let key = (name.to_owned(), field.clone());
        let lease_ms = how.lease.unwrap_or(inner.cfg.watchdog).as_millis().max(1) as i64;
        let reentrant = inner.holds.lock().unwrap().contains_key(&key) || {
            let mut maybe = inner.maybe_held.lock().unwrap();
            match maybe.get(&key).copied() {
                Some(until) if until > Instant::now() => {
                    // If granted, this re-entry sets the lease again (the orphan lives on).
                    let longer = Instant::now() + Duration::from_millis(lease_ms as u64);
                    maybe.insert(key.clone(), longer.max(until));
                    true
                }
                Some(_) => {
                    maybe.remove(&key);
                    false
                }
                None => false,
            }
        };
        let wait_ms = how.wait.unwrap_or(inner.cfg.lock_wait).as_millis() as i64;
        let t_start = mono_ns();
        self.record(Event::Call {
            id: id.clone(),
            proc: inner.proc.clone(),
            client: format!("{}.client", inner.proc),
            name: name.to_owned(),
            fair,
            field: field.clone(),
            op: match (how.wait, how.abandon_after) {
                (None, _) => "lock".into(),
                (Some(_), None) => "trylock".into(),
                (Some(_), Some(_)) => "trylock-interruptible".into(),
            },
            wait_ms: how.wait.map(|w| w.as_millis() as u64),
            lease_ms: how.lease.map(|l| l.as_millis() as u64),
            t: t_start,
            shared: false,
            reentrant,
            java: true,
        });
        let started = Instant::now();
        let deadline = how.wait.map(|w| started + w);
        let abandon_at = how.abandon_after.map(|a| started + a);
        let chan = match kind {
            Kind::Fair => waiter_channel(name, &field),
            Kind::Plain => release_channel(name),
            Kind::Read | Kind::Write => rw_channel(name),
        };
        let mut subscribed: Option<Arc<Notify>> = None;
        let mut queued_deadline: Option<i64> = None;
        let end =
            |outcome: Outcome, token: Option<u64>, vu: Option<u64>, detail: String| Event::End {
                id: id.clone(),
                t: mono_ns(),
                outcome,
                token,
                vu,
                detail,
            };
        loop {
            let sent = mono_ns();
            let poll = self.poll(name, kind, &field, lease_ms, wait_ms).await;
            match poll {
                Ok(Poll::Granted(token, reentered)) => {
                    if reentered && !reentrant {
                        // Redis still had a hold of this thread that the peer did not know of
                        // (an orphan of a lost reply): this grant was a re-entry, to which the
                        // queue's order does not apply.
                        self.mark_reentrant(&id);
                    }
                    let replied = mono_ns();
                    let hold =
                        self.hold_for(name, kind, &field, lease_ms, how.lease.is_none(), replied);
                    hold.validity.fetch_max(
                        sent + lease_ms as u64 * 1_000_000 - margin_ns(lease_ms),
                        Ordering::SeqCst,
                    );
                    hold.calls.lock().unwrap().push(id.clone());
                    let vu = hold.validity.load(Ordering::SeqCst);
                    if fair {
                        self.record(Event::Shift {
                            name: name.to_owned(),
                            t0: sent,
                            t1: mono_ns(),
                            ms: wait_ms as u64,
                        });
                    }
                    let token = (!matches!(kind, Kind::Read | Kind::Write)).then_some(token);
                    self.record(end(Outcome::Granted, token, Some(vu), String::new()));
                    if let Some(n) = subscribed.take() {
                        drop(n);
                        inner.hub.unsubscribe(&chan).await;
                    }
                    return Some(PeerGuard {
                        hold,
                        call: id,
                        released: false,
                    });
                }
                Ok(Poll::Waiting { ttl, deadline: d }) => {
                    if d >= 0 {
                        queued_deadline = Some(d);
                    }
                    let now = Instant::now();
                    let stopping = inner.stopping.load(Ordering::SeqCst);
                    let timed_out = deadline.is_some_and(|d| now >= d);
                    let abandon = abandon_at.is_some_and(|a| now >= a);
                    if timed_out || stopping || abandon {
                        // An abandoned waiter leaves its entry, unless that would block the lock
                        // for longer than the test can wait.
                        let far = queued_deadline.is_none_or(|d| {
                            d - epoch_ms() > inner.cfg.abandon_limit.as_millis() as i64
                        });
                        let give_up = fair && (timed_out || stopping || far);
                        // A give-up that failed may have left the entry queued (Redisson's does
                        // the same): the checker must not take the thread's place for free.
                        let gave_up = !give_up || self.give_up(name, &field, wait_ms).await.is_ok();
                        if let Some(n) = subscribed.take() {
                            drop(n);
                            inner.hub.unsubscribe(&chan).await;
                        }
                        let (outcome, detail) = if timed_out && !abandon && gave_up {
                            (Outcome::TimedOut, String::new())
                        } else if timed_out && !abandon {
                            (Outcome::TimedOut, GIVE_UP_FAILED.to_owned())
                        } else if give_up {
                            // Stopped or abandoned far from its deadline: it gave up on its way
                            // out (the checker reads "gave-up" as "left at some point").
                            (Outcome::Cancelled, "gave-up".into())
                        } else {
                            (Outcome::Cancelled, "abandoned".into())
                        };
                        self.record(end(outcome, None, None, detail));
                        return None;
                    }
                    let Some(notify) = subscribed.clone() else {
                        subscribed =
                            Some(inner.hub.subscribe(&chan, inner.cfg.command_timeout).await);
                        // Poll again now that a release cannot slip by.
                        continue;
                    };
                    let mut sleep = if ttl >= 0 {
                        Duration::from_millis(ttl as u64)
                    } else {
                        Duration::from_secs(3600)
                    };
                    sleep = sleep.max(inner.cfg.min_poll);
                    if let Some(d) = deadline {
                        sleep = sleep.min(d.saturating_duration_since(now));
                    }
                    if let Some(a) = abandon_at {
                        sleep = sleep.min(a.saturating_duration_since(now));
                    }
                    let stop = inner.stop_notify.notified();
                    tokio::select! {
                        _ = notify.notified() => {}
                        _ = tokio::time::sleep(sleep) => {}
                        _ = stop => {}
                    }
                }
                Err(e) => {
                    let last_error = e.to_string();
                    if fair {
                        // The poll may have run (and granted, shifting every deadline) with its
                        // reply lost.
                        self.record(Event::Shift {
                            name: name.to_owned(),
                            t0: sent,
                            t1: mono_ns() + inner.cfg.command_timeout.as_nanos() as u64,
                            ms: wait_ms as u64,
                        });
                    }
                    let now = Instant::now();
                    let stopping = inner.stopping.load(Ordering::SeqCst);
                    if deadline.is_some_and(|d| now >= d) || stopping {
                        if fair {
                            let _ = self.give_up(name, &field, wait_ms).await;
                        }
                        if let Some(n) = subscribed.take() {
                            drop(n);
                            inner.hub.unsubscribe(&chan).await;
                        }
                        self.record(end(Outcome::Error, None, None, last_error));
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn poll(
        &self,
        name: &str,
        kind: Kind,
        field: &str,
        lease_ms: i64,
        wait_ms: i64,
    ) -> redis::RedisResult<Poll> {
        let s = &self.inner.scripts;
        let mut conn = self.conn();
        let reply: Vec<i64> = if kind == Kind::Read {
            s.rw_read_acquire
                .key(name)
                .key(lease_prefix(name, field))
                .arg(lease_ms)
                .arg(field)
                .arg(format!("{field}:write"))
                .invoke_async(&mut conn)
                .await?
        } else if kind == Kind::Write {
            s.rw_write_acquire
                .key(name)
                .arg(lease_ms)
                .arg(field)
                .invoke_async(&mut conn)
                .await?
        } else if kind == Kind::Fair {
            s.fair_acquire
                .key(name)
                .key(derived_key("redisson_lock_queue", name))
                .key(derived_key("redisson_lock_timeout", name))
                .key(derived_key("redisson_lock_token", name))
                .arg(lease_ms)
                .arg(field)
                .arg(wait_ms)
                .arg(epoch_ms())
                .invoke_async(&mut conn)
                .await?
        } else {
            s.lock_acquire
                .key(name)
                .key(derived_key("redisson_lock_token", name))
                .arg(lease_ms)
                .arg(field)
                .invoke_async(&mut conn)
                .await?
        };
        Ok(match reply.as_slice() {
            [1, token] => Poll::Granted(*token as u64, false),
            [1, token, count] => Poll::Granted(*token as u64, *count > 1),
            [0, ttl, deadline] => Poll::Waiting {
                ttl: *ttl,
                deadline: *deadline,
            },
            [0, ttl] => Poll::Waiting {
                ttl: *ttl,
                deadline: -1,
            },
            other => panic!("peer acquire reply {other:?}"),
        })
    }

    async fn give_up(&self, name: &str, field: &str, wait_ms: i64) -> redis::RedisResult<()> {
        let t0 = mono_ns();
        let mut conn = self.conn();
        let r: redis::RedisResult<i64> = self
            .inner
            .scripts
            .fair_give_up
            .key(derived_key("redisson_lock_queue", name))
            .key(derived_key("redisson_lock_timeout", name))
            .arg(field)
            .arg(wait_ms)
            .invoke_async(&mut conn)
            .await;
        // Recorded whatever the outcome: a lost reply may hide a shift that ran.
        self.record(Event::Shift {
            name: name.to_owned(),
            t0,
            t1: mono_ns() + self.inner.cfg.command_timeout.as_nanos() as u64,
            ms: wait_ms as u64,
        });
        r.map(|_| ())
    }

    /// The hold a grant whose reply came at `replied` (mono ns) belongs to. A re-entry joins the
    /// thread's earlier holds, and its lease then extends them, only when they were still valid
    /// at `replied`: Redis then still had them when the grant's script ran, so the lock was held
    /// without a gap. When they had lapsed (their lease ran out, e.g. while the server slept), the
    /// key may have expired and been taken by someone else before this grant, which Redisson's
    /// reply cannot tell: the earlier holds are lost (and trusted no longer than their own
    /// validity), and this grant starts a new hold. The workload releases a re-entry before the
    /// hold it re-entered, so the new hold is released first.
    fn hold_for(
        &self,
        name: &str,
        kind: Kind,
        field: &str,
        lease_ms: i64,
        watchdog: bool,
        replied: u64,
    ) -> Arc<Hold> {
        let k = (name.to_owned(), field.to_owned());
        let lapsed = {
            let mut holds = self.inner.holds.lock().unwrap();
            match holds.get(&k) {
                Some(h)
                    if h.validity.load(Ordering::SeqCst) >= replied
                        && !h.lost.load(Ordering::SeqCst) =>
                {
                    h.count.fetch_add(1, Ordering::SeqCst);
                    return h.clone();
                }
                Some(_) => holds.remove(&k),
                None => None,
            }
        };
        if let Some(old) = lapsed {
            self.mark_lost(&old, "lapsed before a re-entry");
        }
        let mut holds = self.inner.holds.lock().unwrap();
        let hold = Arc::new(Hold {
            name: name.to_owned(),
            kind,
            field: field.to_owned(),
            lease_ms,
            count: AtomicU32::new(1),
            validity: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            calls: Mutex::new(Vec::new()),
        });
        holds.insert(k, hold.clone());
        if watchdog {
            tokio::spawn(self.clone().renew_loop(hold.clone()));
        }
        hold
    }

    async fn renew_loop(self, hold: Arc<Hold>) {
        let cfg = self.inner.cfg;
        loop {
            tokio::time::sleep(cfg.renew_every).await;
            if hold.count.load(Ordering::SeqCst) == 0 || hold.lost.load(Ordering::SeqCst) {
                return;
            }
            let sent = mono_ns();
            let mut conn = self.conn();
            let scripts = &self.inner.scripts;
            let r: redis::RedisResult<i64> = if hold.kind == Kind::Read {
                scripts
                    .rw_read_renew
                    .key(&hold.name)
                    .key(lease_prefix(&hold.name, &hold.field))
                    .arg(cfg.watchdog.as_millis() as i64)
                    .arg(&hold.field)
                    .invoke_async(&mut conn)
                    .await
            } else {
                scripts
                    .renew
                    .key(&hold.name)
                    .arg(cfg.watchdog.as_millis() as i64)
                    .arg(&hold.field)
                    .invoke_async(&mut conn)
                    .await
            };
            match r {
                Ok(1) if hold.validity.load(Ordering::SeqCst) < mono_ns() => {
                    // The hold had lapsed before the reply came: Redis may have let it expire
                    // and a re-entry of the thread re-created the field since (see `hold_for`),
                    // so this renewal proves nothing about the time in between.
                    self.mark_lost(&hold, "lapsed before its renewal");
                    return;
                }
                Ok(1) => {
                    let ms = cfg.watchdog.as_millis() as i64;
                    hold.validity.fetch_max(
                        sent + ms as u64 * 1_000_000 - margin_ns(ms),
                        Ordering::SeqCst,
                    );
                }
                Ok(_) => {
                    if hold.count.load(Ordering::SeqCst) > 0 {
                        self.mark_lost(&hold, "gone");
                    }
                    return;
                }
                Err(_) => {}
            }
        }
    }

    fn mark_lost(&self, hold: &Hold, reason: &str) {
        if hold.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        let t = mono_ns();
        for id in hold.calls.lock().unwrap().iter() {
            self.record(Event::Lost {
                id: id.clone(),
                t,
                reason: reason.to_owned(),
            });
        }
    }

    /// Releases one acquisition. Returns the script's answer (1 released, 0 still held, -1 not
    /// the owner) or the error.
    pub async fn unlock(&self, mut guard: PeerGuard) -> Result<i64, String> {
        guard.released = true;
        let hold = guard.hold.clone();
        let t = mono_ns();
        self.record(Event::Release {
            id: guard.call.clone(),
            t,
            vu: hold.validity.load(Ordering::SeqCst),
            how: "unlock".into(),
            lost: hold.lost.load(Ordering::SeqCst),
        });
        hold.calls.lock().unwrap().retain(|c| *c != guard.call);
        if hold.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Only this hold's own entry: a lapsed hold was replaced by a newer one (`hold_for`).
            let mut holds = self.inner.holds.lock().unwrap();
            let k = (hold.name.clone(), hold.field.clone());
            if holds.get(&k).is_some_and(|h| Arc::ptr_eq(h, &hold)) {
                holds.remove(&k);
            }
        }
        let s = &self.inner.scripts;
        let mut conn = self.conn();
        let r: redis::RedisResult<i64> = if hold.kind == Kind::Read {
            s.rw_read_unlock
                .key(&hold.name)
                .key(lease_prefix(&hold.name, &hold.field))
                .key(lease_base(&hold.name))
                .arg(&hold.field)
                .arg(rw_channel(&hold.name))
                .invoke_async(&mut conn)
                .await
        } else if hold.kind == Kind::Write {
            s.rw_write_unlock
                .key(&hold.name)
                .arg(hold.lease_ms)
                .arg(&hold.field)
                .arg(rw_channel(&hold.name))
                .invoke_async(&mut conn)
                .await
        } else if hold.kind == Kind::Fair {
            s.fair_unlock
                .key(&hold.name)
                .key(derived_key("redisson_lock_queue", &hold.name))
                .key(derived_key("redisson_lock_timeout", &hold.name))
                .arg(hold.lease_ms)
                .arg(&hold.field)
                .arg(release_channel(&hold.name))
                .arg(epoch_ms())
                .invoke_async(&mut conn)
                .await
        } else {
            s.lock_unlock
                .key(&hold.name)
                .arg(hold.lease_ms)
                .arg(&hold.field)
                .arg(release_channel(&hold.name))
                .invoke_async(&mut conn)
                .await
        };
        let result = match &r {
            Ok(-1) => "notheld".to_owned(),
            Ok(_) => "ok".to_owned(),
            Err(e) => {
                // The release may not have run: Redis may still count this hold for a lease.
                let until = Instant::now() + Duration::from_millis(hold.lease_ms as u64);
                self.inner
                    .maybe_held
                    .lock()
                    .unwrap()
                    .insert((hold.name.clone(), hold.field.clone()), until);
                format!("err:{e}")
            }
        };
        self.record(Event::Released {
            id: guard.call.clone(),
            t: mono_ns(),
            result,
        });
        r.map_err(|e| e.to_string())
    }
}

enum Poll {
    /// The token, and whether Redis counted it as a re-entry.
    Granted(u64, bool),
    Waiting {
        ttl: i64,
        deadline: i64,
    },
}

/// The peer's one pub/sub connection: channels by name, each with a `Notify` (one stored
/// permit per message, like Redisson's semaphore). After a reconnect every channel is subscribed
/// again and every waiter woken to poll.
struct Hub {
    client: redis::Client,
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    sink: Option<PubSubSink>,
    channels: HashMap<String, (usize, Arc<Notify>)>,
}

impl Hub {
    async fn subscribe(&self, channel: &str, timeout: Duration) -> Arc<Notify> {
        let (notify, sink) = {
            let mut st = self.state.lock().unwrap();
            let entry = st
                .channels
                .entry(channel.to_owned())
                .or_insert_with(|| (0, Arc::new(Notify::new())));
            entry.0 += 1;
            let first = entry.0 == 1;
            let notify = entry.1.clone();
            (notify, if first { st.sink.clone() } else { None })
        };
        if let Some(mut sink) = sink {
            let _ = tokio::time::timeout(timeout, sink.subscribe(channel)).await;
        }
        notify
    }

    async fn unsubscribe(&self, channel: &str) {
        let sink = {
            let mut st = self.state.lock().unwrap();
            let Some(entry) = st.channels.get_mut(channel) else {
                return;
            };
            entry.0 -= 1;
            if entry.0 > 0 {
                return;
            }
            st.channels.remove(channel);
            st.sink.clone()
        };
        if let Some(mut sink) = sink {
            let _ = tokio::time::timeout(Duration::from_secs(1), sink.unsubscribe(channel)).await;
        }
    }

    fn wake_all(&self) {
        for (_, n) in self.state.lock().unwrap().channels.values() {
            n.notify_one();
        }
    }

    async fn run(self: Arc<Self>, timeout: Duration) {
        loop {
            let conn = tokio::time::timeout(timeout, self.client.get_async_pubsub()).await;
            let Ok(Ok(pubsub)) = conn else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let (mut sink, mut stream) = pubsub.split();
            let channels: Vec<String> = {
                let mut st = self.state.lock().unwrap();
                st.sink = Some(sink.clone());
                st.channels.keys().cloned().collect()
            };
            let mut ok = true;
            for ch in channels {
                if !matches!(
                    tokio::time::timeout(timeout, sink.subscribe(&ch)).await,
                    Ok(Ok(()))
                ) {
                    ok = false;
                    break;
                }
            }
            self.wake_all();
            if ok {
                while let Some(msg) = stream.next().await {
                    let ch = msg.get_channel_name().to_owned();
                    // Redisson's read-write waiters: `1` releases every local waiter.
                    let all = msg.get_payload::<String>().is_ok_and(|p| p == "1")
                        && ch.starts_with("redisson_rwlock:");
                    if let Some((_, n)) = self.state.lock().unwrap().channels.get(&ch) {
                        if all {
                            n.notify_waiters();
                        }
                        n.notify_one();
                    }
                }
            }
            self.state.lock().unwrap().sink = None;
            self.wake_all();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// splitmix64.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
