//! A lane: a FIFO turn-taking permit with some state, the structure behind the ordering rule of
//! every lock and owner field (see `held.rs`): operations run one at a time, in the order they
//! asked for their turn, and the state is only changed by whoever holds the turn.
//!
//! What makes it fit lock work, where tokio's `Mutex` does not:
//! * **A turn can be taken synchronously**, from `Drop`: [`Lane::enter_background`] queues work
//!   (or starts it at once) without awaiting, so a guard dropped just before its task locks again
//!   is always served first.
//! * **A waiting caller is cancel safe**: dropping [`Lane::enter`]'s future gives its turn up, and
//!   a turn handed to a caller that has just gone is passed on, never lost.
//! * **A turn is a value** ([`Turn`]) that can move into a future handed to a background task, so
//!   an operation whose caller left still finishes before the next one starts.
//!
//! It must never: hold its mutex while running anybody's code (a background job, a dropped
//! permit), or let two turns be out at once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// A lane with state `S`; see the module documentation.
pub(crate) struct Lane<S: Send + 'static> {
    inner: Mutex<Inner<S>>,
}

struct Inner<S: Send + 'static> {
    /// A turn is out.
    busy: bool,
    queue: VecDeque<Next<S>>,
    state: S,
}

/// Who gets the turn next.
enum Next<S: Send + 'static> {
    /// A caller awaiting [`Lane::enter`].
    Caller(oneshot::Sender<Turn<S>>),
    /// Work queued by [`Lane::enter_background`]; it is called with the turn (and must not block).
    Background(Box<dyn FnOnce(Turn<S>) + Send>),
}

impl<S: std::fmt::Debug + Send + 'static> std::fmt::Debug for Lane<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Lane")
            .field("busy", &inner.busy)
            .field("queued", &inner.queue.len())
            .field("state", &inner.state)
            .finish()
    }
}

/// The turn on a lane. Dropping it hands the turn to the next in line.
#[must_use = "dropping the turn hands it to the next in line at once"]
pub(crate) struct Turn<S: Send + 'static> {
    lane: Option<Arc<Lane<S>>>,
}

impl<S: Send + 'static> std::fmt::Debug for Turn<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Turn")
    }
}

impl<S: Send + 'static> Lane<S> {
    pub(crate) fn new(state: S) -> Arc<Self> {
        Arc::new(Lane {
            inner: Mutex::new(Inner {
                busy: false,
                queue: VecDeque::new(),
                state,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        // Every update under this lock is a plain field write or queue push/pop, so a panic
        // elsewhere cannot leave it inconsistent: a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads or updates the state. Meant for whoever holds the turn; others may read fields that
    /// are documented as readable at any time.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        f(&mut self.lock().state)
    }

    /// The turn at once when nobody holds it and nobody waits for it.
    #[cfg(test)]
    pub(crate) fn try_enter(self: &Arc<Self>) -> Option<Turn<S>> {
        let mut inner = self.lock();
        if inner.busy || !inner.queue.is_empty() {
            return None;
        }
        inner.busy = true;
        Some(Turn {
            lane: Some(self.clone()),
        })
    }

    /// Takes a place in line now, synchronously; the returned [`Entry`] yields the turn when
    /// everyone before it is done. Dropping the entry gives the place up (a turn it had already
    /// been handed is passed on).
    pub(crate) fn reserve(self: &Arc<Self>) -> Entry<S> {
        let mut inner = self.lock();
        if !inner.busy && inner.queue.is_empty() {
            inner.busy = true;
            return Entry::Ready(Turn {
                lane: Some(self.clone()),
            });
        }
        let (tx, rx) = oneshot::channel();
        inner.queue.push_back(Next::Caller(tx));
        Entry::Waiting(self.clone(), rx)
    }

    /// Waits for the turn, after everyone who asked before.
    ///
    /// Cancel safe: dropping the future gives the place up; a turn it had already been handed is
    /// passed on to the next in line.
    pub(crate) async fn enter(self: &Arc<Self>) -> Turn<S> {
        self.reserve().turn().await
    }

    /// Queues `job` for its turn, without waiting: it is called with the turn at once when the
    /// lane is free, else when everyone before it is done. `job` must not block (it typically
    /// hands a future that owns the turn to a background task); the turn passes on when that
    /// future drops it.
    pub(crate) fn enter_background(self: &Arc<Self>, job: impl FnOnce(Turn<S>) + Send + 'static) {
        {
            let mut inner = self.lock();
            if inner.busy || !inner.queue.is_empty() {
                inner.queue.push_back(Next::Background(Box::new(job)));
                return;
            }
            inner.busy = true;
        }
        job(Turn {
            lane: Some(self.clone()),
        });
    }

    /// Whether a turn is out or queued (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        let inner = self.lock();
        !inner.busy && inner.queue.is_empty()
    }

    /// Passes the turn to the next in line, or marks the lane free.
    fn hand_over(self: &Arc<Self>) {
        loop {
            let next = {
                let mut inner = self.lock();
                match inner.queue.pop_front() {
                    Some(next) => next,
                    None => {
                        inner.busy = false;
                        return;
                    }
                }
            };
            let turn = Turn {
                lane: Some(self.clone()),
            };
            match next {
                Next::Caller(tx) => match tx.send(turn) {
                    Ok(()) => return,
                    // That caller is gone: take the turn back quietly and try the next one.
                    Err(mut turn) => {
                        turn.lane = None;
                    }
                },
                Next::Background(job) => {
                    job(turn);
                    return;
                }
            }
        }
    }
}

/// A place in line on a lane (see [`Lane::reserve`]).
pub(crate) enum Entry<S: Send + 'static> {
    /// The turn, at once.
    Ready(Turn<S>),
    /// The turn comes through this channel; the lane (and so the sender in its queue) is kept
    /// alive until it does.
    Waiting(Arc<Lane<S>>, oneshot::Receiver<Turn<S>>),
}

impl<S: Send + 'static> std::fmt::Debug for Entry<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Ready(_) => f.write_str("Entry::Ready"),
            Entry::Waiting(..) => f.write_str("Entry::Waiting"),
        }
    }
}

impl<S: Send + 'static> Entry<S> {
    /// Waits for the turn. Cancel safe, as [`Lane::enter`].
    pub(crate) async fn turn(self) -> Turn<S> {
        match self {
            Entry::Ready(turn) => turn,
            // The sender lives in the queue until the turn is handed over, and we keep the lane
            // alive: the channel cannot close without a value.
            Entry::Waiting(_lane, rx) => {
                rx.await.expect("a queued caller is always handed the turn")
            }
        }
    }
}

impl<S: Send + 'static> Turn<S> {
    /// The lane this turn is on.
    pub(crate) fn lane(&self) -> &Arc<Lane<S>> {
        self.lane.as_ref().expect("a live turn has its lane")
    }

    /// Reads or updates the lane's state.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        self.lane().with(f)
    }
}

impl<S: Send + 'static> Drop for Turn<S> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            lane.hand_over();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_uncontended_turn_is_taken_and_given_back_synchronously() {
        let lane = Lane::new(0u32);
        let turn = lane.try_enter().expect("free");
        assert!(lane.try_enter().is_none(), "only one turn at a time");
        turn.with(|n| *n += 1);
        drop(turn);
        assert!(lane.is_idle());
        assert_eq!(lane.with(|n| *n), 1);
    }

    #[tokio::test]
    async fn turns_go_in_the_order_they_were_asked_for_background_work_included() {
        let lane = Lane::new(Vec::<&'static str>::new());
        let first = lane.try_enter().unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));

        // A dropped guard queues its release synchronously...
        let log = order.clone();
        lane.enter_background(move |turn| {
            log.lock().unwrap().push("background");
            drop(turn);
        });
        // ...so a caller that asks afterwards always comes after it.
        let l = lane.clone();
        let log = order.clone();
        let caller = tokio::spawn(async move {
            let turn = l.enter().await;
            log.lock().unwrap().push("caller");
            drop(turn);
        });
        tokio::task::yield_now().await;
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody runs while the turn is out"
        );
        drop(first);
        caller.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["background", "caller"]);
        assert!(lane.is_idle());
    }

    #[tokio::test]
    async fn a_cancelled_caller_gives_its_place_up() {
        let lane = Lane::new(());
        let first = lane.try_enter().unwrap();
        let l = lane.clone();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), async move { l.enter().await }).await;
        assert!(gave_up.is_err());
        let l = lane.clone();
        let next = tokio::spawn(async move { drop(l.enter().await) });
        tokio::task::yield_now().await;
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the turn skipped the cancelled caller")
            .unwrap();
        assert!(lane.is_idle());
    }

    #[tokio::test]
    async fn a_turn_handed_to_a_caller_that_is_dropped_before_it_runs_is_passed_on() {
        let lane = Lane::new(());
        let first = lane.try_enter().unwrap();
        let l = lane.clone();
        let mut pending = Box::pin(async move { l.enter().await });
        // Registered in the queue, not yet granted.
        assert!(futures_poll_once(pending.as_mut()).is_none());
        let l = lane.clone();
        let after = tokio::spawn(async move { drop(l.enter().await) });
        tokio::task::yield_now().await;
        // The turn goes to `pending` (its value sits in the channel), which is then dropped
        // without ever looking at it.
        drop(first);
        drop(pending);
        tokio::time::timeout(Duration::from_secs(5), after)
            .await
            .expect("the turn was passed on")
            .unwrap();
        assert!(lane.is_idle());
    }

    #[test]
    fn a_turn_can_move_into_background_work_and_the_lane_waits_for_it() {
        let lane = Lane::new(());
        let (tx, rx) = std::sync::mpsc::channel();
        lane.enter_background(move |turn| tx.send(turn).unwrap());
        let held = rx.recv().unwrap();
        assert!(
            lane.try_enter().is_none(),
            "the background work holds the turn"
        );
        drop(held);
        assert!(lane.try_enter().is_some());
    }

    fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match fut.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
