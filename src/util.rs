//! Small helpers that know nothing about locks. They never spawn a task: whatever they run stays
//! in the caller's task.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

/// Polls every future until all are done, in the calling task: no spawn (dropping the join drops
/// every future at once) and no extra crate.
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut all = true;
        for (future, out) in running.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *out = Some(value),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|out| out.expect("every future completed"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn join_all_keeps_order_and_waits_for_every_future() {
        let out = join_all((0..5u64).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(10 * (5 - i))).await;
            i
        }))
        .await;
        assert_eq!(out, vec![0, 1, 2, 3, 4]);
        assert!(join_all(Vec::<std::future::Ready<()>>::new())
            .await
            .is_empty());
    }
}
