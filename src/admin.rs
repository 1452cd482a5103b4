//! Operators' repairs of a fair lock, on any Redis connection: what the `fairlock` command-line
//! tool's `force-unlock` and `purge-dead` run.
//!
//! Each is one script, so it judges and removes in one atomic step, by the same "looks dead"
//! rule inspection reports with ([`QueuedWaiter::dead_reason`](crate::QueuedWaiter::dead_reason)),
//! and reports exactly what it removed and whom it woke.
//!
//! ```no_run
//! # async fn demo() -> fairlock::Result<()> {
//! use fairlock::admin::{self, Announce};
//! let client = fairlock::redis::Client::open("redis://127.0.0.1:6379")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! if let Some(purged) = admin::purge_dead(&mut conn, "orders", Announce::Classic).await? {
//!     for waiter in &purged.removed {
//!         println!("removed {} ({})", waiter.field, waiter.reason.code());
//!     }
//! }
//! # Ok(()) }
//! ```

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::keys::{self, LockKeys};
use crate::state::DeadReason;
use crate::wire;

/// How a wake-up is published: as the lock's clients listen (see
/// [`PubSubMode`](crate::PubSubMode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Announce {
    /// `PUBLISH`: a single server, Sentinel, or a cluster using classic pub/sub.
    Classic,
    /// `SPUBLISH`: a Redis 7+ cluster using sharded pub/sub.
    Sharded,
    /// Both, for a cluster whose clients may use either.
    Both,
}

impl Announce {
    fn commands(self) -> &'static [&'static str] {
        match self {
            Announce::Classic => &["PUBLISH"],
            Announce::Sharded => &["SPUBLISH"],
            Announce::Both => &["SPUBLISH", "PUBLISH"],
        }
    }
}

/// A queued waiter removed because it looked dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadWaiter {
    /// Its owner field, `<client id>:<holder id>`.
    pub field: String,
    /// Why it looked dead.
    pub reason: DeadReason,
}

/// What [`force_unlock`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForceUnlocked {
    /// The owner fields the lock had, with their hold counts.
    pub owners: Vec<(String, u64)>,
    /// Dead waiters dropped from the head of the queue.
    pub dropped: Vec<DeadWaiter>,
    /// The live head of the queue that was told the lock is free, if any.
    pub woken: Option<String>,
    /// Receivers of the release message on the lock's channel (non-fair waiters, Redisson's).
    pub release_receivers: u64,
    /// Receivers on the woken head's own channel.
    pub woken_receivers: u64,
}

/// What [`purge_dead`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Every waiter removed, wherever it stood in the queue.
    pub removed: Vec<DeadWaiter>,
    /// The new head that was told the lock is free (only when the lock is free), if any.
    pub woken: Option<String>,
    /// Receivers on its channel.
    pub woken_receivers: u64,
    /// Waiters still queued.
    pub queue_length: u64,
    /// Whether the lock is held.
    pub locked: bool,
}

/// Deletes the lock `name` whoever holds it (a read-write lock's hash too), drops the dead
/// waiters at the head of its queue, and tells the live head (and non-fair waiters) that it is
/// free. `None` when the lock was not held (nothing is changed). The holder is not told: its
/// next renewal finds the lock gone.
///
/// # Errors
/// [`Error::InvalidName`](crate::Error::InvalidName) for a name no lock can have;
/// [`Error::Redis`](crate::Error::Redis) when the script could not run.
///
/// # Cancel safety
/// The script runs atomically once sent; dropping the future may lose only its report.
pub async fn force_unlock<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &str,
    announce: Announce,
) -> Result<Option<ForceUnlocked>> {
    keys::validate(name, false)?;
    let lock = LockKeys::new(name);
    let (deleted, owners, dropped, head, on_release, on_head) =
        wire::admin::force_unlock(conn, &lock, announce.commands()).await?;
    if deleted == 0 {
        return Ok(None);
    }
    Ok(Some(ForceUnlocked {
        owners: owners
            .chunks(2)
            .filter_map(|pair| match pair {
                [field, count] => Some((field.clone(), count.parse().unwrap_or(0))),
                _ => None,
            })
            .collect(),
        dropped: dead_waiters(dropped),
        woken: (!head.is_empty()).then_some(head),
        release_receivers: on_release.max(0) as u64,
        woken_receivers: on_head.max(0) as u64,
    }))
}

/// Removes every queued waiter of the fair lock `name` that looks dead, wherever it stands, and
/// when the lock is free tells the new head it may take it. `None` when there is neither a lock
/// nor a queue of that name. Unlike a give-up it does not shift the deadlines of those behind:
/// they only become more patient.
///
/// # Errors
/// [`Error::InvalidName`](crate::Error::InvalidName) for a name no lock can have;
/// [`Error::Redis`](crate::Error::Redis) when the script could not run.
///
/// # Cancel safety
/// The script runs atomically once sent; dropping the future may lose only its report.
pub async fn purge_dead<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &str,
    announce: Announce,
) -> Result<Option<Purged>> {
    keys::validate(name, false)?;
    let lock = LockKeys::new(name);
    let (removed, told, receivers, queue_length, held, had_queue) =
        wire::admin::purge_dead(conn, &lock, announce.commands()).await?;
    if had_queue == 0 && held == 0 {
        return Ok(None);
    }
    Ok(Some(Purged {
        removed: dead_waiters(removed),
        woken: (!told.is_empty()).then_some(told),
        woken_receivers: receivers.max(0) as u64,
        queue_length: queue_length.max(0) as u64,
        locked: held == 1,
    }))
}

/// `{field, reason code, ...}` as the scripts reply it.
fn dead_waiters(flat: Vec<String>) -> Vec<DeadWaiter> {
    flat.chunks(2)
        .filter_map(|pair| match pair {
            [field, code] => Some(DeadWaiter {
                field: field.clone(),
                reason: DeadReason::from_code(code)?,
            }),
            _ => None,
        })
        .collect()
}
