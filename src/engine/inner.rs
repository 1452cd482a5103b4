//! The state a client shares ([`Inner`]): its connections, its driver, and every lock and owner
//! field it works on. Handles, guards and each field's `Held` keep it alive; background tasks
//! never hold a strong reference to it, so they end when the last of those is gone.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use uuid::Uuid;

use crate::config::Config;
use crate::conn::subscriber::Subscriber;
use crate::conn::Conn;
use crate::engine::driver::DriverHandle;
use crate::engine::field::Helds;
use crate::error::{Error, Result};

/// Everything a client shares. Background tasks never hold a strong reference to it.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) id: Uuid,
    /// `id` as text, lowercase with dashes (the owner field prefix).
    pub(crate) uuid: String,
    pub(crate) config: Config,
    pub(crate) conn: Conn,
    pub(crate) subscriber: Subscriber,
    pub(crate) driver: DriverHandle,
    /// Every lock and owner field this client works on (see `engine/field/`).
    pub(crate) helds: Helds,
    /// `true` once shut down; waiters watch it.
    pub(crate) closed: watch::Sender<bool>,
    /// The last owner field built: a holder taking many locks (or one lock many times) shares
    /// one allocation.
    last_field: std::sync::Mutex<Option<(i64, Arc<str>)>>,
    /// Idle call holders by lock name (see [`reuse_holder`](Self::reuse_holder)).
    idle_holders: std::sync::Mutex<IdleHolders>,
    /// Expirable-semaphore permits in use under this client, for shutdown (ended entries are
    /// dropped as new ones come).
    permits: std::sync::Mutex<Vec<std::sync::Weak<crate::engine::permit::PermitLease>>>,
    /// Background work of semaphores and latches not finished yet (settling dropped acquires,
    /// releasing dropped permits), which `shutdown` waits for.
    background: Arc<Background>,
}

/// A count of background work, and a wake-up when it drops to zero.
#[derive(Debug, Default)]
struct Background {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts one piece of background work for as long as it lives (done or dropped).
struct Running(Arc<Background>);

impl Drop for Running {
    fn drop(&mut self) {
        if self
            .0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// Holder ids of ended calls that left nothing behind, by lock name, newest last.
#[derive(Debug, Default)]
struct IdleHolders {
    /// Each id with whether its waiter channel was subscribed (see `Inner::holder_idle`).
    by_name: std::collections::HashMap<Box<str>, Vec<(i64, bool)>>,
    total: usize,
}

/// At most this many idle holders are kept per client (each is a few bytes and, for a while, a
/// subscribed channel: see `conn/subscriber`).
const MAX_IDLE_HOLDERS: usize = 4096;
/// At most this many per lock name.
const MAX_IDLE_HOLDERS_PER_NAME: usize = 256;

impl Inner {
    /// How long a call mark of the coordination kinds lives (ms, PROTOCOL 11): ten seconds, or
    /// four command timeouts when longer.
    pub(crate) fn mark_ms(&self) -> i64 {
        let four = self.config.command_timeout.saturating_mul(4);
        four.max(std::time::Duration::from_secs(10)).as_millis() as i64
    }

    /// How long a marked call's resends may go on after its first send: half its mark's life,
    /// so every resend arrives while the mark still tells what the first send did. Shutdown
    /// waits this long (and a command timeout) for settles still running.
    pub(crate) fn settle_window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.mark_ms() as u64 / 2)
    }

    pub(crate) fn new(
        id: Uuid,
        config: Config,
        conn: Conn,
        subscriber: Subscriber,
        driver: DriverHandle,
    ) -> Self {
        Inner {
            id,
            uuid: id.hyphenated().to_string(),
            config,
            conn,
            subscriber,
            driver,
            helds: Helds::default(),
            closed: watch::Sender::new(false),
            last_field: std::sync::Mutex::new(None),
            idle_holders: std::sync::Mutex::new(IdleHolders::default()),
            permits: std::sync::Mutex::new(Vec::new()),
            background: Arc::default(),
        }
    }

    /// The holder of one acquisition call that brought none of its own: an idle one of this
    /// client on lock `name` when there is one (see [`reuse_holder`](Self::reuse_holder)),
    /// else a fresh one; and whether its waiter channel may still be subscribed (a fresh id's
    /// never is, nor that of an idle one whose calls never subscribed).
    pub(crate) fn call_holder(&self, name: &str) -> (i64, bool) {
        self.reuse_holder(name)
            .unwrap_or_else(|| (mint_holder_id(), false))
    }

    /// A holder id for a new call on lock `name` that a call of this client used before and that
    /// left nothing behind, if there is one (the newest first).
    ///
    /// Why: a fair waiter listens on its own channel (PROTOCOL 2), one per owner field, so a
    /// fresh holder per call would cost every waiting call a subscription (a round trip, then a
    /// second attempt to cover the gap) and an unsubscription later. A reused holder's channel
    /// is usually still subscribed (it lingers), so its call waits at once.
    ///
    /// Why it is safe: an id comes back here only from a field whose every trace is gone
    /// ([`Held`](crate::engine::field::Held)'s `Drop`): no guard, no call, no work in its line,
    /// no hold in Redis by the client's count and no reply it never saw, and a holder nobody was
    /// given (a guard's `holder()` keeps it out for good). So two calls that run at the same
    /// time never share a holder, and no `Holder` value a user kept can re-enter a later call's
    /// hold. What Redis may still have of it is what any holder's next call meets and settles:
    /// a queue entry whose give-up failed (dropped by the call's first attempt) and a grant
    /// message that comes late (it names the old call's nonce and is ignored).
    pub(crate) fn reuse_holder(&self, name: &str) -> Option<(i64, bool)> {
        let mut idle = self.idle_holders.lock().unwrap_or_else(|p| p.into_inner());
        let ids = idle.by_name.get_mut(name)?;
        let id = ids.pop();
        if ids.is_empty() {
            idle.by_name.remove(name);
        }
        if id.is_some() {
            idle.total -= 1;
        }
        id
    }

    /// A call holder `id` on lock `name` left nothing behind: a later call may reuse it.
    /// `subscribed`: a call of it subscribed its waiter channel, which may still linger.
    pub(crate) fn holder_idle(&self, name: &str, id: i64, subscribed: bool) {
        let mut idle = self.idle_holders.lock().unwrap_or_else(|p| p.into_inner());
        if idle.total >= MAX_IDLE_HOLDERS {
            return;
        }
        let ids = idle.by_name.entry(name.into()).or_default();
        if ids.len() >= MAX_IDLE_HOLDERS_PER_NAME {
            return;
        }
        ids.push((id, subscribed));
        idle.total += 1;
    }

    /// Runs `work` on the driver (no I/O in `Drop`), counted until it is done so that `shutdown`
    /// can wait for it.
    pub(crate) fn in_background(
        &self,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.background
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let running = Running(self.background.clone());
        self.driver
            .send(crate::engine::driver::Work::Finish(Box::pin(async move {
                work.await;
                drop(running);
            })));
    }

    /// Resolves once no background work of [`in_background`](Self::in_background) is left.
    pub(crate) async fn background_done(&self) {
        loop {
            let idle = self.background.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self
                .background
                .running
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0
            {
                return;
            }
            idle.await;
        }
    }

    /// Permits were taken under this client (see `lifecycle::shutdown`).
    pub(crate) fn permits_taken(&self, lease: &Arc<crate::engine::permit::PermitLease>) {
        let mut all = self.permits.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= 64 && all.len().is_power_of_two() {
            all.retain(|w| w.upgrade().is_some_and(|l| !l.is_ended()));
        }
        all.push(Arc::downgrade(lease));
    }

    /// Every expirable-semaphore permit guard of this client still in use.
    pub(crate) fn permits_in_use(&self) -> Vec<Arc<crate::engine::permit::PermitLease>> {
        let all = self.permits.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|l| !l.is_ended())
            .collect()
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }

    /// The owner field of `holder` in this client.
    pub(crate) fn field(&self, holder: i64) -> Arc<str> {
        let mut last = self.last_field.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((h, field)) if *h == holder => field.clone(),
            _ => {
                let field: Arc<str> = format!("{}:{}", self.uuid, holder).into();
                *last = Some((holder, field.clone()));
                field
            }
        }
    }
}

/// The next minted holder id: negative, from one process-wide counter, so unique within every
/// client of the process (a `RedLock` uses one id on several clients) and never equal to a raw
/// id (`Holder::from_raw` takes the non-negative ones).
pub(crate) fn mint_holder_id() -> i64 {
    static NEXT_MINTED: AtomicI64 = AtomicI64::new(-1);
    NEXT_MINTED.fetch_sub(1, Ordering::Relaxed)
}
