//! The public lock layer: the client, the lock handles and what they share, the guards, and
//! whose hold a call is for (the holder id). Everything here is a caller's view; the waiting loop
//! of an acquisition, the state a client keeps per lock and owner field, and its background task
//! are in `engine/`.

pub(crate) mod client;
pub(crate) mod handle;
pub(crate) mod holder;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rw;
