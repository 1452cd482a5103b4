//! The public lock layer: the client, the lock handles and what they share, the waiting loop of
//! an acquisition, the guards, and whose hold a call is for (the holder id). Everything here is
//! a caller's view; the state a client keeps per lock and owner field, and its background task,
//! are in `engine/`.

pub(crate) mod client;
pub(crate) mod fair;
pub(crate) mod guard;
pub(crate) mod handle;
pub(crate) mod holder;
pub(crate) mod multi;
pub(crate) mod plain;
pub(crate) mod rw;
