//! Holder identity: whose hold an acquisition is for.
//!
//! The invariant this module keeps: **two acquisition calls share a hold only when the caller
//! asked them to.** By default every call gets a holder id of its own, so any two calls exclude
//! each other, whether they run in one task (`join!`, `select!`), in several tasks, threads or
//! processes. A call re-enters an existing hold only through a [`Holder`] the caller passes on
//! purpose (or a guard's [`reenter`](crate::LockGuard::reenter)).
//!
//! A call's own id is freshly minted, or the id of an ended call of the same client on the same
//! lock that left nothing behind and whose id no guard showed to the user
//! (`Helds::reuse_holder`): its waiter channel is then still subscribed, which saves a waiting
//! call a subscription. Two calls that run at the same time never share an id.
//!
//! Minted ids are negative and come from one process-wide counter (`engine/inner.rs`
//! `mint_holder_id`), so they are unique within
//! every client of the process (a [`RedLock`](crate::RedLock) uses one id on several clients).
//! Raw ids, for interop and inspection, are the non-negative ones: a minted value never equals a
//! raw one.

use crate::error::{Error, Result};

/// Minted holder ids count down from -1 (never 0 or positive: those are raw ids).
/// A holder: the second half of the owner field `<client uuid>:<holder id>` a hold is recorded
/// under in Redis.
///
/// Every acquisition call without a holder is its own holder, so two calls never share a hold by
/// accident (this is what makes the futures of one task exclude each other, as with
/// `tokio::sync::Mutex`). To make several calls **one** reentrant holder, mint a `Holder` with
/// [`Client::holder`](crate::Client::holder) and hand it to
/// [`FairLock::with_holder`](crate::FairLock::with_holder) /
/// [`NonFairLock::with_holder`](crate::NonFairLock::with_holder) wherever those calls run: in one task, in
/// other tasks, in other threads. Their guards are holds on one owner field; the lock is free
/// again when the last of them is released, and Java sees Redisson's reentrant count.
///
/// A `Holder` is a plain value (`Copy`), cheap to pass around; it does no I/O and holds nothing
/// by itself.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let me = client.holder();
/// let lock = client.fair_lock("orders:42").with_holder(me);
/// let outer = lock.lock().await?;
/// let inner = lock.lock().await?; // the same holder: re-enters at once, count 2
/// drop(inner);
/// outer.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder(i64);

impl Holder {
    /// A new holder id, never handed out before in this process (a negative number).
    pub(crate) fn mint() -> Holder {
        Holder(crate::engine::field::mint_holder_id())
    }

    /// The holder whose id was read back from an owner field this client built.
    pub(crate) fn from_field_id(id: i64) -> Holder {
        Holder(id)
    }

    /// A holder with the raw id `id`, for interop and inspection: for example to act under an
    /// owner field whose holder half is known, such as a Java thread id. Raw ids are the
    /// non-negative numbers; minted holders never use them, so a raw holder never re-enters a
    /// minted one's hold by chance. Two raw holders with the same id on the same client **are**
    /// the same holder.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative `id` (the minted range).
    pub fn from_raw(id: i64) -> Result<Holder> {
        if id < 0 {
            return Err(Error::invalid_argument(
                "holder",
                format!("raw holder ids are non-negative (negative ones are minted); got {id}"),
            ));
        }
        Ok(Holder(id))
    }

    /// The holder id: the second half of the owner field `<client uuid>:<id>`.
    pub fn id(self) -> i64 {
        self.0
    }

    /// Whether the id was minted by this library (negative) rather than given raw.
    pub fn is_minted(self) -> bool {
        self.0 < 0
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Holder;

    #[test]
    fn minted_holders_are_unique_and_never_raw() {
        let a = Holder::mint();
        let b = Holder::mint();
        assert_ne!(a, b);
        assert!(a.is_minted() && b.is_minted());
        let other_thread = std::thread::spawn(Holder::mint).join().unwrap();
        assert!(other_thread.is_minted());
        assert_ne!(other_thread, a);
        assert_ne!(other_thread, b);
    }

    #[test]
    fn raw_ids_are_the_non_negative_ones() {
        assert_eq!(Holder::from_raw(0).unwrap().id(), 0);
        assert_eq!(Holder::from_raw(7).unwrap().id(), 7);
        assert!(!Holder::from_raw(i64::MAX).unwrap().is_minted());
        assert!(Holder::from_raw(-1).unwrap_err().is_invalid_input());
    }
}
