//! [`MultiLock`]: all-or-nothing over several mutexes, and its guard [`MultiGuard`].
//!
//! Invariants, and where they are enforced:
//! * **A returned guard holds every member.** Members are taken one after the other, each under
//!   its client's watchdog whatever lease was asked for, so none can run out while a later one
//!   is awaited; once the last is in, every guard is checked still valid (one lost meanwhile, to
//!   a failover or a force unlock, sends the whole call round again), and only then is a fixed
//!   lease put on each member (re-entered with the lease, the watchdog hold released), counted
//!   from there rather than from each member's own grant (`MultiLock::take`).
//! * **One global order**: by cluster slot of the name, then by name, then by client
//!   (`MultiLock::new` sorts them). Any two multi-locks of fairlock therefore wait for their
//!   common members in the same order, so neither can hold one the other waits for while
//!   waiting for one the other holds: no deadlock, whatever order the caller listed them in.
//!   Redisson's `MultiLock` takes members in its caller's order but gives them all back when
//!   one does not come within its wait and starts again, so it cannot hold ours up for ever
//!   either.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::lock::mutex::LockGuard;
use crate::util::join_all;
use crate::{FairLock, NonFairLock};

/// One member of a [`MultiLock`]: a fair or a non-fair lock handle (of any client).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum MultiMember {
    /// A fair lock (`RFairLock` layout).
    Fair(FairLock),
    /// A non-fair lock (`RLock` layout).
    NonFair(NonFairLock),
}

impl From<FairLock> for MultiMember {
    fn from(lock: FairLock) -> Self {
        MultiMember::Fair(lock)
    }
}

impl From<NonFairLock> for MultiMember {
    fn from(lock: NonFairLock) -> Self {
        MultiMember::NonFair(lock)
    }
}

impl MultiMember {
    /// The member's lock name.
    pub fn name(&self) -> &str {
        match self {
            MultiMember::Fair(l) => l.name(),
            MultiMember::NonFair(l) => l.name(),
        }
    }

    /// The client the member's handle works through.
    fn client_id(&self) -> uuid::Uuid {
        match self {
            MultiMember::Fair(l) => l.handle().client_id(),
            MultiMember::NonFair(l) => l.handle().client_id(),
        }
    }

    /// Takes the member under the watchdog by `deadline` (`None`: for as long as it takes).
    async fn take(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let Some(deadline) = deadline else {
            return match self {
                MultiMember::Fair(l) => l.lock().await,
                MultiMember::NonFair(l) => l.lock().await,
            }
            .map(Some);
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        match self {
            MultiMember::Fair(l) => l.try_lock(wait, None).await,
            MultiMember::NonFair(l) => l.try_lock(wait, None).await,
        }
    }
}

/// Several locks taken together, all or nothing, as Redisson's `RedissonMultiLock` does member by
/// member (each member keeps its own layout, so a Java client sees and contends for each member
/// as the single lock it is).
///
/// Members are taken one after the other **in a global order** (by cluster slot of the name,
/// then by name, then by client), whatever order they were given in, so two `MultiLock`s over
/// overlapping names never deadlock; a Redisson `MultiLock` on overlapping names takes them in
/// its own order but backs off and retries when it cannot get one, so it never deadlocks with
/// ours either. When a member cannot be had in time, those already taken are released before
/// the call returns.
///
/// **A returned guard means every member is held.** While later members are awaited, the ones
/// already taken are kept by their client's watchdog, whatever lease was asked for; once the
/// last is in, every member is checked still held (one lost meanwhile sends the call round
/// again, within its wait), and then a fixed lease is put on each member at once: each is held
/// for the whole lease counted from that moment, just before the call returns, not from its
/// own grant. (Redisson takes members with a longer lease and sets the real one at the end.)
///
/// Each member is its own hold with its own guard (renewed by the watchdog when no lease is
/// given, batched with every other lock of the client); the [`MultiGuard`] is lost as soon as one
/// member is. Members may come from different clients (different deployments), as in Redisson;
/// one name may then be a member twice, once per client, as in Redlock-style use over
/// independent servers. (Two such members whose clients reach the *same* server wait for each
/// other: `lock()` never returns and `try_lock` runs out its wait.) A name listed twice for one
/// client is refused.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let both = fairlock::MultiLock::new([
///     client.fair_lock("account:17").into(),
///     client.fair_lock("account:4").into(),
/// ]);
/// if let Some(guard) = both.try_lock(Duration::from_secs(2), None).await? {
///     // ... move money between the two accounts ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RedissonMultiLock")]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct MultiLock {
    /// In the order they are taken.
    members: Vec<MultiMember>,
}

impl MultiLock {
    /// A multi-lock over `members`, which it sorts into the global order. No I/O; an empty
    /// list, or a name given twice for one client, is reported by the first operation.
    pub fn new(members: impl IntoIterator<Item = MultiMember>) -> Self {
        let mut members: Vec<MultiMember> = members.into_iter().collect();
        members.sort_by(|a, b| {
            let (an, bn) = (a.name(), b.name());
            crate::keys::slot(an)
                .cmp(&crate::keys::slot(bn))
                .then_with(|| an.cmp(bn))
                .then_with(|| a.client_id().cmp(&b.client_id()))
        });
        MultiLock { members }
    }

    /// The members, in the order they are taken.
    pub fn members(&self) -> &[MultiMember] {
        &self.members
    }

    fn check(&self) -> Result<()> {
        if self.members.is_empty() {
            return Err(Error::invalid_argument(
                "members",
                "a multi-lock needs at least one lock",
            ));
        }
        // Sorted by name, then client: a name listed twice for one client is adjacent.
        if let Some(pair) = self.members.windows(2).find(|pair| {
            pair[0].name() == pair[1].name() && pair[0].client_id() == pair[1].client_id()
        }) {
            return Err(Error::invalid_argument(
                "members",
                format!(
                    "lock {:?} is listed twice for one client (each member is its own hold: it \
                     would wait for itself)",
                    pair[0].name()
                ),
            ));
        }
        Ok(())
    }

    /// Takes every member, waiting for as long as it takes; each renewed by its client's
    /// watchdog.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no members or a name listed twice, and whatever a member's
    /// `lock` returns (the members already taken are released first).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, the members taken so far are released in the background and
    /// the member being waited for is given up, as each member's own call is cancel safe.
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.take(None, None).await.map(|g| g.expect("no deadline"))
    }

    /// Takes every member with a fixed `lease` each (never renewed), counted from the moment the
    /// last member is in (see the type's documentation).
    ///
    /// # Errors
    /// As [`lock`](Self::lock), and [`Error::InvalidArgument`] for a bad lease.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiGuard> {
        self.take(None, Some(lease))
            .await
            .map(|g| g.expect("no deadline"))
    }

    /// Takes every member within `wait` in all (`lease`: `None` for the watchdog, or a fixed
    /// lease each); `Ok(None)` when some member could not be had in time, in which case nothing
    /// is held when it returns.
    ///
    /// # Errors
    /// As [`lock_with_lease`](Self::lock_with_lease).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<MultiGuard>> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid_argument("wait", "too long"))?;
        self.take(Some(deadline), lease).await
    }

    /// Takes every member under the watchdog, checks they are all still held, then puts the
    /// fixed lease on them (see the module documentation). A round whose members did not all
    /// survive it is given back and tried again after a backoff, within the deadline.
    async fn take(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<Option<MultiGuard>> {
        self.check()?;
        crate::engine::validity::Lease::new(lease)?;
        let mut rounds: u32 = 0;
        loop {
            let mut guards = Vec::with_capacity(self.members.len());
            for member in &self.members {
                match member.take(deadline).await {
                    Ok(Some(guard)) => guards.push(guard),
                    outcome => {
                        // Failures are logged there; the call reports why it stopped.
                        let _ = release_all(guards).await;
                        return outcome.map(|_| None);
                    }
                }
            }
            let held = if guards.iter().any(LockGuard::is_lost) {
                // A member was lost while a later one was awaited (a failover, a force unlock,
                // renewals that failed): the guard would not hold it. Everything goes back.
                let _ = release_all(guards).await;
                None
            } else {
                match lease {
                    Some(lease) => fixed_leases(guards, lease).await?,
                    None => Some(guards),
                }
            };
            if let Some(guards) = held {
                return Ok(Some(MultiGuard { guards }));
            }
            tracing::debug!("a multi-lock member was lost before the last was taken; trying again");
            rounds = rounds.saturating_add(1);
            let mut pause = crate::retry::retry_backoff(rounds);
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Ok(None);
                }
                pause = pause.min(d - now);
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// Puts a fixed `lease` on members taken under the watchdog, all at once: each is re-entered
/// with the lease (a hold counted from now), then its watchdog hold is released, which sets the
/// lock's TTL to what the fixed hold needs. Returns the fixed-lease guards, or `None` when a
/// member turned out lost (nothing is held then); on an error, nothing is held either.
async fn fixed_leases(watchdog: Vec<LockGuard>, lease: Duration) -> Result<Option<Vec<LockGuard>>> {
    let members = watchdog.len();
    let fixed = join_all(watchdog.iter().map(|g| g.reenter(Some(lease)))).await;
    let released = join_all(watchdog.into_iter().map(LockGuard::unlock)).await;
    let mut guards = Vec::with_capacity(members);
    let mut first_error = None;
    for taken in fixed {
        match taken {
            Ok(guard) => guards.push(guard),
            // Lost meanwhile: no guard of it, so the round is lost.
            Err(e) if e.is_not_held() => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    for outcome in released {
        match outcome {
            // Lost before its release: the round is lost if its new hold is too (seen below).
            Ok(()) | Err(Error::NotHeld) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        let _ = release_all(guards).await;
        return Err(e);
    }
    if guards.len() < members || guards.iter().any(LockGuard::is_lost) {
        let _ = release_all(guards).await;
        return Ok(None);
    }
    Ok(Some(guards))
}

/// Releases `guards` in the reverse of the order they were taken; the first error.
async fn release_all(guards: Vec<LockGuard>) -> Result<()> {
    let mut first = Ok(());
    for guard in guards.into_iter().rev() {
        let name = guard.name().to_owned();
        if let Err(e) = guard.unlock().await {
            if !e.is_not_held() {
                tracing::warn!(lock = %name, error = %crate::error::chain(&e), "multi-lock member release failed");
            }
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// Every member of a [`MultiLock`], held. Release with [`unlock`](Self::unlock); dropped, each
/// member is released in the background as a dropped [`LockGuard`] is.
#[derive(Debug)]
#[must_use = "dropping the guard releases every member at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The members' guards, in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The members' guards, to release or watch one by one (in the order they were taken).
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// Whether some member is known to be lost (no I/O).
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves as soon as any member is lost, with its reason (see [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> LostReason {
        let mut watching: Vec<Pin<Box<dyn Future<Output = LostReason> + Send + '_>>> = self
            .guards
            .iter()
            .map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = LostReason> + Send + '_>>)
            .collect();
        std::future::poll_fn(|cx| {
            for f in watching.iter_mut() {
                if let Poll::Ready(reason) = f.as_mut().poll(cx) {
                    return Poll::Ready(reason);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Releases every member (in the reverse of the order they were taken), each even when
    /// another failed.
    ///
    /// # Errors
    /// The first member's error (e.g. [`Error::NotHeld`] for a member that was lost).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, the members not yet released are released in the
    /// background.
    pub async fn unlock(self) -> Result<()> {
        release_all(self.guards).await
    }
}
