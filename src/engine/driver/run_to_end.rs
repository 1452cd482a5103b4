//! Running an operation inside the caller's future, and finishing it in the driver only if the
//! caller drops the future first: cancel safety without a task spawn on the normal path.
//!
//! It must never drop an operation half done: whatever the caller stops awaiting is handed, as is,
//! to the driver, which runs it to its end.

use std::future::Future;
use std::pin::Pin;

use super::work::{DriverHandle, Work};

/// An operation polled by the caller; see the module documentation.
pub(crate) struct RunToEnd<T: Send + 'static> {
    fut: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    driver: DriverHandle,
}

impl<T: Send + 'static> RunToEnd<T> {
    pub(crate) fn new(
        driver: &DriverHandle,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Self {
        RunToEnd {
            fut: Some(Box::pin(fut)),
            driver: driver.clone(),
        }
    }

    /// Awaits the operation.
    pub(crate) async fn run(mut self) -> T {
        let out = self.fut.as_mut().expect("set until completed").await;
        self.fut = None;
        out
    }
}

impl<T: Send + 'static> Drop for RunToEnd<T> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            self.driver.send(Work::Finish(Box::pin(async move {
                let _ = fut.await;
            })));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_completed_operation_leaves_nothing_to_the_driver() {
        let (driver, mut rx) = DriverHandle::detached();
        let out = RunToEnd::new(&driver, async { 7 }).run().await;
        assert_eq!(out, 7);
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_dropped_operation_is_finished_by_the_driver() {
        let (driver, mut rx) = DriverHandle::detached();
        let done = Arc::new(AtomicBool::new(false));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let finished = done.clone();
        let op = RunToEnd::new(&driver, async move {
            let _ = released.await;
            finished.store(true, Ordering::SeqCst);
        });
        // The caller gives up while the operation waits.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), op.run()).await;
        assert!(gave_up.is_err());
        assert!(!done.load(Ordering::SeqCst));
        let Some(Work::Finish(rest)) = rx.recv().await else {
            panic!("the operation was not handed to the driver");
        };
        release.send(()).unwrap();
        rest.await;
        assert!(done.load(Ordering::SeqCst), "the driver ran it to its end");
    }

    #[tokio::test]
    async fn an_operation_never_polled_is_still_handed_over() {
        let (driver, mut rx) = DriverHandle::detached();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        drop(RunToEnd::new(&driver, async move {
            finished.store(true, Ordering::SeqCst);
        }));
        let Some(Work::Finish(rest)) = rx.recv().await else {
            panic!("the operation was not handed to the driver");
        };
        rest.await;
        assert!(done.load(Ordering::SeqCst));
    }
}
