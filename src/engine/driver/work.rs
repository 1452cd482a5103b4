//! What the driver is sent, and the handle that sends it: [`Work`], [`DriverHandle`] and the
//! lazy inbox that registering and forgetting held entries go through.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::heartbeat::WaiterBeat;
use super::tracked::Tracked;
use crate::error::Result;
use crate::wire::batch::Beat;

/// Work for the driver.
pub(crate) enum Work {
    /// A hold was taken on `held` (lazy): arm its validity timer, and its renewals when it is a
    /// watchdog hold or a direct grant to extend (`confirm`). `deadline` is the validity deadline
    /// the grant left, where the timer goes when the hold is already gone by the time the driver
    /// looks but something still refers to the field (it then finds nothing and lets the entry
    /// go; until then, later grants of the field find their timers armed).
    Acquired {
        held: Arc<dyn Tracked>,
        watchdog: bool,
        confirm: Option<Confirm>,
        deadline: Option<Instant>,
    },
    /// Nothing refers to the field `id` any more (lazy): stop its timers.
    Forget { id: u64 },
    /// A fair waiter started waiting: heartbeat it while it is alive.
    Waiter(Arc<WaiterBeat>),
    /// Permits of an expirable semaphore taken without a lease: renew them while they live.
    Permits(Arc<crate::engine::permit::PermitLease>),
    /// An operation that must run to its end though nobody awaits it: a dropped guard's release,
    /// a cancelled wait's give-up or an attempt in flight when its caller left (each holding its
    /// field's turn), or the rest of an operation whose caller left.
    Finish(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Lazy work is waiting and the driver was idle: look at it.
    Wake,
    /// Renewal replies for the listed entries (sent at `sent`, covering grants up to `grants`).
    Renewed {
        ids: Vec<(u64, u64)>,
        sent: Instant,
        results: Vec<Result<crate::wire::batch::RenewOutcome>>,
    },
    /// Heartbeat replies for the listed waiters.
    Beaten {
        waiters: Vec<Weak<WaiterBeat>>,
        result: Result<Vec<Beat>>,
    },
    /// Stop every timer and end the task.
    Shutdown(oneshot::Sender<()>),
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Work::Acquired { .. } => "Acquired",
            Work::Forget { .. } => "Forget",
            Work::Waiter(_) => "Waiter",
            Work::Permits(_) => "Permits",
            Work::Finish(_) => "Finish",
            Work::Wake => "Wake",
            Work::Renewed { .. } => "Renewed",
            Work::Beaten { .. } => "Beaten",
            Work::Shutdown(_) => "Shutdown",
        };
        f.write_str(name)
    }
}

/// A direct grant (PROTOCOL 8) whose short TTL the watchdog extends to the hold's lease: first
/// `at`, then (after a failure) every `period` until it is answered, as renewals are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Confirm {
    pub(crate) at: Instant,
    pub(crate) period: std::time::Duration,
}

/// Work that may wait for the driver's next tick: registering and forgetting held entries. The
/// first renewal or validity deadline of an entry is at least a third of a lease away, and both
/// are computed from instants carried in the work, so a delay of one tick changes nothing, while
/// not waking the driver on every lock and unlock keeps the uncontended path at two round trips
/// and no extra task wake-ups.
#[derive(Debug, Default)]
pub(super) struct LazyInbox {
    pub(super) items: Vec<Work>,
    /// The driver sleeps without a tick: the next lazy item must wake it.
    pub(super) idle: bool,
}

/// Handle on the driver task.
#[derive(Debug, Clone)]
pub(crate) struct DriverHandle {
    pub(super) tx: mpsc::UnboundedSender<Work>,
    pub(super) lazy: Arc<Mutex<LazyInbox>>,
}

impl DriverHandle {
    /// A handle whose work lands in the returned receiver instead of a driver (unit tests).
    #[cfg(test)]
    pub(crate) fn detached() -> (Self, mpsc::UnboundedReceiver<Work>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let lazy = Arc::new(Mutex::new(LazyInbox::default()));
        (DriverHandle { tx, lazy }, rx)
    }

    /// Hands work to the driver, waking it. Never blocks; silently dropped once the driver has
    /// ended.
    pub(crate) fn send(&self, work: Work) {
        // Fails only once every handle of the client is gone (the driver outlives a shutdown
        // for as long as anything can still send it cleanup; see `Driver::run`).
        if self.tx.send(work).is_ok() {
            crate::metrics::driver_pending(1.0);
        }
    }

    /// Hands work to the driver for its next tick (see [`LazyInbox`]); wakes it only when it
    /// has no tick scheduled.
    pub(crate) fn send_lazy(&self, work: Work) {
        let wake = {
            let mut inbox = lock_inbox(&self.lazy);
            inbox.items.push(work);
            std::mem::take(&mut inbox.idle)
        };
        crate::metrics::driver_pending(1.0);
        if wake {
            self.send(Work::Wake);
        }
    }
}

pub(super) fn lock_inbox(inbox: &Mutex<LazyInbox>) -> std::sync::MutexGuard<'_, LazyInbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}
