//! [`RedLock`]: one lock over several independent Redis masters (the Redlock algorithm).
//!
//! Composed from existing pieces, not a second engine: on every master the lock is the non-fair
//! [`NonFairLock`](crate::NonFairLock) in Redisson's `RLock` layout, taken with a zero wait through that
//! master's own [`Client`]. This module only adds the majority rule, the validity window, the
//! retry loop and the guard that watches a majority of per-master guards. Renewal, background
//! release, lost-lock notification and cancel safety are the per-master guards' own.
//!
//! It must never count one deployment twice towards the majority, or hand out a guard whose
//! validity window has already run out.

use std::future::{poll_fn, Future};
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::engine::validity::drift;
use crate::engine::validity::lease_ms;
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::lock::client::Client;
use crate::lock::holder::Holder;
use crate::lock::mutex::LockGuard;
use crate::util::join_all;

/// Fixed part of the default per-master timeout (plus 1 % of the lease).
const NODE_TIMEOUT_BASE: Duration = Duration::from_millis(50);
/// Default upper bound of the jittered pause between two acquisition rounds.
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Lower bound of that pause (when the remaining wait allows it).
const RETRY_DELAY_MIN: Duration = Duration::from_millis(10);

/// A reentrant distributed lock over `N` **independent** Redis masters, held when a majority of
/// them (`N/2 + 1`) granted it within its validity window: the Redlock algorithm.
///
/// # The guarantee
///
/// * **Majority**: an acquisition asks every master at once, each bounded by a
///   [per-master timeout](Self::node_timeout), for the non-fair `RLock` hash under the same name
///   and owner field (`<client uuid>:<holder id>` of that master's client). It succeeds when at
///   least `N/2 + 1` masters granted it **and** the validity left, `lease − elapsed − drift`, is
///   still positive, where `elapsed` is measured from before the first request was sent and
///   `drift = lease / 100 + 2 ms`. Otherwise every grant it got is released again and, within the
///   wait, it tries again after a short random pause.
/// * **Mutual exclusion** between `RedLock`s on the same name over the **same** set of masters,
///   for [`validity`](RedLockGuard::validity), under the assumptions listed below. Two majorities
///   of one set always share a master, and a master grants the hash to one owner field at a time.
/// * **Fault tolerance**: up to `N − (N/2 + 1)` masters may be down, slow or partitioned (1 of 3,
///   2 of 5) and the lock still works.
/// * **Holders**: every acquisition call is its own holder, so two calls exclude each other
///   (futures of one task included). Re-entry is explicit: calls through a handle given a
///   [`Holder`] ([`with_holder`](Self::with_holder)) share one hold; every master re-enters, and
///   each [`RedLockGuard`] is one hold on each master it got.
/// * **Watchdog**: a lock taken without a lease is renewed on every master by that master's
///   client, as any [`LockGuard`]; the guard is [lost](RedLockGuard::lost) when fewer than a
///   majority of its per-master holds are still trusted.
///
/// # What Redlock does *not* protect against
///
/// * **Clocks**: every master expires its key on its own clock. A master whose clock jumps forward
///   or runs faster than the drift margin (1 % + 2 ms) allows forgets the lock early, and another
///   client can then assemble a majority while the holder still trusts its validity.
/// * **Pauses longer than the validity**: a holder stalled (GC, swap, a stopped VM, a long network
///   delay on its way to the resource) past its validity still believes it holds the lock. Use
///   fencing at the protected resource. Note that tokens from different masters are *not*
///   comparable (each master counts on its own), so fencing across a `RedLock` needs **one**
///   authoritative counter: a single store's `INCR`, the resource's own sequence, or a
///   consensus store. `RedLock` hands out no tokens for that reason.
/// * **Masters that forget**: a master that restarts without persistence (or fails over to a
///   replica that had not received the key yet) comes back without the lock, and with it the
///   majority may pass to someone else before the lease ran out. Delay restarting a crashed master
///   by at least the longest lease in use, or run the masters with AOF and
///   `appendfsync always`. Never put a master and its replica in the same `RedLock`: the masters
///   must be independent.
/// * **Consensus**: this is not a consensus system. Martin Kleppmann argued ("How to do
///   distributed locking") that Redlock's safety rests on timing assumptions (bounded network
///   delay, bounded pauses, bounded clock drift) and that a lock without fencing cannot be safe for
///   correctness; Salvatore Sanfilippo (antirez) replied ("Is Redlock safe?") that these
///   assumptions are reasonable in practice and that the validity check after acquisition covers
///   delays before it. Both agree that a holder paused past its validity needs fencing. Use
///   `RedLock` for efficiency (not doing the same work twice) or together with a fencing check;
///   when correctness must not depend on timing, use a consensus system (ZooKeeper, etcd) with
///   fencing.
///
/// # Cost
///
/// Every attempt is one script call on each of the `N` masters, in parallel, and the acquisition
/// waits for all of them (each bounded by the per-master timeout), so one slow master slows every
/// acquisition down to that timeout. Waiting is polling: rounds are retried after a random pause
/// of 10–50 ms (see [`retry_delay`](Self::retry_delay)), not woken by release messages, and a
/// `RedLock` is not fair. Each master needs its own [`Client`] (connections and a driver task).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// use fairlock::{Client, RedLock};
///
/// let masters = [
///     Client::connect("redis://10.0.0.1:6379").await?,
///     Client::connect("redis://10.0.0.2:6379").await?,
///     Client::connect("redis://10.0.0.3:6379").await?,
/// ];
/// let lock = RedLock::new(masters, "orders:42");
/// if let Some(guard) = lock.try_lock(Duration::from_secs(1), Some(Duration::from_secs(10))).await? {
///     // Trust the lock until guard.valid_until() at the latest.
///     let _deadline = guard.valid_until();
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedLock {
    name: String,
    masters: Vec<Client>,
    /// `None`: every call is its own holder.
    holder: Option<Holder>,
    node_timeout: Option<Duration>,
    retry_delay: Duration,
}

impl RedLock {
    /// A lock named `name` over the masters behind `clients`, one client per independent master.
    /// No I/O. An empty list, or two clients for the same Redis deployment, is reported by the
    /// first operation as [`Error::InvalidArgument`].
    pub fn new(clients: impl IntoIterator<Item = Client>, name: impl Into<String>) -> RedLock {
        RedLock {
            name: name.into(),
            masters: clients.into_iter().collect(),
            holder: None,
            node_timeout: None,
            retry_delay: DEFAULT_RETRY_DELAY,
        }
    }

    /// The lock's name (the Redis key of its owner hash on every master).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many masters the lock spans (`N`).
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// How many masters must grant the lock: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.masters.len())
    }

    /// Makes every call through this handle one holder, on every master, so they re-enter
    /// rather than exclude each other (see [`Holder`]; without it every call is its own holder).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// How long one master may take to answer one attempt before it counts as failed for that
    /// round (its late grant, if any, is released in the background).
    ///
    /// Defaults to 50 ms plus 1 % of the lease (of the watchdog timeout for a lock without a
    /// lease). Keep it well below the lease: the time the slowest master takes is subtracted from
    /// the validity.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The upper bound of the random pause between two acquisition rounds: each pause is uniform
    /// in `[10 ms, max)` (shorter when less of the wait remains), so competing clients do not
    /// retry in lockstep.
    ///
    /// Defaults to 50 ms.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn retry_delay(mut self, max: Duration) -> Self {
        self.retry_delay = max;
        self
    }

    /// Waits as long as it takes, then holds the lock with every master's watchdog renewing it.
    ///
    /// Retries until a majority grants the lock, also while a majority of masters is unreachable
    /// (it never returns [`Error::QuorumNotReached`]; use [`try_lock`](Self::try_lock) to bound
    /// the wait).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], [`Error::InvalidName`], and [`Error::Shutdown`] once too many
    /// of the clients are shut down for a majority to be possible.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the per-master attempts in flight, and each
    /// master's client releases a grant that arrives after that in the background; grants
    /// already received are released the same way.
    pub async fn lock(&self) -> Result<RedLockGuard> {
        self.acquire_unbounded(None).await
    }

    /// Waits as long as it takes, then holds the lock for at most `lease` (never renewed).
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::InvalidArgument`] also for a lease under 3 ms (no
    /// validity would be left after the drift margin) or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<RedLockGuard> {
        self.acquire_unbounded(Some(lease)).await
    }

    /// Tries for at most `wait`; `lease: None` uses the watchdog. `Ok(None)` when `wait` ran out
    /// while the lock was held elsewhere. A zero `wait` makes exactly one round.
    ///
    /// Returns within `wait` plus one round, which is bounded by the
    /// [per-master timeout](Self::node_timeout).
    ///
    /// # Errors
    /// * [`Error::QuorumNotReached`] when `wait` ran out and, in the last round, fewer than a
    ///   majority of masters answered at all (the others failed or timed out): the lock is out of
    ///   reach because masters are unavailable, not because somebody holds it. `acquired` is how
    ///   many masters granted it in that round (released again), `needed` is `N/2 + 1`. When
    ///   enough masters answered but too few granted, the result is `Ok(None)` instead.
    /// * [`Error::InvalidArgument`] for an empty list of masters, two clients of the same Redis
    ///   deployment, a zero per-master timeout or retry delay, a lease under 3 ms or beyond `i64`
    ///   milliseconds; [`Error::InvalidName`].
    /// * [`Error::Shutdown`] when too many of the clients are shut down for a majority.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<RedLockGuard>> {
        self.acquire(Some(wait), lease).await
    }

    /// Deletes the lock on every master whoever holds it. Returns whether any master had it.
    ///
    /// # Errors
    /// The first master's error when fewer than a majority of masters answered (the lock may then
    /// still be held on a majority); [`Error::InvalidArgument`], [`Error::InvalidName`].
    ///
    /// # Cancel safety
    /// The deletes may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.check_masters()?;
        let name = &self.name;
        let replies = join_all(self.masters.iter().map(|c| {
            let lock = c.non_fair_lock(name.clone());
            async move { lock.force_unlock().await }
        }))
        .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let any = replies.iter().any(|r| matches!(r, Ok(true)));
        if answered >= self.quorum() {
            return Ok(any);
        }
        Err(first_error(replies))
    }

    /// Whether a majority of masters report the lock held (by anyone).
    ///
    /// # Errors
    /// The first master's error when the masters that could not be asked could have changed the
    /// answer; [`Error::InvalidArgument`], [`Error::InvalidName`].
    ///
    /// # Cancel safety
    /// Cancel safe (reads).
    pub async fn is_locked(&self) -> Result<bool> {
        self.check_masters()?;
        let name = &self.name;
        let replies = join_all(self.masters.iter().map(|c| {
            let lock = c.non_fair_lock(name.clone());
            async move { lock.is_locked().await }
        }))
        .await;
        let held = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let quorum = self.quorum();
        if held >= quorum || held + failed < quorum {
            return Ok(held >= quorum);
        }
        Err(first_error(replies))
    }

    /// Rejects what no round could fix: no masters, or one deployment listed twice (its grants
    /// would count twice towards the majority).
    fn check_masters(&self) -> Result<()> {
        if self.masters.is_empty() {
            return Err(Error::invalid_argument(
                "clients",
                "a RedLock needs at least one master",
            ));
        }
        for (i, a) in self.masters.iter().enumerate() {
            for b in &self.masters[..i] {
                if a.inner
                    .config
                    .topology
                    .same_deployment(&b.inner.config.topology)
                {
                    return Err(Error::invalid_argument(
                        "clients",
                        format!(
                            "two clients point at the same Redis ({:?}); a RedLock needs independent masters",
                            a.inner.config.topology
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<RedLockGuard> {
        match self.acquire(None, lease).await? {
            Some(guard) => Ok(guard),
            None => unreachable!("a wait without a deadline ends only with the lock or an error"),
        }
    }

    /// The Redlock loop: rounds until a majority grants the lock within its validity, the wait
    /// runs out, or no majority is possible any more.
    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<RedLockGuard>> {
        self.check_masters()?;
        // The lease the validity is computed from: a watchdog lock is first granted for the
        // watchdog timeout, and the shortest one among the masters' clients is the safe bound.
        let validity_lease = match lease {
            Some(lease) => {
                lease_ms("lease", lease)?;
                lease
            }
            None => self
                .masters
                .iter()
                .map(|c| c.inner.config.watchdog_timeout)
                .min()
                .expect("checked non-empty"),
        };
        let margin = drift(validity_lease);
        if validity_lease <= margin {
            return Err(Error::invalid_argument(
                "lease",
                format!("{validity_lease:?} leaves no validity after the drift margin {margin:?}"),
            ));
        }
        let node_timeout = self
            .node_timeout
            .unwrap_or(NODE_TIMEOUT_BASE + validity_lease / 100);
        if node_timeout.is_zero() {
            return Err(Error::invalid_argument(
                "node_timeout",
                "a zero per-master timeout fails every attempt",
            ));
        }
        if self.retry_delay.is_zero() {
            return Err(Error::invalid_argument(
                "retry_delay",
                "a zero retry delay would retry in a busy loop",
            ));
        }
        if let Some(wait) = wait {
            if wait.as_millis() > i64::MAX as u128 {
                return Err(Error::invalid_argument(
                    "wait",
                    format!("{wait:?} does not fit in i64 milliseconds"),
                ));
            }
        }
        // Chosen once per call, so every master sees the same holder.
        let holder = self.holder.unwrap_or_else(Holder::mint);
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        let span = tracing::debug_span!(
            "redlock",
            lock = self.name.as_str(),
            masters = self.masters.len(),
            holder = holder.id()
        );
        let attempt = Attempt {
            lock: self,
            holder,
            lease,
            validity_lease,
            node_timeout,
            deadline,
        };
        attempt.run().instrument(span).await
    }
}

/// One acquisition's fixed parameters.
struct Attempt<'a> {
    lock: &'a RedLock,
    holder: Holder,
    /// As asked: `None` is the watchdog.
    lease: Option<Duration>,
    /// The lease the validity is computed from.
    validity_lease: Duration,
    node_timeout: Duration,
    /// `None`: wait for ever.
    deadline: Option<Instant>,
}

/// What one master answered in one round.
enum Node {
    Granted(LockGuard),
    Held,
    Failed(Error),
    TimedOut,
}

impl Attempt<'_> {
    async fn run(self) -> Result<Option<RedLockGuard>> {
        let masters = self.lock.masters.len();
        let quorum = self.lock.quorum();
        let mut jitter = Jitter::new();
        let mut was_reachable = true;
        loop {
            let started = Instant::now();
            let outcomes = self.round().await;
            let elapsed = started.elapsed();
            let (mut granted, mut held, mut failed, mut shut_down) = (0, 0, 0, 0);
            let mut first_failure = None;
            for outcome in &outcomes {
                match outcome {
                    Node::Granted(_) => granted += 1,
                    Node::Held => held += 1,
                    Node::Failed(e) => {
                        // Input errors are the same on every master: no round can succeed.
                        if e.is_invalid_input() {
                            return Err(e.clone());
                        }
                        if e.is_shutdown() {
                            shut_down += 1;
                        }
                        failed += 1;
                        first_failure.get_or_insert_with(|| e.to_string());
                    }
                    Node::TimedOut => {
                        failed += 1;
                        first_failure.get_or_insert_with(|| {
                            format!("no answer within {:?}", self.node_timeout)
                        });
                    }
                }
            }
            // Validity as Redlock defines it: measured from before the first request was sent.
            let margin = drift(self.validity_lease);
            let validity = self.validity_lease.saturating_sub(elapsed + margin);
            tracing::debug!(
                granted,
                held,
                failed,
                ?elapsed,
                ?validity,
                error = first_failure.as_deref(),
                "round"
            );
            if granted >= quorum && !validity.is_zero() {
                let nodes = outcomes
                    .into_iter()
                    .filter_map(|o| match o {
                        Node::Granted(g) => Some(g),
                        _ => None,
                    })
                    .collect();
                tracing::debug!(granted, ?validity, "acquired");
                return Ok(Some(RedLockGuard {
                    name: self.lock.name.clone(),
                    nodes,
                    quorum,
                    valid_until: started + self.validity_lease - margin,
                    fixed_lease: self.lease.is_some(),
                    node_timeout: self.node_timeout,
                }));
            }
            // Not enough: release every grant of this round (in the background; a re-entry by our
            // next round and this release commute, as each is one hold).
            drop(outcomes);
            if shut_down > masters - quorum {
                return Err(Error::Shutdown);
            }
            // Errors alone kept the majority out of reach this round.
            let unreachable = granted + held < quorum;
            if unreachable && was_reachable {
                tracing::warn!(
                    answered = granted + held,
                    needed = quorum,
                    error = first_failure.as_deref().unwrap_or(""),
                    "too few masters answered for a majority; retrying"
                );
            }
            was_reachable = !unreachable;
            let now = Instant::now();
            let mut pause = self.lock.retry_delay;
            if let Some(deadline) = self.deadline {
                if now >= deadline {
                    if unreachable {
                        return Err(Error::QuorumNotReached {
                            acquired: granted,
                            needed: quorum,
                        });
                    }
                    tracing::debug!("wait elapsed");
                    return Ok(None);
                }
                pause = pause.min(deadline - now);
            }
            tokio::time::sleep(jitter.between(RETRY_DELAY_MIN.min(pause), pause)).await;
        }
    }

    /// Asks every master once, in parallel, each bounded by the per-master timeout. A master that
    /// does not answer in time has its attempt dropped: its client then releases a late grant in
    /// the background.
    async fn round(&self) -> Vec<Node> {
        join_all(self.lock.masters.iter().map(|client| {
            let lock = client
                .non_fair_lock(self.lock.name.clone())
                .with_holder(self.holder);
            let (lease, timeout) = (self.lease, self.node_timeout);
            async move {
                match tokio::time::timeout(timeout, lock.try_lock(Duration::ZERO, lease)).await {
                    Ok(Ok(Some(guard))) => Node::Granted(guard),
                    Ok(Ok(None)) => Node::Held,
                    Ok(Err(e)) => Node::Failed(e),
                    Err(_) => Node::TimedOut,
                }
            }
        }))
        .await
    }
}

/// Proof of a [`RedLock`] hold: the per-master [`LockGuard`]s of the masters that granted it.
///
/// Dropping it releases every per-master hold in the background; [`unlock`](Self::unlock)
/// releases them and reports the outcome. Each per-master hold taken without a lease is renewed
/// by its own client's watchdog while the guard lives.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedLockGuard {
    name: String,
    /// One per master that granted the lock (at least `quorum`).
    nodes: Vec<LockGuard>,
    quorum: usize,
    /// Acquisition start + lease − drift.
    valid_until: Instant,
    /// Taken with a lease (never renewed): `valid_until` is the end of the lock.
    fixed_lease: bool,
    /// Bound of one master's answer (as in the acquisition).
    node_timeout: Duration,
}

impl RedLockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// On how many masters this guard holds the lock (at least a majority).
    pub fn masters_held(&self) -> usize {
        self.nodes.len()
    }

    /// Until when the lock can be trusted, on this process's monotonic clock (as
    /// [`LockGuard::valid_until`]): the moment from which fewer than a majority of the
    /// per-master holds are still valid, following the watchdog's renewals on every master; with
    /// a lease, also no later than the start of the acquisition round plus the lease minus the
    /// drift margin (1 % + 2 ms). Once the lock is known [lost](Self::is_lost), a moment no later
    /// than when that was found.
    pub fn valid_until(&self) -> Instant {
        let mut per_master: Vec<Instant> = self.nodes.iter().map(LockGuard::valid_until).collect();
        per_master.sort_unstable_by(|a, b| b.cmp(a));
        // The quorum-th latest: until then a majority is still valid.
        let mut until = per_master
            .get(self.quorum.saturating_sub(1))
            .copied()
            .unwrap_or(self.valid_until);
        if self.fixed_lease {
            until = until.min(self.valid_until);
        }
        if self.is_lost() {
            until = until.min(Instant::now());
        }
        until
    }

    /// How much of the validity window is left: [`valid_until`](Self::valid_until) minus now,
    /// zero once it has passed or the lock is known lost.
    #[deprecated(
        since = "0.2.0",
        note = "use `valid_until()`, an `Instant` like `LockGuard::valid_until`"
    )]
    pub fn validity(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Extends a lock taken with a lease to `lease` from now on every master that still holds it
    /// ([`LockGuard::extend`] on each, at once, each bounded by the node timeout). Succeeds when
    /// a majority extended it; [`valid_until`](Self::valid_until) then moves to the start of the
    /// extension plus `lease` minus the drift margin (never earlier than it was).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lock renewed by the watchdog or a bad lease;
    /// [`Error::NotHeld`] when the lock is known [lost](Self::is_lost) before the extension, or
    /// its validity ran out before a majority answered (a validity that has passed is never
    /// moved on: a lock once read lost stays lost); [`Error::QuorumNotReached`] when fewer than
    /// a majority extended it (the lock keeps its old validity and may well be lost).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the validity as it was (some masters may have
    /// extended the lock, which only keeps it longer there).
    pub async fn extend(&mut self, lease: Duration) -> Result<()> {
        lease_ms("lease", lease)?;
        if !self.fixed_lease {
            return Err(Error::invalid_argument(
                "extend",
                "this lock is renewed by the watchdog; only locks taken with a lease are extended",
            ));
        }
        if self.is_lost() {
            return Err(Error::NotHeld);
        }
        let started = Instant::now();
        let timeout = self.node_timeout;
        let extended = join_all(self.nodes.iter().map(|node| async move {
            matches!(
                tokio::time::timeout(timeout, node.extend(lease)).await,
                Ok(Ok(()))
            )
        }))
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
        if extended < self.quorum {
            return Err(Error::QuorumNotReached {
                acquired: extended,
                needed: self.quorum,
            });
        }
        if Instant::now() >= self.valid_until {
            // Too late: the lock was not to be trusted for a moment, whatever Redis says now.
            return Err(Error::NotHeld);
        }
        let until = started + lease.saturating_sub(drift(lease));
        self.valid_until = self.valid_until.max(until);
        Ok(())
    }

    /// Whether the lock is known lost (cheap, no I/O): fewer than a majority of the per-master
    /// holds are still trusted, or the lock was taken with a lease and its validity has passed.
    pub fn is_lost(&self) -> bool {
        (self.fixed_lease && Instant::now() >= self.valid_until)
            || self.nodes.iter().filter(|g| !g.is_lost()).count() < self.quorum
    }

    /// Resolves once the lock can no longer be trusted: with the [`LostReason`] of the
    /// per-master loss that left fewer than a majority of trusted holds, or with
    /// [`LostReason::LeaseExpired`] when a lease was given and the validity has passed (whichever
    /// comes first). Never resolves while a majority is held and renewed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and awaiting again later still resolves.
    pub async fn lost(&self) -> LostReason {
        // Losses the majority survives: nodes.len() - quorum; one more breaks it.
        let breaking = self.nodes.len() + 1 - self.quorum;
        let mut watching: Vec<_> = self
            .nodes
            .iter()
            .map(|g| Some(Box::pin(g.lost())))
            .collect();
        let mut expiry = self
            .fixed_lease
            .then(|| Box::pin(tokio::time::sleep_until(self.valid_until.into())));
        let mut lost = 0;
        poll_fn(|cx| {
            if let Some(expiry) = expiry.as_mut() {
                if expiry.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(LostReason::LeaseExpired);
                }
            }
            for slot in watching.iter_mut() {
                if let Some(node) = slot {
                    if let Poll::Ready(reason) = node.as_mut().poll(cx) {
                        *slot = None;
                        lost += 1;
                        if lost >= breaking {
                            return Poll::Ready(reason);
                        }
                    }
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Releases the hold on every master, in parallel, and reports the outcome.
    ///
    /// Returns `Ok(())` when a majority of masters (`N/2 + 1`) released cleanly, so that nobody
    /// can mistake the lock for held any more; otherwise the first per-master error in the
    /// masters' order ([`Error::NotHeld`] when the lock had expired or was taken over,
    /// [`Error::Redis`] when a master could not be reached). Holds that failed to release expire
    /// with their lease; the watchdog no longer renews any of them.
    ///
    /// # Cancel safety
    /// Cancel safe: each per-master release is sent from a background task, so dropping the future
    /// still releases every hold exactly once; only the outcome is lost.
    pub async fn unlock(self) -> Result<()> {
        let quorum = self.quorum;
        let replies = join_all(self.nodes.into_iter().map(LockGuard::unlock)).await;
        if replies.iter().filter(|r| r.is_ok()).count() >= quorum {
            return Ok(());
        }
        Err(first_error(replies))
    }
}

/// A strict majority of `masters`.
fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// The first error among `replies` (callers only ask when there is one).
fn first_error<T>(replies: Vec<Result<T>>) -> Error {
    replies
        .into_iter()
        .find_map(|r| r.err())
        .expect("asked only when a reply failed")
}

/// A xorshift64 generator for retry jitter, seeded from a random v4 UUID (no extra crate; the
/// jitter only has to differ between clients, not be unpredictable).
#[derive(Debug)]
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
        // xorshift never leaves zero.
        Jitter((hi ^ lo) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A duration in `[lo, hi)` at microsecond resolution (`hi` when the range is empty).
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi.saturating_sub(lo)).as_micros() as u64;
        if span == 0 {
            return hi;
        }
        lo + Duration::from_micros(self.next() % span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range_and_varies() {
        let mut j = Jitter::new();
        let (lo, hi) = (Duration::from_millis(10), Duration::from_millis(50));
        let samples: Vec<Duration> = (0..1000).map(|_| j.between(lo, hi)).collect();
        assert!(samples.iter().all(|d| *d >= lo && *d < hi));
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(distinct.len() > 500, "{}", distinct.len());
        assert_eq!(j.between(hi, hi), hi);
        assert_eq!(j.between(hi, lo), lo);
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let q: Vec<usize> = (1..=6).map(quorum).collect();
        assert_eq!(q, vec![1, 2, 2, 3, 3, 4]);
    }
}
