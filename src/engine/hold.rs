//! One hold on one lock, as the engine keeps it: the field it belongs to, its generation, the
//! loss epoch it was made at and which of the field's holds it is. The public `LockGuard`
//! (`lock/mutex.rs`) is a documented shell over it.
//!
//! A hold must never do I/O in `Drop`: it leaves the account of its field at once and takes its
//! release's place in the field's line synchronously; the driver sends the release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::driver::{RunToEnd, Work};
use crate::engine::field::{Held, HoldRef, Registered, What};
use crate::engine::lane::Lane;
use crate::engine::release::release_logged;
use crate::engine::validity::{lease_ms, LostReason};
use crate::error::{Error, Result};
use crate::wire::Unlocked;

/// One hold; see the module documentation.
#[derive(Debug)]
pub(crate) struct Hold {
    held: Arc<Held>,
    /// The generation of the field's holds this hold belongs to.
    gen: u64,
    /// The field's loss epoch when the hold was taken.
    epoch: u64,
    hold: HoldRef,
    token: Option<u64>,
    /// Cleared by `unlock`, which releases the hold itself.
    armed: bool,
    /// Told when this hold ends, for the [`Signal`]s handed out (made on first use).
    ended: std::sync::OnceLock<Arc<Ended>>,
    /// When the hold was granted (for the hold-time metric).
    #[cfg(feature = "metrics")]
    acquired_at: Instant,
}

impl Hold {
    /// A hold just registered in `held`'s account (`engine/acquire/call.rs`), already counted
    /// live at its epoch by the registration.
    pub(crate) fn new(held: Arc<Held>, registered: Registered, token: Option<u64>) -> Self {
        let Registered {
            gen, hold, epoch, ..
        } = registered;
        Hold {
            held,
            gen,
            epoch,
            hold,
            token,
            armed: true,
            ended: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            acquired_at: Instant::now(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner field; whoever has it can act as this holder, so its id is never reused.
    pub(crate) fn owner_field(&self) -> &str {
        self.held.expose();
        &self.held.field
    }

    /// The holder id; whoever has it can act as this holder, so it is never reused.
    pub(crate) fn holder_id(&self) -> i64 {
        self.held.expose();
        self.held.holder_id()
    }

    /// Live holds of this hold's generation in this client (0 once they are known gone).
    pub(crate) fn count(&self) -> u32 {
        self.held.holds_of(self.gen)
    }

    pub(crate) fn token(&self) -> Option<u64> {
        self.token
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.held.valid_until_since(self.epoch)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.held.lost_since(self.epoch).is_some()
    }

    pub(crate) async fn lost(&self) -> LostReason {
        wait_lost(&self.held, self.epoch, None).await
    }

    /// An owned signal of this hold's end.
    pub(crate) fn signal(&self) -> Signal {
        Signal {
            held: self.held.clone(),
            epoch: self.epoch,
            ended: self.ended.get_or_init(Default::default).clone(),
        }
    }

    /// Extends this fixed hold to `lease` from now, in the field's line.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<()> {
        let ttl_ms = lease_ms("lease", lease)?;
        if !self.hold.is_fixed() {
            return Err(Error::invalid_argument(
                "extend",
                "this hold is renewed by the watchdog; only holds taken with a lease are extended",
            ));
        }
        self.held.inner.helds.check_open()?;
        if self.is_lost() {
            return Err(Error::NotHeld);
        }
        // In the field's line, like every operation that changes what Redis holds for it.
        let turn = Lane::enter(&self.held).await;
        if !turn.gen_is(self.gen) || self.is_lost() {
            return Err(Error::NotHeld);
        }
        let mut conn = self.held.inner.conn.clone();
        let sent = Instant::now();
        let still_held =
            crate::wire::extend(&mut conn, &self.held.spec, &self.held.field, ttl_ms).await?;
        turn.fixed_extended(self.gen, self.hold, sent, lease, still_held);
        drop(turn);
        // The driver's timer for the validity deadline follows the new one.
        self.held.inner.driver.send_lazy(Work::Acquired {
            held: self.held.clone(),
            watchdog: false,
            confirm: None,
            deadline: None,
        });
        if !still_held || self.is_lost() {
            return Err(Error::NotHeld);
        }
        Ok(())
    }

    /// The field this hold is one of.
    pub(crate) fn field(&self) -> &Arc<Held> {
        &self.held
    }

    /// Releases this hold; `Ok` only when Redis still had it.
    pub(crate) async fn unlock(mut self) -> Result<()> {
        self.armed = false;
        self.end_signals();
        let known_lost = self.held.lost_since(self.epoch);
        if !self.detach() {
            // The holds of its generation are gone from Redis already.
            return Err(Error::NotHeld);
        }
        let entry = Lane::reserve(&self.held);
        let held = self.held.clone();
        let gen = self.gen;
        let release = RunToEnd::new(&held.inner.driver.clone(), async move {
            let turn = entry.turn().await;
            release_logged(&held, &turn, What::Guard { gen }).await
        });
        let outcome = release.run().await?;
        match (known_lost, outcome) {
            (Some(_), _) => Err(Error::NotHeld),
            (None, Unlocked::Released | Unlocked::StillHeld) => Ok(()),
            (None, Unlocked::Expired | Unlocked::NotOwner) => Err(Error::NotHeld),
        }
    }

    /// Tells the signals that this hold ends (before it is released or its loss is forgotten),
    /// with the loss if there was one.
    fn end_signals(&self) {
        if let Some(ended) = self.ended.get() {
            let reason = self
                .held
                .lost_since(self.epoch)
                .unwrap_or(LostReason::Released);
            ended.end(reason);
        }
    }

    /// Leaves the field's account (the hold no longer counts for TTLs, validity or the watchdog).
    /// Returns whether the hold is still of the current generation, i.e. whether a release must
    /// be sent for it.
    fn detach(&self) -> bool {
        #[cfg(feature = "metrics")]
        crate::metrics::held(
            &self.held.spec,
            self.held.inner.config.metrics_lock_names,
            self.acquired_at.elapsed(),
        );
        self.held.guard_detached(self.gen, self.hold)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.end_signals();
        self.held.guard_gone(self.epoch);
        if !self.armed || !self.detach() {
            return;
        }
        // No I/O in Drop: the release takes its place in the field's line now, and the driver
        // sends it when its turn comes.
        let held = self.held.clone();
        let gen = self.gen;
        Lane::enter_background(&self.held, move |turn| {
            let driver = held.inner.driver.clone();
            driver.send(Work::Finish(Box::pin(async move {
                let _ = release_logged(&held, &turn, What::Guard { gen }).await;
            })));
        });
    }
}

/// How a hold ended, for its [`Signal`]s.
#[derive(Debug, Default)]
struct Ended {
    reason: std::sync::Mutex<Option<LostReason>>,
    notify: tokio::sync::Notify,
}

impl Ended {
    fn end(&self, reason: LostReason) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
            drop(slot);
            self.notify.notify_waiters();
        }
    }

    fn get(&self) -> Option<LostReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An owned signal of one hold's end: its loss, or its release.
#[derive(Debug, Clone)]
pub(crate) struct Signal {
    held: Arc<Held>,
    epoch: u64,
    ended: Arc<Ended>,
}

impl Signal {
    pub(crate) async fn lost(&self) -> LostReason {
        wait_lost(&self.held, self.epoch, Some(&self.ended)).await
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.ended.get().is_some() || self.held.lost_since(self.epoch).is_some()
    }
}

/// Until the lock of a hold made at `epoch` on `held` can no longer be trusted, or (with
/// `ended`) until that hold ends.
async fn wait_lost(held: &Held, epoch: u64, ended: Option<&Ended>) -> LostReason {
    loop {
        let changed = held.changed();
        tokio::pin!(changed);
        // Registered before the checks, so a loss, a new deadline or the hold's end after them
        // cannot be missed.
        changed.as_mut().enable();
        let never = tokio::sync::Notify::new();
        let finished = ended.map_or(&never, |e| &e.notify).notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        if let Some(reason) = ended.and_then(Ended::get) {
            return reason;
        }
        if let Some(reason) = held.lost_since(epoch) {
            return reason;
        }
        match held.valid_until() {
            Some(deadline) => {
                tokio::select! {
                    _ = &mut changed => {}
                    _ = &mut finished => {}
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
            None => {
                tokio::select! {
                    _ = &mut changed => {}
                    _ = &mut finished => {}
                }
            }
        }
    }
}
