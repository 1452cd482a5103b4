//! Default holder ids: who "the same holder" is when the caller does not say.
//!
//! It must never hand a thread an id a tokio task could also get (task ids are positive, thread
//! ids negative).

use std::sync::atomic::{AtomicI64, Ordering};

/// Ids for threads outside any tokio task count down from -1, so they can never collide with tokio
/// task ids (which are positive).
static NEXT_THREAD_HOLDER: AtomicI64 = AtomicI64::new(-1);

thread_local! {
    static THREAD_HOLDER: i64 = NEXT_THREAD_HOLDER.fetch_sub(1, Ordering::Relaxed);
}

/// The holder id of the caller: the current tokio task's id inside a task, else a per-thread id.
pub(crate) fn current() -> i64 {
    if let Some(id) = tokio::task::try_id() {
        // tokio task ids are process-wide, non-zero u64 counters; Display prints the number.
        if let Ok(n) = id.to_string().parse::<i64>() {
            return n;
        }
    }
    THREAD_HOLDER.with(|id| *id)
}

#[cfg(test)]
mod tests {
    use super::current;

    #[test]
    fn threads_get_distinct_negative_ids() {
        let here = current();
        let there = std::thread::spawn(current).join().unwrap();
        assert!(here < 0 && there < 0);
        assert_ne!(here, there);
        assert_eq!(here, current());
    }

    #[tokio::test]
    async fn tasks_get_distinct_positive_ids() {
        let a = tokio::spawn(async { current() }).await.unwrap();
        let b = tokio::spawn(async { current() }).await.unwrap();
        assert!(a > 0 && b > 0);
        assert_ne!(a, b);
    }
}
