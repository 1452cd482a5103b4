//! The state a client shares ([`Inner`]): its connections, its driver, and every lock and owner
//! field it works on. Handles, guards and each field's `Held` keep it alive; background tasks
//! never hold a strong reference to it, so they end when the last of those is gone.

use std::sync::Arc;

use uuid::Uuid;

use crate::config::Config;
use crate::conn::subscriber::Subscriber;
use crate::conn::Conn;
use crate::engine::driver::DriverHandle;
use crate::engine::field::Helds;

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
        let uuid = id.hyphenated().to_string();
        Inner {
            id,
            helds: Helds::new(&uuid),
            uuid,
            config,
            conn,
            subscriber,
            driver,
            permits: std::sync::Mutex::new(Vec::new()),
            background: Arc::default(),
        }
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
}
