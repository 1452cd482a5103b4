//! Client configuration: the builder, its defaults and its validation.
//!
//! It must never do I/O: every setting is checked by `validate()`, with a typed error, before a
//! client connects (`Builder::build` lives in `lock/client.rs`).

mod builder;
#[cfg(feature = "serde")]
mod file;
mod settings;
mod target;
mod topology;

pub use builder::Builder;
#[cfg(feature = "serde")]
pub use file::{ClientConfig, SentinelConfig};
pub use settings::*;
pub use target::ServerAddr;
pub(crate) use topology::Topology;
