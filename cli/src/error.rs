//! Why a command failed, and the exit code each reason maps to (documented in README.md).
//! Every failure is reported as one line; nothing here panics.

use std::fmt;
use std::process::ExitCode;

use serde::Serialize;

/// Exit code: the command did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: no such lock (nothing to inspect, unlock or purge).
pub const EXIT_NOT_FOUND: u8 = 1;
/// Exit code: bad arguments or input (clap uses 2 for its own usage errors as well).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: Redis could not be reached or answered with an error.
pub const EXIT_REDIS: u8 = 3;
/// Exit code: the confirmation prompt was declined.
pub const EXIT_DECLINED: u8 = 4;
/// Exit code: a bug in fairlock (reported as one line, never a backtrace).
pub const EXIT_INTERNAL: u8 = 70;

#[derive(Debug)]
pub enum Failure {
    NotFound(String),
    Usage(String),
    Redis(String),
    Declined(String),
    /// Standard output was closed by its reader: end quietly.
    BrokenPipe,
    Internal(String),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::NotFound(_) => EXIT_NOT_FOUND,
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Redis(_) => EXIT_REDIS,
            Failure::Declined(_) => EXIT_DECLINED,
            Failure::BrokenPipe => EXIT_OK,
            Failure::Internal(_) => EXIT_INTERNAL,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Failure::NotFound(_) => "not_found",
            Failure::Usage(_) => "usage",
            Failure::Redis(_) => "redis",
            Failure::Declined(_) => "declined",
            Failure::BrokenPipe => "broken_pipe",
            Failure::Internal(_) => "internal",
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code())
    }

    pub fn from_io(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::BrokenPipe
        } else {
            Failure::Internal(format!("cannot write to standard output: {e}"))
        }
    }

    pub fn redis(context: &str, e: impl fmt::Display) -> Failure {
        Failure::Redis(format!("{context}: {}", one_line(&e.to_string())))
    }

    /// The `--json` form of the failure, printed on standard output.
    pub fn to_json(&self) -> ErrorJson {
        ErrorJson {
            error: ErrorBody {
                kind: self.kind(),
                message: self.to_string(),
                exit_code: self.code(),
            },
        }
    }
}

#[derive(Serialize)]
pub struct ErrorJson {
    error: ErrorBody,
}

#[derive(Serialize)]
struct ErrorBody {
    kind: &'static str,
    message: String,
    exit_code: u8,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NotFound(m)
            | Failure::Usage(m)
            | Failure::Redis(m)
            | Failure::Declined(m)
            | Failure::Internal(m) => f.write_str(&one_line(m)),
            Failure::BrokenPipe => f.write_str("standard output was closed"),
        }
    }
}

/// The library's errors: bad input is a usage error, anything else comes from Redis.
impl From<fairlock::Error> for Failure {
    fn from(e: fairlock::Error) -> Failure {
        if e.is_invalid_input() {
            Failure::Usage(one_line(&e.to_string()))
        } else {
            Failure::Redis(one_line(&e.to_string()))
        }
    }
}

impl Failure {
    /// A library call that failed: bad input is a usage error; otherwise the Redis error behind
    /// it (the library's message does not repeat its source) after `context`.
    pub fn library(context: &str, e: fairlock::Error) -> Failure {
        if e.is_invalid_input() {
            return Failure::Usage(one_line(&e.to_string()));
        }
        match std::error::Error::source(&e) {
            Some(cause) => Failure::redis(context, cause),
            None => Failure::redis(context, e),
        }
    }
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Failure {
        Failure::Redis(format!("redis error: {}", one_line(&e.to_string())))
    }
}

/// Collapses a multi-line message (some Redis errors carry several lines) into one.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
