//! [`ServerAddr`]: what names a Redis server for the builder and `Client::connect`.

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};

/// A Redis server's address and settings, as the builder and
/// [`Client::connect`](crate::Client::connect) take them: every type redis-rs takes as a
/// connection info (a URL as `&str` or `String`, a [`ConnectionInfo`], a [`ConnectionAddr`], a
/// `(host, port)` pair), and a `&String`, which redis-rs does not take.
///
/// The `redis` crate here is the one fairlock re-exports ([`fairlock::redis`](crate::redis)). An
/// application on another redis-rs line cannot pass its own `ConnectionInfo` (two `redis`
/// crates): it passes a URL, or builds the `ConnectionInfo` from `fairlock::redis`.
pub trait ServerAddr {
    /// The connection info, or why it cannot be one (a malformed URL).
    fn into_connection_info(self) -> RedisResult<ConnectionInfo>;
}

macro_rules! through_redis {
    ($($ty:ty),*) => {
        $(
            impl ServerAddr for $ty {
                fn into_connection_info(self) -> RedisResult<ConnectionInfo> {
                    IntoConnectionInfo::into_connection_info(self)
                }
            }
        )*
    };
}

through_redis!(ConnectionInfo, ConnectionAddr, &str, String);

impl ServerAddr for &String {
    fn into_connection_info(self) -> RedisResult<ConnectionInfo> {
        IntoConnectionInfo::into_connection_info(self.as_str())
    }
}

impl<T: Into<String>> ServerAddr for (T, u16) {
    fn into_connection_info(self) -> RedisResult<ConnectionInfo> {
        IntoConnectionInfo::into_connection_info(self)
    }
}
