//! Connections to Redis: the command connection over every topology (`command.rs`), following a
//! Sentinel-managed master (`sentinel.rs`), and the client's one pub/sub connection
//! (`subscriber/`).

mod command;
pub(crate) mod names;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod subscriber;

#[cfg(feature = "cluster")]
pub(crate) use command::Pushes;
pub(crate) use command::{Conn, PubSubLink, ScriptCall};
