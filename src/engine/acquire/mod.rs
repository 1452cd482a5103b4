//! The waiting engine behind `lock()` and `try_lock()`: attempts, pub/sub wake-ups, deadlines and
//! the cleanup a dropped future leaves to the driver.
//!
//! One acquisition is a loop of attempts. The first attempt runs without a subscription (the
//! uncontended path costs exactly one round trip) unless our channel is still subscribed from a
//! recent wait; if it queues us unsubscribed, we subscribe and attempt again before ever sleeping,
//! so a release between the first attempt and the subscription cannot be missed. After that we
//! sleep until a message, the hint the script gave (the lock's TTL when we are the head: nobody
//! announces an expiry), our deadline, or a shutdown.
//!
//! Every attempt runs with the turn of the lock's owner field (`engine/field/`): it takes its place in
//! the field's line synchronously, before its first await, so whatever this holder left to the
//! background earlier (a dropped guard's release, a cancelled wait's give-up) reaches Redis first.
//! The attempt is a boxed future polled by the caller's future; if the caller drops it while one
//! is in flight, the attempt itself (turn included) is handed to the driver, which runs it to its
//! end and releases a lock granted too late or leaves the queue: no I/O in `Drop`, no task spawned
//! on the normal path, and nothing is left behind.
//!
//! This module must never: register a grant without the field's turn, return later than its wait
//! plus one round trip while Redis answers, or keep a grant made after shutdown.

mod call;
mod outage;
mod settle;
mod wait;

pub(crate) use call::{reenter, Handle};
