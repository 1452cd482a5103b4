//! The engine under the handles: the state a client shares, what it knows about each lock and
//! owner field (the account and the field's line), releases, validity, the permits of expirable
//! semaphores in use (`permit`), and the driver task.
//! The only layer whose files may import each other in a cycle (docs/ARCHITECTURE.md).

pub(crate) mod acquire;
pub(crate) mod driver;
pub(crate) mod field;
pub(crate) mod hold;
pub(crate) mod inner;
pub(crate) mod lane;
pub(crate) mod lifecycle;
pub(crate) mod outage;
pub(crate) mod permit;
pub(crate) mod release;
pub(crate) mod validity;
pub(crate) mod wait;
