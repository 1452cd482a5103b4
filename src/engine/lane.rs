//! A lane: a FIFO turn-taking permit with some state, the structure behind the ordering rule of
//! every lock and owner field (see `engine/field/`): operations run one at a time, in the order they
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
//! * **It lives inside its owner** (a [`LaneOwner`], e.g. the per-field state of `engine/field/`): a turn
//!   holds the owner's `Arc`, so a lane costs no allocation of its own.
//!
//! It must never: hold its mutex while running anybody's code (a background job, a dropped
//! permit), or let two turns be out at once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Something shared through an `Arc` that contains a lane; a turn keeps its owner alive.
pub(crate) trait LaneOwner: Sized + Send + Sync + 'static {
    /// The state the lane guards.
    type State: Send + 'static;

    /// The owner's lane.
    fn lane(&self) -> &Lane<Self>;
}

/// A lane owned by `O`, guarding `O::State`; see the module documentation.
pub(crate) struct Lane<O: LaneOwner> {
    inner: Mutex<Inner<O>>,
}

struct Inner<O: LaneOwner> {
    /// A turn is out.
    busy: bool,
    /// Who waits, in order; allocated only while somebody waits (most lanes never queue), and
    /// boxed so an idle lane pays one pointer for it, not a `VecDeque`'s four words.
    #[allow(clippy::box_collection)]
    queue: Option<Box<VecDeque<Next<O>>>>,
    state: O::State,
}

impl<O: LaneOwner> Inner<O> {
    fn is_waited_for(&self) -> bool {
        self.queue.as_ref().is_some_and(|q| !q.is_empty())
    }

    fn push(&mut self, next: Next<O>) {
        self.queue
            .get_or_insert_with(Default::default)
            .push_back(next);
    }

    /// The next in line; the queue's memory goes back once nobody waits.
    fn pop(&mut self) -> Option<Next<O>> {
        let queue = self.queue.as_mut()?;
        let next = queue.pop_front();
        if queue.is_empty() {
            self.queue = None;
        }
        next
    }
}

/// Who gets the turn next.
enum Next<O: LaneOwner> {
    /// A caller awaiting [`Lane::enter`].
    Caller(oneshot::Sender<Turn<O>>),
    /// Work queued by [`Lane::enter_background`]; it is called with the turn (and must not block).
    Background(Box<dyn FnOnce(Turn<O>) + Send>),
}

impl<O: LaneOwner> std::fmt::Debug for Lane<O>
where
    O::State: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Lane")
            .field("busy", &inner.busy)
            .field("queued", &inner.queue.as_ref().map_or(0, |q| q.len()))
            .field("state", &inner.state)
            .finish()
    }
}

/// The turn on an owner's lane. Dropping it hands the turn to the next in line.
#[must_use = "dropping the turn hands it to the next in line at once"]
pub(crate) struct Turn<O: LaneOwner> {
    owner: Option<Arc<O>>,
}

impl<O: LaneOwner> std::fmt::Debug for Turn<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Turn")
    }
}

impl<O: LaneOwner> Turn<O> {
    fn of(owner: &Arc<O>) -> Self {
        Turn {
            owner: Some(owner.clone()),
        }
    }

    /// The lane's owner.
    pub(crate) fn owner(&self) -> &O {
        self.owner.as_ref().expect("a live turn has its owner")
    }

    /// Reads or updates the lane's state.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut O::State) -> R) -> R {
        self.owner
            .as_ref()
            .expect("a live turn has its owner")
            .lane()
            .with(f)
    }
}

impl<O: LaneOwner> Drop for Turn<O> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            Lane::hand_over(&owner);
        }
    }
}

impl<O: LaneOwner> Lane<O> {
    pub(crate) fn new(state: O::State) -> Self {
        Lane {
            inner: Mutex::new(Inner {
                busy: false,
                queue: None,
                state,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<O>> {
        // Every update under this lock is a plain field write or queue push/pop, so a panic
        // elsewhere cannot leave it inconsistent: a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads or updates the state. Meant for whoever holds the turn; others may read fields that
    /// are documented as readable at any time.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut O::State) -> R) -> R {
        f(&mut self.lock().state)
    }

    /// The turn at once when nobody holds it and nobody waits for it.
    #[cfg(test)]
    pub(crate) fn try_enter(owner: &Arc<O>) -> Option<Turn<O>> {
        let mut inner = owner.lane().lock();
        if inner.busy || inner.is_waited_for() {
            return None;
        }
        inner.busy = true;
        Some(Turn::of(owner))
    }

    /// Takes a place in `owner`'s line now, synchronously; the returned [`Entry`] yields the turn
    /// when everyone before it is done. Dropping the entry gives the place up (a turn it had
    /// already been handed is passed on).
    pub(crate) fn reserve(owner: &Arc<O>) -> Entry<O> {
        let mut inner = owner.lane().lock();
        if !inner.busy && !inner.is_waited_for() {
            inner.busy = true;
            return Entry::Ready(Turn::of(owner));
        }
        let (tx, rx) = oneshot::channel();
        inner.push(Next::Caller(tx));
        Entry::Waiting(owner.clone(), rx)
    }

    /// Waits for the turn, after everyone who asked before.
    ///
    /// Cancel safe: dropping the future gives the place up; a turn it had already been handed is
    /// passed on to the next in line.
    pub(crate) async fn enter(owner: &Arc<O>) -> Turn<O> {
        Lane::reserve(owner).turn().await
    }

    /// Queues `job` for its turn, without waiting: it is called with the turn at once when the
    /// lane is free, else when everyone before it is done. `job` must not block (it typically
    /// hands a future that owns the turn to a background task); the turn passes on when that
    /// future drops it.
    pub(crate) fn enter_background(owner: &Arc<O>, job: impl FnOnce(Turn<O>) + Send + 'static) {
        {
            let mut inner = owner.lane().lock();
            if inner.busy || inner.is_waited_for() {
                inner.push(Next::Background(Box::new(job)));
                return;
            }
            inner.busy = true;
        }
        job(Turn::of(owner));
    }

    /// Whether no turn is out or queued.
    pub(crate) fn is_idle(&self) -> bool {
        let inner = self.lock();
        !inner.busy && !inner.is_waited_for()
    }

    /// Passes the turn to the next in line, or marks the lane free.
    fn hand_over(owner: &Arc<O>) {
        loop {
            let next = {
                let mut inner = owner.lane().lock();
                match inner.pop() {
                    Some(next) => next,
                    None => {
                        inner.busy = false;
                        return;
                    }
                }
            };
            let turn = Turn::of(owner);
            match next {
                Next::Caller(tx) => match tx.send(turn) {
                    Ok(()) => return,
                    // That caller is gone: take the turn back quietly and try the next one.
                    Err(mut turn) => {
                        turn.owner = None;
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
pub(crate) enum Entry<O: LaneOwner> {
    /// The turn, at once.
    Ready(Turn<O>),
    /// The turn comes through this channel; the owner (and so the sender in its lane's queue) is
    /// kept alive until it does.
    Waiting(Arc<O>, oneshot::Receiver<Turn<O>>),
}

impl<O: LaneOwner> std::fmt::Debug for Entry<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Ready(_) => f.write_str("Entry::Ready"),
            Entry::Waiting(..) => f.write_str("Entry::Waiting"),
        }
    }
}

impl<O: LaneOwner> Entry<O> {
    /// Waits for the turn. Cancel safe, as [`Lane::enter`].
    pub(crate) async fn turn(self) -> Turn<O> {
        match self {
            Entry::Ready(turn) => turn,
            // The sender lives in the queue until the turn is handed over, and we keep the owner
            // alive: the channel cannot close without a value.
            Entry::Waiting(_owner, rx) => {
                rx.await.expect("a queued caller is always handed the turn")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;
    use std::time::Duration;

    use super::*;

    /// A lane that is its own owner, for the tests.
    struct Solo<S: Send + Sync + 'static> {
        lane: Lane<Solo<S>>,
    }

    impl<S: Send + Sync + 'static> LaneOwner for Solo<S> {
        type State = S;
        fn lane(&self) -> &Lane<Self> {
            &self.lane
        }
    }

    fn solo<S: Send + Sync + 'static>(state: S) -> Arc<Solo<S>> {
        Arc::new(Solo {
            lane: Lane::new(state),
        })
    }

    #[test]
    fn the_uncontended_turn_is_taken_and_given_back_synchronously() {
        let lane = solo(0u32);
        let turn = Lane::try_enter(&lane).expect("free");
        assert!(Lane::try_enter(&lane).is_none(), "only one turn at a time");
        turn.with(|n| *n += 1);
        drop(turn);
        assert!(lane.lane.is_idle());
        assert_eq!(lane.lane.with(|n| *n), 1);
    }

    #[tokio::test]
    async fn turns_go_in_the_order_they_were_asked_for_background_work_included() {
        let lane = solo(0u8);
        let first = Lane::try_enter(&lane).unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));

        // A dropped guard queues its release synchronously...
        let log = order.clone();
        Lane::enter_background(&lane, move |turn| {
            log.lock().unwrap().push("background");
            drop(turn);
        });
        // ...so a caller that asks afterwards always comes after it.
        let l = lane.clone();
        let log = order.clone();
        let caller = tokio::spawn(async move {
            let turn = Lane::enter(&l).await;
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
        assert!(lane.lane.is_idle());
    }

    #[tokio::test]
    async fn a_cancelled_caller_gives_its_place_up() {
        let lane = solo(());
        let first = Lane::try_enter(&lane).unwrap();
        let l = lane.clone();
        let gave_up =
            tokio::time::timeout(
                Duration::from_millis(10),
                async move { Lane::enter(&l).await },
            )
            .await;
        assert!(gave_up.is_err());
        let l = lane.clone();
        let next = tokio::spawn(async move { drop(Lane::enter(&l).await) });
        tokio::task::yield_now().await;
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the turn skipped the cancelled caller")
            .unwrap();
        assert!(lane.lane.is_idle());
    }

    #[tokio::test]
    async fn a_turn_handed_to_a_caller_that_is_dropped_before_it_runs_is_passed_on() {
        let lane = solo(());
        let first = Lane::try_enter(&lane).unwrap();
        let l = lane.clone();
        let mut pending = Box::pin(async move { Lane::enter(&l).await });
        // Registered in the queue, not yet granted.
        assert!(futures_poll_once(pending.as_mut()).is_none());
        let l = lane.clone();
        let after = tokio::spawn(async move { drop(Lane::enter(&l).await) });
        tokio::task::yield_now().await;
        // The turn goes to `pending` (its value sits in the channel), which is then dropped
        // without ever looking at it.
        drop(first);
        drop(pending);
        tokio::time::timeout(Duration::from_secs(5), after)
            .await
            .expect("the turn was passed on")
            .unwrap();
        assert!(lane.lane.is_idle());
    }

    #[test]
    fn a_turn_can_move_into_background_work_and_the_lane_waits_for_it() {
        let lane = solo(());
        let (tx, rx) = std::sync::mpsc::channel();
        Lane::enter_background(&lane, move |turn| tx.send(turn).unwrap());
        let held = rx.recv().unwrap();
        assert!(
            Lane::try_enter(&lane).is_none(),
            "the background work holds the turn"
        );
        drop(held);
        assert!(Lane::try_enter(&lane).is_some());
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
