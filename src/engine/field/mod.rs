//! What a client knows about one lock and one of its owner fields (`<client uuid>:<holder id>`):
//! the order of its operations on Redis, how many holds Redis has for the field, which local
//! guards those holds belong to, until when they can be trusted, and who must be told when they
//! cannot.
//!
//! # The ordering rule
//!
//! Every operation that changes what Redis holds for the field (an acquire attempt, a release, a
//! give-up, settling an attempt whose caller left, the release at shutdown) runs with the turn of
//! the field's [`Lane`], one at a time, in the order the client issued them. A dropped guard or
//! waiting future takes its place in that order **synchronously, in `Drop`**, even though its
//! work runs later in the background; so `drop(guard); lock.lock().await` reaches Redis exactly as
//! `guard.unlock().await; lock.lock().await` does, on any runtime flavour, and a cancelled wait
//! leaves the queue before the same holder's next attempt joins it again.
//!
//! # The count
//!
//! Because nothing else of ours runs on the field between two operations, the hold count every
//! script replies with is the truth until the next one ([`Account::count`]). Each script is a
//! compare-and-set on that count (`lua/*acquire.lua`, `lua/*unlock.lua`): an attempt whose reply
//! was lost is taken up by the next attempt instead of adding a second hold, and a release sent
//! twice releases once. When Redis shows fewer holds than we count (the lock expired, was
//! force-unlocked or lost in a failover), the holds of that generation are gone: the
//! generation changes and its guards never send a release that could eat a newer hold.
//!
//! # Holds with different leases
//!
//! One rule for every mix of watchdog and fixed-lease holds of one holder on one lock: the lock
//! lives as long as the longest live hold needs it (acquisitions and renewals never shorten its
//! TTL; the last of the releases waiting in its line sets it to what the remaining holds need),
//! the watchdog renews it while any watchdog hold lives, and the holds share one fate: every
//! guard's `lost()` resolves when the lock can no longer be trusted for the holds that are live,
//! at the latest when the longest of them runs out. When the last local guard goes, every hold of the field is released (orphans of lost
//! replies included), so the lock is free.
//!
//! This module must never: send a release for a hold of an older generation, let a release or
//! give-up queued by `Drop` run after an operation its task issued later, or move a validity
//! deadline past a moment at which the guards were already lost without marking them lost first.
//! The last is kept by the deadline's cell (`DeadlineCell`, below), not by timing: a guard that finds the
//! deadline passed marks it so in the cell, a move replaces only the value it read, and a guard
//! is registered (check, new deadline, epoch) in one step under the lane's mutex at one instant.
//!
//! # Where things are
//!
//! `held.rs` is what the field is and how calls and grants enter it: [`Held`] (one lock and owner
//! field, with its account in its lane), the client's registry of fields and holders
//! ([`Helds`]), the account, the events of a call and a grant, and the cell of the validity
//! deadline with the losses live guards may ask about. `ends.rs` is how holds leave it: guards
//! detached, releases and give-ups, replies lost, counts learned, renewals answered, losses and
//! generations. Nothing outside `field/` writes the account. Unit tests: `tests.rs`.

mod ends;
mod held;
#[cfg(test)]
mod tests;

pub(crate) use held::{mint_holder_id, next_id, FieldTurn, Held, Helds, HoldRef, Registered, What};
