//! The backoff policy after a transient failure (a dropped connection, a timeout, a failover in
//! progress), shared by waiting calls and releases. What is safe to repeat is decided by the
//! caller; this only says how long to pause. It must never sleep
//! more than a second at a time, so callers re-check their deadlines often.

use std::time::Duration;

/// Pause before retry `n` (1-based) after a transient failure: 25 ms doubling up to 1 s.
pub(crate) fn retry_backoff(n: u32) -> Duration {
    Duration::from_millis(25u64 << n.saturating_sub(1).min(6)).min(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_second() {
        let pauses: Vec<u64> = (1..=8)
            .map(|n| retry_backoff(n).as_millis() as u64)
            .collect();
        assert_eq!(pauses, vec![25, 50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(retry_backoff(0), Duration::from_millis(25));
    }
}
