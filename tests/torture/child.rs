//! The child process: many tasks doing random lock operations, recording every event.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{Client, FairLock, Holder, LockGuard, NonFairLock, ReadLock, WriteLock};
use fairlock_testkit::history::{mono_ns, Event, InstantClock, Outcome};
use fairlock_testkit::redisson_peer::splitmix;
use tracing::Instrument;

use crate::config::*;

// ---------------------------------------------------------------------------------------------
// Child process: many tasks doing random lock operations, recording every event.

/// Writes events, one line per `write`, so a killed process leaves whole lines behind.
pub struct Recorder {
    pub file: Mutex<File>,
    /// The field the library's `acquire` span named for each running call that named no
    /// holder, until the call's end reads it ([`Event::Bound`]).
    pub bound: Mutex<HashMap<String, String>>,
}

impl Recorder {
    pub fn log(&self, ev: Event) {
        let mut line = ev.to_line();
        line.push('\n');
        let _ = self.file.lock().unwrap().write_all(line.as_bytes());
    }
}

/// The id of the call a `torture_call` span stands for, and whether the call names no holder
/// (its field is read from the library's `acquire` span, [`Event::Bound`]).
pub struct CallId(String, bool);

/// Turns the library's `queued` event (its attempt joined a fair queue; emitted inside the call's
/// own future, never by an attempt a dropped call abandoned) into an [`Event::Joined`] of the
/// call whose `torture_call` span encloses it.
pub struct JoinLog(Arc<Recorder>);

/// Reads a `torture_call` span's `id` and `unbound` fields.
pub struct IdField(Option<String>, bool);

impl tracing::field::Visit for IdField {
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if field.name() == "unbound" {
            self.1 = value;
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// Reads the library's `acquire` span's `field` (the owner field the call acts for).
pub struct FieldField(Option<String>);

impl tracing::field::Visit for FieldField {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "field" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

/// Which of the library's events a message is: `queued` (1) or `took up a direct grant` (2).
pub struct QueuedMessage(u8);

impl tracing::field::Visit for QueuedMessage {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            match format!("{value:?}").as_str() {
                "queued" => self.0 = 1,
                "took up a direct grant" => self.0 = 2,
                _ => {}
            }
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for JoinLog
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        match attrs.metadata().name() {
            "torture_call" => {
                let mut call = IdField(None, false);
                attrs.record(&mut call);
                if let (Some(id_), Some(span)) = (call.0, ctx.span(id)) {
                    span.extensions_mut().insert(CallId(id_, call.1));
                }
            }
            // A call without a named holder: the library's span names the field it picked.
            "acquire" => {
                let mut field = FieldField(None);
                attrs.record(&mut field);
                let (Some(field), Some(span)) = (field.0, ctx.span(id)) else {
                    return;
                };
                for outer in span.scope().skip(1) {
                    if let Some(CallId(call, unbound)) = outer.extensions().get::<CallId>() {
                        if *unbound {
                            self.0
                                .bound
                                .lock()
                                .unwrap()
                                .insert(call.clone(), field.clone());
                            self.0.log(Event::Bound {
                                id: call.clone(),
                                field,
                            });
                        }
                        return;
                    }
                }
            }
            _ => {}
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let t = mono_ns();
        let mut queued = QueuedMessage(0);
        event.record(&mut queued);
        if queued.0 == 0 {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(CallId(id, _)) = span.extensions().get::<CallId>() {
                self.0.log(if queued.0 == 1 {
                    Event::Joined { id: id.clone(), t }
                } else {
                    Event::Handed { id: id.clone(), t }
                });
                return;
            }
        }
    }
}

/// Which kind of lock a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Fair,
    Plain,
    /// The read side of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
}

#[derive(Clone)]
pub enum Handle {
    Fair(FairLock),
    Plain(NonFairLock),
    Read(ReadLock),
    Write(WriteLock),
}

impl Handle {
    /// A handle of `holder`, so the log knows the owner field before the call (a handle that
    /// names none is [`per_call`](Self::per_call)). Every kind but the read side is fenced.
    pub fn new(client: &Client, name: &str, kind: Kind, holder: Holder) -> Handle {
        match kind {
            Kind::Fair => Handle::Fair(client.fair_lock(name).fenced().with_holder(holder)),
            Kind::Plain => Handle::Plain(client.non_fair_lock(name).fenced().with_holder(holder)),
            Kind::Read | Kind::Write => {
                let mut rw = client.read_write_lock(name);
                if is_preferring_name(name) {
                    rw = rw.writer_preferring();
                }
                if kind == Kind::Read {
                    Handle::Read(rw.read_lock().with_holder(holder))
                } else {
                    Handle::Write(rw.write_lock().fenced().with_holder(holder))
                }
            }
        }
    }

    /// A handle that names no holder: each of its calls gets one of its own inside the library
    /// (and may take over the field the handle kept from its last call), so the log learns the
    /// call's field from the library's `acquire` span ([`Event::Bound`]).
    pub fn per_call(client: &Client, name: &str, kind: Kind) -> Handle {
        match kind {
            Kind::Fair => Handle::Fair(client.fair_lock(name).fenced()),
            Kind::Plain => Handle::Plain(client.non_fair_lock(name).fenced()),
            Kind::Read | Kind::Write => {
                let mut rw = client.read_write_lock(name);
                if is_preferring_name(name) {
                    rw = rw.writer_preferring();
                }
                if kind == Kind::Read {
                    Handle::Read(rw.read_lock())
                } else {
                    Handle::Write(rw.write_lock().fenced())
                }
            }
        }
    }

    pub fn is_fair(&self) -> bool {
        matches!(self, Handle::Fair(_))
    }

    pub fn kind(&self) -> Kind {
        match self {
            Handle::Fair(_) => Kind::Fair,
            Handle::Plain(_) => Kind::Plain,
            Handle::Read(_) => Kind::Read,
            Handle::Write(_) => Kind::Write,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Handle::Fair(l) => l.name(),
            Handle::Plain(l) => l.name(),
            Handle::Read(l) => l.name(),
            Handle::Write(l) => l.name(),
        }
    }

    pub async fn run(&self, acq: &Acq) -> fairlock::Result<Option<LockGuard>> {
        match acq.kind {
            AcqKind::Lock => match self {
                Handle::Fair(l) => l.lock().await.map(Some),
                Handle::Plain(l) => l.lock().await.map(Some),
                Handle::Read(l) => l.lock().await.map(Some),
                Handle::Write(l) => l.lock().await.map(Some),
            },
            AcqKind::Lease(d) => match self {
                Handle::Fair(l) => l.lock_with_lease(d).await.map(Some),
                Handle::Plain(l) => l.lock_with_lease(d).await.map(Some),
                Handle::Read(l) => l.lock_with_lease(d).await.map(Some),
                Handle::Write(l) => l.lock_with_lease(d).await.map(Some),
            },
            AcqKind::Try(w, d) => match self {
                Handle::Fair(l) => l.try_lock(w, d).await,
                Handle::Plain(l) => l.try_lock(w, d).await,
                Handle::Read(l) => l.try_lock(w, d).await,
                Handle::Write(l) => l.try_lock(w, d).await,
            },
        }
    }

    /// The lock's state, for a report.
    pub async fn describe(&self) -> String {
        match self {
            Handle::Fair(l) => format!("{:?}", l.state().await),
            Handle::Plain(l) => format!("{:?}", l.state().await),
            Handle::Read(l) => format!("{:?}", l.state().await),
            Handle::Write(l) => format!("{:?}", l.state().await),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub enum AcqKind {
    Lock,
    Lease(Duration),
    Try(Duration, Option<Duration>),
}

/// One acquisition call: what it asks for, and when the caller drops it (if ever).
#[derive(Debug, Clone, Copy)]
pub struct Acq {
    pub kind: AcqKind,
    pub cancel_after: Option<Duration>,
}

impl Acq {
    pub fn op(&self) -> &'static str {
        match self.kind {
            AcqKind::Lock => "lock",
            AcqKind::Lease(_) => "lock_with_lease",
            AcqKind::Try(w, _) if w.is_zero() => "try_lock0",
            AcqKind::Try(..) => "try_lock",
        }
    }

    pub fn wait_ms(&self) -> Option<u64> {
        match self.kind {
            AcqKind::Try(w, _) => Some(w.as_millis() as u64),
            _ => None,
        }
    }

    pub fn lease_ms(&self) -> Option<u64> {
        match self.kind {
            AcqKind::Lease(d) | AcqKind::Try(_, Some(d)) => Some(d.as_millis() as u64),
            _ => None,
        }
    }
}

pub struct ChildCtx {
    pub proc: String,
    pub url: String,
    pub ops: HashSet<String>,
    pub log: Arc<Recorder>,
    pub clock: InstantClock,
    /// The current client and its id (`<proc>.c<generation>`).
    pub client: tokio::sync::RwLock<(Client, String)>,
    pub generation: AtomicU32,
    pub shutting_down: AtomicBool,
    pub stopping: AtomicBool,
    pub next_call: AtomicU64,
    pub counts: Mutex<BTreeMap<String, u64>>,
}

impl ChildCtx {
    pub fn has(&self, op: &str) -> bool {
        self.ops.contains(op)
    }

    pub fn count(&self, what: &str) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(what.to_owned())
            .or_default() += 1;
    }

    pub async fn current(&self) -> (Client, String) {
        let c = self.client.read().await;
        (c.0.clone(), c.1.clone())
    }

    pub fn anomaly(&self, what: String) {
        self.log.log(Event::Anomaly {
            proc: self.proc.clone(),
            t: mono_ns(),
            what,
        });
    }

    /// A new call id, `<proc>.<n>`.
    fn call_id(&self) -> String {
        format!(
            "{}.{}",
            self.proc,
            self.next_call.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Runs one call (cut off after `cancel_after`, as a caller's `timeout()` would) and sorts
    /// what it gave: when it ended (read at once), the outcome to record, the value when granted
    /// and the error's text. Counts the outcome (and the error) with `kind` in front ("" for the
    /// locks, "sem ", "multi "). `unbound`: the call names no holder ([`Event::Bound`]).
    pub async fn run_call<T>(
        &self,
        kind: &str,
        id: &str,
        cancel_after: Option<Duration>,
        unbound: bool,
        run: impl std::future::Future<Output = fairlock::Result<Option<T>>>,
    ) -> (u64, Outcome, Option<T>, String) {
        let run = run.instrument(tracing::info_span!("torture_call", id = %id, unbound));
        let result = match cancel_after {
            Some(d) => tokio::time::timeout(d, run).await.ok(),
            None => Some(run.await),
        };
        let t = mono_ns();
        let (outcome, value, detail) = match result {
            None => (Outcome::Cancelled, None, String::new()),
            Some(Ok(Some(v))) => (Outcome::Granted, Some(v), String::new()),
            Some(Ok(None)) => (Outcome::TimedOut, None, String::new()),
            Some(Err(e)) if e.is_shutdown() => (Outcome::Shutdown, None, String::new()),
            Some(Err(e)) => {
                if matches!(e, fairlock::Error::UpgradeRefused { .. }) {
                    // A holder shared on purpose reads in one task and asks to write in another.
                    self.count("upgrade refused");
                } else {
                    let text = format!(
                        "{e}: {:?}",
                        std::error::Error::source(&e).map(|s| s.to_string())
                    );
                    self.count(&format!(
                        "error {kind}{}",
                        text.chars().take(60).collect::<String>()
                    ));
                }
                (Outcome::Error, None, format!("{e}"))
            }
        };
        self.count(&format!(
            "outcome {kind}{}",
            format!("{outcome:?}").to_lowercase()
        ));
        (t, outcome, value, detail)
    }

    /// Runs one acquisition call and records it. `Some((guard, call id))` when granted.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire(
        &self,
        client: &(Client, String),
        h: &Handle,
        holder: Option<i64>,
        shared: bool,
        reentrant: bool,
        acq: Acq,
    ) -> (Option<(LockGuard, String)>, Outcome) {
        let (granted, outcome, _) = self
            .acquire_with_detail(client, h, holder, shared, reentrant, acq)
            .await;
        (granted, outcome)
    }

    /// [`acquire`](Self::acquire), and the error's text when it failed. A lease under
    /// `MIN_LEASE` must be refused with `InvalidArgument` (or `Shutdown`); anything else is an
    /// anomaly (such a lease used to be retried until the call's wait ran out).
    /// `holder: None`: the handle names no holder (the library picks one inside the call).
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_with_detail(
        &self,
        client: &(Client, String),
        h: &Handle,
        holder: Option<i64>,
        shared: bool,
        reentrant: bool,
        acq: Acq,
    ) -> (Option<(LockGuard, String)>, Outcome, String) {
        let id = self.call_id();
        let field = match holder {
            Some(holder) => {
                let mut field = format!("{}:{holder}", client.0.id());
                if h.kind() == Kind::Write {
                    field.push_str(":write");
                }
                field
            }
            None => {
                self.count("call per-call holder");
                format!("{}{id}", fairlock_testkit::history::UNBOUND)
            }
        };
        self.log.log(Event::Call {
            id: id.clone(),
            proc: self.proc.clone(),
            client: client.1.clone(),
            name: h.name().to_owned(),
            fair: h.is_fair(),
            field: field.clone(),
            op: acq.op().to_owned(),
            wait_ms: acq.wait_ms(),
            lease_ms: acq.lease_ms(),
            t: mono_ns(),
            shared,
            reentrant,
            java: false,
        });
        self.count(&format!("call {}", acq.op()));
        match h.kind() {
            Kind::Read => self.count("call rw read"),
            Kind::Write => self.count("call rw write"),
            Kind::Fair | Kind::Plain => {}
        }
        let (t, outcome, guard, detail) = self
            .run_call("", &id, acq.cancel_after, holder.is_none(), h.run(&acq))
            .await;
        // A call that named no holder: the field the library's span named for it (its
        // `Event::Bound`), if the call got that far.
        let bound = self.log.bound.lock().unwrap().remove(&id);
        let below_min = acq
            .lease_ms()
            .is_some_and(|l| Duration::from_millis(l) < fairlock::MIN_LEASE);
        if below_min {
            self.count("lease under MIN_LEASE");
            let refused = outcome == Outcome::Shutdown
                || (outcome == Outcome::Error && detail.starts_with("invalid argument `lease`"));
            if !refused {
                self.anomaly(format!(
                    "call {id}: a lease of {:?} ms (under MIN_LEASE) was not refused: {outcome:?} {detail}",
                    acq.lease_ms()
                ));
            }
        }
        let (token, vu) = match &guard {
            Some(g) => (g.fencing_token(), Some(self.clock.ns(g.valid_until()))),
            None => (None, None),
        };
        self.log.log(Event::End {
            id: id.clone(),
            t,
            outcome,
            token,
            vu,
            detail: detail.clone(),
        });
        if let Some(g) = &guard {
            // A guard that says it is not lost has a deadline still ahead (read in this order:
            // a deadline that passed is marked lost before any renewal can move it).
            let deadline = g.valid_until();
            let now = std::time::Instant::now();
            if deadline <= now && !g.is_lost() {
                self.anomaly(format!(
                    "call {id}: a granted guard is not lost but its deadline passed {:?} ago",
                    now - deadline
                ));
            }
            let field = bound.as_ref().unwrap_or(&field);
            if g.owner_field() != field {
                self.anomaly(format!(
                    "call {id}: guard owner field {} but the caller's field is {field}",
                    g.owner_field()
                ));
            }
            if g.fencing_token().is_none() && h.kind() != Kind::Read {
                self.anomaly(format!("call {id}: a fenced guard without a token"));
            }
        }
        (guard.map(|g| (g, id)), outcome, detail)
    }

    /// Holds for `d` (the critical section), watching `lost()`.
    pub async fn hold(&self, guard: &LockGuard, id: &str, d: Duration, lost_logged: &mut bool) {
        if *lost_logged {
            tokio::time::sleep(d).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            reason = guard.lost() => {
                self.log.log(Event::Lost { id: id.to_owned(), t: mono_ns(), reason: format!("{reason:?}") });
                self.count("lost");
                *lost_logged = true;
                // The rest of the critical section is not trusted any more; finish it anyway.
                tokio::time::sleep(d / 4).await;
            }
        }
    }

    pub async fn release(&self, guard: LockGuard, id: &str, by_drop: bool, lost_logged: bool) {
        let vu = self.clock.ns(guard.valid_until());
        let lost = guard.is_lost();
        if lost_logged && !lost {
            // Once lost, always lost: no renewal or grant may make a lost guard valid again.
            self.anomaly(format!("call {id}: a guard seen lost reads not lost again"));
        }
        if lost && !lost_logged {
            self.log.log(Event::Lost {
                id: id.to_owned(),
                t: mono_ns(),
                reason: "seen-at-release".into(),
            });
        }
        self.log.log(Event::Release {
            id: id.to_owned(),
            t: mono_ns(),
            vu,
            how: if by_drop { "drop" } else { "unlock" }.into(),
            lost,
        });
        if by_drop {
            self.count("release drop");
            drop(guard);
        } else {
            self.count("release unlock");
            let r = guard.unlock().await;
            let result = match r {
                Ok(()) => "ok".to_owned(),
                Err(e) if e.is_not_held() => "notheld".to_owned(),
                Err(e) => format!("err:{e}"),
            };
            self.log.log(Event::Released {
                id: id.to_owned(),
                t: mono_ns(),
                result,
            });
        }
    }

    /// Shuts the current client down and builds the next one (other tasks see `Shutdown`).
    pub async fn replace_client(&self) {
        if self.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        self.count("shutdown");
        let mut slot = self.client.write().await;
        self.log.log(Event::Shutdown {
            client: slot.1.clone(),
            t: mono_ns(),
        });
        slot.0.shutdown().await;
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *slot = (build_client(&self.url).await, format!("{}.c{g}", self.proc));
        self.shutting_down.store(false, Ordering::SeqCst);
    }
}

pub async fn build_client(url: &str) -> Client {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match Client::builder()
            .standalone(url)
            .watchdog_timeout(TIMING.watchdog)
            .waiter_liveness(TIMING.liveness)
            .timer_tick(TIMING.tick)
            .command_timeout(TIMING.command_timeout)
            .build()
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot build a client for {url}: {e}"),
        }
    }
}

/// A random acquisition from the enabled kinds.
pub fn random_acq(rng: &mut Rng, ctx: &ChildCtx) -> Acq {
    let mut kinds = Vec::new();
    for k in ["lock", "lease", "try", "try0"] {
        if ctx.has(k) {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        kinds.push("try");
    }
    // A fixed lease: mostly 60 ms..1.2 s; sometimes near the validity margin (MIN_LEASE, 3 ms,
    // to 8 ms: grants the round trip may eat, retried with a backoff), and rarely under it (1 or
    // 2 ms: refused before any I/O).
    let fixed = |rng: &mut Rng| {
        let p = rng.below(100);
        if p < 2 {
            rng.ms(1, 2)
        } else if p < 10 {
            rng.ms(3, 8)
        } else {
            rng.ms(60, 1200)
        }
    };
    let lease = |rng: &mut Rng| {
        if rng.chance(0.5) {
            None
        } else {
            Some(fixed(rng))
        }
    };
    let kind = match *rng.pick(&kinds) {
        "lock" => AcqKind::Lock,
        "lease" => AcqKind::Lease(fixed(rng)),
        "try0" => AcqKind::Try(Duration::ZERO, lease(rng)),
        _ => AcqKind::Try(rng.ms(1, 400), lease(rng)),
    };
    let unbounded = matches!(kind, AcqKind::Lock | AcqKind::Lease(_));
    let cancel_after = if unbounded {
        // An unbounded wait is always bounded by the caller here: a `timeout()` retry loop.
        Some(if ctx.has("cancel") && rng.chance(0.25) {
            rng.ms(0, 6) // drops the future in the middle of its first round trip
        } else {
            rng.ms(50, 2500)
        })
    } else if ctx.has("cancel") && rng.chance(0.15) {
        Some(rng.ms(0, 300))
    } else {
        None
    };
    Acq { kind, cancel_after }
}

pub async fn task_loop(ctx: Arc<ChildCtx>, task_no: usize, seed: u64, shared_holder: Option<i64>) {
    let mut rng = Rng::new(seed);
    let mut names: Vec<(&str, Kind)> = Vec::new();
    if ctx.has("fair") {
        names.extend(FAIR_NAMES.iter().map(|n| (*n, Kind::Fair)));
    }
    if ctx.has("plain") {
        names.extend(PLAIN_NAMES.iter().map(|n| (*n, Kind::Plain)));
    }
    if ctx.has("rw") {
        // The side is picked per round (below).
        names.extend(RW_NAMES.iter().map(|n| (*n, Kind::Read)));
    }
    // A raw holder shared on purpose by two tasks of this process.
    let shared_holder = shared_holder.map(|id| Holder::from_raw(id).expect("a raw holder id"));
    // Handles that name no holder, kept by this task across its rounds (per client, name and
    // side), as a service keeps a handle and locks it over and over: each call is its own
    // holder, and a call may take over the field the handle kept from its last call.
    let mut kept: HashMap<(String, &str, Kind), Handle> = HashMap::new();
    while !ctx.stopping.load(Ordering::SeqCst) {
        if task_no == 0 && ctx.has("shutdown") && rng.chance(0.004) {
            ctx.replace_client().await;
            continue;
        }
        let client = ctx.current().await;
        kept.retain(|(c, _, _), _| *c == client.1);
        if ctx.has("sem") && rng.chance(0.15) {
            let plain = rng.chance(0.5);
            let big = !plain && rng.chance(0.06);
            sem_round(&ctx, Rng::new(rng.next()), &client, plain, big).await;
            continue;
        }
        if ctx.has("multi") && ctx.has("plain") && rng.chance(0.1) {
            multi_round(&ctx, Rng::new(rng.next()), &client).await;
            continue;
        }
        let mut pick = *rng.pick(&names);
        if pick.1 == Kind::Read && rng.chance(0.35) {
            pick.1 = Kind::Write;
        }
        let per_call = shared_holder.is_none() && ctx.has("percall") && rng.chance(0.3);
        let handle = per_call.then(|| {
            &*kept
                .entry((client.1.clone(), pick.0, pick.1))
                .or_insert_with(|| Handle::per_call(&client.0, pick.0, pick.1))
        });
        if ctx.has("joined") && rng.chance(0.12) {
            // Several lock futures polled concurrently by this one task (`join!`, as
            // `for_each_concurrent`, `buffer_unordered` and `select!` loops do), on one name.
            // Without a holder in common they must exclude each other; with one (shared on
            // purpose) they are one reentrant holder.
            let group = if shared_holder.is_some() {
                shared_holder
            } else {
                (handle.is_none() && rng.chance(0.4)).then(|| client.0.holder())
            };
            ctx.count(if group.is_some() {
                "joined shared"
            } else {
                "joined"
            });
            let three = rng.chance(0.5);
            let arm = |seed: u64| one_round(&ctx, Rng::new(seed), &client, pick, group, handle);
            let (a, b, c) = (rng.next(), rng.next(), rng.next());
            tokio::join!(arm(a), arm(b), async {
                if three {
                    arm(c).await
                }
            });
        } else {
            one_round(
                &ctx,
                Rng::new(rng.next()),
                &client,
                pick,
                shared_holder,
                handle,
            )
            .await;
        }
    }
}

/// One round of a task: an acquisition (maybe a `timeout()` retry loop), a hold, maybe a
/// re-entry of the same holder, a release (maybe by drop), maybe a relock at once. `holder`:
/// a holder shared on purpose, or `None` for a fresh holder per call (the library's default):
/// named by the workload, or (`per_call`: a handle kept by the task that names none) picked by
/// the library inside the call.
async fn one_round(
    ctx: &ChildCtx,
    mut rng: Rng,
    client: &(Client, String),
    (name, kind): (&str, Kind),
    holder: Option<Holder>,
    per_call: Option<&Handle>,
) {
    let shared = holder.is_some();
    let call_holder = || {
        per_call
            .is_none()
            .then(|| holder.unwrap_or_else(|| client.0.holder()))
    };
    // The call's handle: a new one naming the call's holder, or the kept one.
    let handle_of = |me: Option<Holder>| me.map(|me| Handle::new(&client.0, name, kind, me));
    let me = call_holder();
    let h = handle_of(me);
    // A `timeout()` retry loop around unbounded waits; a single call otherwise. Every attempt of
    // the loop is a new call, so without a shared holder each one is a new holder.
    let acq = random_acq(&mut rng, ctx);
    let attempts = if acq.cancel_after.is_some() && rng.chance(0.6) {
        1 + rng.below(4)
    } else {
        1
    };
    let mut granted = None;
    let mut h = h;
    let mut me = me;
    for attempt in 0..attempts {
        if attempt > 0 {
            me = call_holder();
            h = handle_of(me);
        }
        let call = h
            .as_ref()
            .or(per_call)
            .expect("a handle naming a holder, or the kept one");
        let (g, outcome) = ctx
            .acquire(client, call, me.map(|m| m.id()), shared, false, acq)
            .await;
        if g.is_some() || outcome != Outcome::Cancelled || ctx.stopping.load(Ordering::SeqCst) {
            granted = g;
            break;
        }
    }
    let Some((guard, id)) = granted else {
        return;
    };
    let mut lost = false;
    let lease = acq.lease_ms().map(Duration::from_millis);
    let hold_for = if ctx.has("longhold") && rng.chance(0.06) {
        // Past the lease (or a few renewals), so leases run out and renewals cross releases.
        lease.unwrap_or(TIMING.watchdog) + rng.ms(0, 400)
    } else {
        rng.ms(0, 25)
    };
    ctx.hold(&guard, &id, hold_for, &mut lost).await;
    // Re-entry by the same holder (explicitly: the guard's own holder) with another lease.
    if ctx.has("reenter") && rng.chance(0.15) {
        let inner_acq = Acq {
            kind: match rng.below(3) {
                0 => AcqKind::Try(rng.ms(0, 50), Some(rng.ms(50, 900))),
                1 => AcqKind::Try(Duration::ZERO, None),
                _ => AcqKind::Lease(rng.ms(50, 900)),
            },
            cancel_after: Some(rng.ms(100, 600)),
        };
        // A writer's holder sometimes takes the read side instead: a downgrade.
        let side = if kind == Kind::Write && rng.chance(0.5) {
            ctx.count("downgrade");
            Kind::Read
        } else {
            kind
        };
        let again = Handle::new(&client.0, name, side, guard.holder());
        let (inner, _) = ctx
            .acquire(
                client,
                &again,
                Some(guard.holder().id()),
                shared,
                true,
                inner_acq,
            )
            .await;
        if let Some((ig, iid)) = inner {
            ctx.count("reentered");
            let mut ilost = false;
            ctx.hold(&ig, &iid, rng.ms(0, 15), &mut ilost).await;
            let by_drop = ctx.has("drop") && rng.chance(0.5);
            ctx.release(ig, &iid, by_drop, ilost).await;
        }
        ctx.hold(&guard, &id, rng.ms(0, 10), &mut lost).await;
    }
    // One holder on both sides of a read-write lock: the guard dropped, then at once a call of
    // the same holder on the other side (its holder is not shared with another task, so it
    // holds nothing else by then).
    let switch = !shared
        && matches!(kind, Kind::Read | Kind::Write)
        && ctx.has("droprelock")
        && rng.chance(0.25);
    let relock = !switch && ctx.has("droprelock") && rng.chance(0.2);
    let by_drop = switch || relock || (ctx.has("drop") && rng.chance(0.5));
    let mine = guard.holder();
    ctx.release(guard, &id, by_drop, lost).await;
    if switch {
        ctx.count("switch sides");
        let other = if kind == Kind::Read {
            Kind::Write
        } else {
            Kind::Read
        };
        let again = Acq {
            kind: AcqKind::Try(rng.ms(0, 300), None),
            cancel_after: Some(rng.ms(200, 2000)),
        };
        let h = Handle::new(&client.0, name, other, mine);
        let (g, outcome, detail) = ctx
            .acquire_with_detail(client, &h, Some(mine.id()), false, false, again)
            .await;
        if outcome == Outcome::Error && detail.contains("cannot also take it for writing") {
            // The dropped read guard's release reached Redis after this call: the promise that
            // `drop(g)` then a call of the same holder is `g.unlock().await` then that call.
            ctx.anomaly(format!(
                "a write call of a holder whose read guard was just dropped was refused as an \
                 upgrade: {detail}"
            ));
        }
        if let Some((g, id)) = g {
            let mut lost = false;
            ctx.hold(&g, &id, rng.ms(0, 10), &mut lost).await;
            ctx.release(g, &id, rng.chance(0.5), lost).await;
        }
    }
    if relock {
        // drop(guard); lock again at once: must behave as unlock-then-lock (a new call: a new
        // holder, unless one is shared).
        ctx.count("drop-then-relock");
        let again = Acq {
            kind: if rng.chance(0.5) {
                AcqKind::Lock
            } else {
                AcqKind::Try(rng.ms(0, 300), None)
            },
            cancel_after: Some(rng.ms(200, 2000)),
        };
        let next = call_holder();
        let h = handle_of(next);
        let call = h
            .as_ref()
            .or(per_call)
            .expect("a handle naming a holder, or the kept one");
        let (g, _) = ctx
            .acquire(client, call, next.map(|n| n.id()), shared, false, again)
            .await;
        if let Some((g, id)) = g {
            let mut lost = false;
            ctx.hold(&g, &id, rng.ms(0, 20), &mut lost).await;
            let by_drop = rng.chance(0.5);
            ctx.release(g, &id, by_drop, lost).await;
        }
    }
}

/// Permits of either semaphore, as a round holds them.
enum Taken {
    Plain(fairlock::Permits),
    Expirable(fairlock::ExpirablePermits),
}

impl Taken {
    fn count(&self) -> usize {
        match self {
            Taken::Plain(p) => p.count() as usize,
            Taken::Expirable(p) => p.count(),
        }
    }

    /// The validity deadline (mono ns); a plain semaphore's permits never expire.
    fn vu(&self, clock: &InstantClock) -> u64 {
        match self {
            Taken::Plain(_) => u64::MAX,
            Taken::Expirable(p) => clock.ns(p.valid_until()),
        }
    }

    async fn lost(&self) -> fairlock::LostReason {
        match self {
            Taken::Plain(_) => std::future::pending().await,
            Taken::Expirable(p) => p.lost().await,
        }
    }

    fn is_lost(&self) -> bool {
        matches!(self, Taken::Expirable(p) if p.is_lost())
    }

    async fn release(self) -> fairlock::Result<()> {
        match self {
            Taken::Plain(p) => p.release().await.map(drop),
            Taken::Expirable(p) => p.release().await.map(drop),
        }
    }
}

/// One round on a semaphore: the permit-expirable one ([`SEM_NAME`]), the plain one
/// ([`SEM_PLAIN_NAME`]), or (`big`) the expirable one for counts near the API's limit
/// ([`BIG_SEM_NAME`]: 8,000 to `MAX_PERMITS` permits a call, and counts over the limit, which
/// must be refused; a release that fails other than transiently is an anomaly). Take one or two permits (for the expirable one: the watchdog or a fixed
/// lease; `acquire` in a `timeout()`, or `try_acquire`), hold them, release or drop them. Logged
/// as a call on the semaphore's name with op `sem<n>` and a field of its own (permits have no
/// holder); the checker sums the permits of overlapping trusted holds (`permit-limit`), and the
/// parent checks at the end that every permit came back (the plain one: all but those a killed
/// process may have held).
async fn sem_round(
    ctx: &ChildCtx,
    mut rng: Rng,
    client: &(Client, String),
    plain: bool,
    big: bool,
) {
    let name = match (plain, big) {
        (true, _) => SEM_PLAIN_NAME,
        (false, true) => BIG_SEM_NAME,
        (false, false) => SEM_NAME,
    };
    let max = fairlock::ExpirableSemaphore::MAX_PERMITS;
    let n = if big && rng.chance(0.1) {
        // Near the API's limit: scripts long enough to stall the server (the checker counts
        // such a call as a server-wide stall, `check::add_workload_stalls`).
        max - rng.below(4_000) as u32
    } else if big {
        // Just past what Lua's unpack of one list can take (about 8,000).
        8_000 + rng.below(4_001) as u32
    } else {
        1 + rng.below(2) as u32
    };
    if big && rng.chance(0.3) {
        // Counts the API does not take: refused before anything is allocated or sent.
        let too_many = if rng.chance(0.5) { u32::MAX } else { max + 1 };
        let sem = client.0.expirable_semaphore(name);
        match sem.try_acquire(too_many, Duration::ZERO, None).await {
            Err(fairlock::Error::InvalidArgument { .. }) | Err(fairlock::Error::Shutdown) => {
                ctx.count("sem over the limit refused")
            }
            other => ctx.anomaly(format!(
                "try_acquire({too_many}) on an expirable semaphore was not refused: {:?}",
                other.map(|p| p.map(|p| p.count()))
            )),
        }
    }
    let lease = (!plain && !rng.chance(0.5)).then(|| rng.ms(60, 1200));
    let wait = (!rng.chance(0.3)).then(|| rng.ms(0, 400));
    let cancel_after = match wait {
        None => Some(if ctx.has("cancel") && rng.chance(0.25) {
            rng.ms(0, 6)
        } else {
            rng.ms(50, 2500)
        }),
        Some(_) if ctx.has("cancel") && rng.chance(0.15) => Some(rng.ms(0, 300)),
        Some(_) => None,
    };
    let id = ctx.call_id();
    ctx.log.log(Event::Call {
        id: id.clone(),
        proc: ctx.proc.clone(),
        client: client.1.clone(),
        name: name.to_owned(),
        fair: false,
        field: format!("{}:sem:{id}", client.0.id()),
        op: format!("sem{n}"),
        wait_ms: wait.map(|w| w.as_millis() as u64),
        lease_ms: lease.map(|d| d.as_millis() as u64),
        t: mono_ns(),
        shared: false,
        reentrant: false,
        java: false,
    });
    let kind = match (plain, big) {
        (true, _) => "sem plain",
        (false, true) => "sem big",
        (false, false) => "sem",
    };
    ctx.count(&format!("call {kind}"));
    let run = async {
        if plain {
            let sem = client.0.semaphore(name);
            match wait {
                None => sem.acquire(n).await.map(|p| Some(Taken::Plain(p))),
                Some(w) => sem.try_acquire(n, w).await.map(|p| p.map(Taken::Plain)),
            }
        } else {
            let sem = client.0.expirable_semaphore(name);
            match wait {
                None => sem
                    .acquire(n, lease)
                    .await
                    .map(|p| Some(Taken::Expirable(p))),
                Some(w) => sem
                    .try_acquire(n, w, lease)
                    .await
                    .map(|p| p.map(Taken::Expirable)),
            }
        }
    };
    let (t, outcome, permits, detail) = ctx
        .run_call(&format!("{kind} "), &id, cancel_after, false, run)
        .await;
    ctx.log.log(Event::End {
        id: id.clone(),
        t,
        outcome,
        token: None,
        vu: permits.as_ref().map(|p| p.vu(&ctx.clock)),
        detail,
    });
    let Some(permits) = permits else {
        return;
    };
    if permits.count() != n as usize {
        ctx.anomaly(format!(
            "call {id}: {} permits granted for {n}",
            permits.count()
        ));
    }
    let hold_for = if ctx.has("longhold") && rng.chance(0.06) {
        lease.unwrap_or(TIMING.watchdog) + rng.ms(0, 400)
    } else {
        rng.ms(0, 25)
    };
    let mut lost_logged = false;
    tokio::select! {
        _ = tokio::time::sleep(hold_for) => {}
        reason = permits.lost() => {
            ctx.log.log(Event::Lost { id: id.clone(), t: mono_ns(), reason: format!("{reason:?}") });
            ctx.count(&format!("lost {kind}"));
            lost_logged = true;
            tokio::time::sleep(hold_for / 4).await;
        }
    }
    let lost = permits.is_lost();
    if lost_logged && !lost {
        ctx.anomaly(format!("call {id}: permits seen lost read not lost again"));
    }
    if lost && !lost_logged {
        ctx.log.log(Event::Lost {
            id: id.clone(),
            t: mono_ns(),
            reason: "seen-at-release".into(),
        });
    }
    let by_drop = ctx.has("drop") && rng.chance(0.4);
    ctx.log.log(Event::Release {
        id: id.clone(),
        t: mono_ns(),
        vu: permits.vu(&ctx.clock),
        how: if by_drop { "drop" } else { "unlock" }.into(),
        lost,
    });
    if by_drop {
        ctx.count(&format!("release {kind} drop"));
        drop(permits);
    } else {
        ctx.count(&format!("release {kind}"));
        let result = match permits.release().await {
            Ok(()) => "ok".to_owned(),
            Err(e) => {
                if big && !e.is_transient() && !e.is_shutdown() {
                    ctx.anomaly(format!(
                        "the release of {n} permits failed: {}",
                        fairlock_error_chain(&e)
                    ));
                }
                format!("err:{e}")
            }
        };
        ctx.log.log(Event::Released {
            id,
            t: mono_ns(),
            result,
        });
    }
}

/// One multi-lock round over both [`PLAIN_NAMES`], listed in a random order: each member is
/// logged as a call of its own (op `multi`, one holder each, the multi-lock's start and end),
/// so every rule over single locks covers the members too; then held and released member by
/// member (or dropped whole).
async fn multi_round(ctx: &ChildCtx, mut rng: Rng, client: &(Client, String)) {
    let mut names = PLAIN_NAMES.to_vec();
    if rng.chance(0.5) {
        names.reverse();
    }
    let members: Vec<(String, Holder, String)> = names
        .iter()
        .map(|name| (name.to_string(), client.0.holder(), ctx.call_id()))
        .collect();
    // Sometimes a fixed lease shorter than the time a later member takes (issue 34): another
    // call of this task holds the member the multi-lock takes last for longer than the lease
    // (and the checker's slack) when the multi-lock asks for it.
    let blocked = ctx.has("lease") && rng.chance(0.3);
    let acq = if blocked {
        let lease = rng.ms(20, 200);
        Acq {
            kind: if rng.chance(0.5) {
                AcqKind::Lease(lease)
            } else {
                AcqKind::Try(rng.ms(1500, 2500), Some(lease))
            },
            cancel_after: Some(Duration::from_secs(4)),
        }
    } else {
        random_acq(&mut rng, ctx)
    };
    let mut brng = Rng::new(rng.next());
    let t0 = mono_ns();
    for (name, holder, id) in &members {
        ctx.log.log(Event::Call {
            id: id.clone(),
            proc: ctx.proc.clone(),
            client: client.1.clone(),
            name: name.clone(),
            fair: false,
            field: format!("{}:{}", client.0.id(), holder.id()),
            op: "multi".into(),
            wait_ms: acq.wait_ms(),
            lease_ms: acq.lease_ms(),
            t: t0,
            shared: false,
            reentrant: false,
            java: false,
        });
    }
    ctx.count("call multi");
    let multi = fairlock::MultiLock::new(members.iter().map(|(name, holder, _)| {
        fairlock::MultiMember::from(
            client
                .0
                .non_fair_lock(name.as_str())
                .fenced()
                .with_holder(*holder),
        )
    }));
    let run = async {
        match acq.kind {
            AcqKind::Lock => multi.lock().await.map(Some),
            AcqKind::Lease(d) => multi.lock_with_lease(d).await.map(Some),
            AcqKind::Try(w, d) => multi.try_lock(w, d).await,
        }
    };
    let last = multi
        .members()
        .last()
        .map(|m| m.name().to_owned())
        .unwrap_or_default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let blocker = async {
        if !blocked {
            return;
        }
        ctx.count("multi blocked");
        let holder = client.0.holder();
        let h = Handle::new(&client.0, &last, Kind::Plain, holder);
        let hold_for =
            acq.lease_ms().map_or(Duration::ZERO, Duration::from_millis) + brng.ms(300, 600);
        let take = Acq {
            kind: AcqKind::Try(
                Duration::from_millis(500),
                Some(hold_for + Duration::from_millis(200)),
            ),
            cancel_after: None,
        };
        let (g, _) = ctx
            .acquire(client, &h, Some(holder.id()), false, false, take)
            .await;
        let _ = ready_tx.send(());
        if let Some((g, id)) = g {
            let mut lost = false;
            ctx.hold(&g, &id, hold_for, &mut lost).await;
            ctx.release(g, &id, false, lost).await;
        }
    };
    let call = async {
        if blocked {
            let _ = tokio::time::timeout(Duration::from_secs(1), ready_rx).await;
        }
        ctx.run_call("multi ", &members[0].2, acq.cancel_after, false, run)
            .await
    };
    let ((), (t, outcome, guard, detail)) = tokio::join!(blocker, call);
    let guards: Vec<Option<LockGuard>> = match guard {
        Some(g) => {
            let mut by_name: Vec<Option<LockGuard>> = Vec::new();
            let mut guards = g.into_guards();
            for (name, _, _) in &members {
                let i = guards.iter().position(|g| g.name() == name.as_str());
                by_name.push(i.map(|i| guards.remove(i)));
            }
            by_name
        }
        None => members.iter().map(|_| None).collect(),
    };
    for ((name, _, id), g) in members.iter().zip(&guards) {
        if outcome == Outcome::Granted && g.is_none() {
            ctx.anomaly(format!("call {id}: the multi-guard has no member {name}"));
        }
        ctx.log.log(Event::End {
            id: id.clone(),
            t,
            outcome,
            token: g.as_ref().and_then(|g| g.fencing_token()),
            vu: g.as_ref().map(|g| ctx.clock.ns(g.valid_until())),
            detail: detail.clone(),
        });
    }
    if outcome != Outcome::Granted {
        return;
    }
    tokio::time::sleep(rng.ms(0, 25)).await;
    let by_drop = ctx.has("drop") && rng.chance(0.3);
    for ((_, _, id), g) in members.iter().zip(guards).rev() {
        if let Some(g) = g {
            ctx.release(g, id, by_drop, false).await;
        }
    }
}

/// An error with every cause behind it, for a report.
fn fairlock_error_chain(e: &fairlock::Error) -> String {
    let mut text = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// Records runtime stalls: a 5 ms timer that fires much later than asked.
pub async fn lag_probe(ctx: Arc<ChildCtx>) {
    while !ctx.stopping.load(Ordering::SeqCst) {
        let t0 = mono_ns();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t1 = mono_ns();
        if t1 - t0 > 60_000_000 {
            ctx.log.log(Event::Lag {
                proc: ctx.proc.clone(),
                t0,
                t1,
            });
        }
    }
}

/// The child's main: runs until its stdin closes, then stops its tasks, shuts down and exits.
pub fn child_main() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("child: {k} unset"));
    let proc = var("FAIRLOCK_TORTURE_PROC");
    let url = var("FAIRLOCK_TORTURE_URL");
    let seed: u64 = var("FAIRLOCK_TORTURE_CHILD_SEED").parse().unwrap();
    let flavour = var("FAIRLOCK_TORTURE_FLAVOUR");
    let tasks: usize = var("FAIRLOCK_TORTURE_TASKS").parse().unwrap();
    let ops: HashSet<String> = var("FAIRLOCK_TORTURE_CHILD_OPS")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let log = File::options()
        .create(true)
        .append(true)
        .open(var("FAIRLOCK_TORTURE_LOG"))
        .unwrap();
    let log = Arc::new(Recorder {
        file: Mutex::new(log),
        bound: Mutex::new(HashMap::new()),
    });
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let joins = JoinLog(log.clone()).with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("fairlock", tracing::Level::DEBUG)
                .with_target("torture", tracing::Level::INFO),
        );
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(joins))
            .expect("the child sets up tracing once");
    }
    let rt = if flavour == "current" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let code = rt.block_on(async move {
        let client = build_client(&url).await;
        let ctx = Arc::new(ChildCtx {
            proc: proc.clone(),
            url: url.clone(),
            ops,
            log: log.clone(),
            clock: InstantClock::new(),
            client: tokio::sync::RwLock::new((client, format!("{proc}.c0"))),
            generation: AtomicU32::new(0),
            shutting_down: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            next_call: AtomicU64::new(1),
            counts: Mutex::new(BTreeMap::new()),
        });
        let stop = Arc::new(tokio::sync::Notify::new());
        {
            // Stdin closing is the signal to stop.
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = std::io::stdin().read_line(&mut sink);
                stop.notify_one();
            });
        }
        let shared_holder = 7_000_000 + (seed % 1000) as i64;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let holder = (ctx.has("shared") && t < 2).then_some(shared_holder);
            handles.push(tokio::spawn(task_loop(
                ctx.clone(),
                t,
                splitmix(seed ^ (t as u64 + 1)),
                holder,
            )));
        }
        let probe = tokio::spawn(lag_probe(ctx.clone()));
        println!("READY");
        stop.notified().await;
        ctx.stopping.store(true, Ordering::SeqCst);
        let mut stuck = 0;
        for h in handles {
            match tokio::time::timeout(Duration::from_secs(30), h).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    ctx.anomaly(format!("a task panicked: {e}"));
                    stuck += 1;
                }
                Err(_) => {
                    ctx.anomaly("a task did not finish within 30 s of the stop".into());
                    stuck += 1;
                }
            }
        }
        probe.abort();
        let (client, _) = ctx.current().await;
        if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
            .await
            .is_err()
        {
            ctx.anomaly("client.shutdown() did not return within 10 s".into());
        }
        let counts = ctx.counts.lock().unwrap().clone();
        let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("COUNTS {}", summary.join(";").replace(' ', "_"));
        if stuck > 0 {
            3
        } else {
            0
        }
    });
    std::process::exit(code);
}
