//! What `FairLock` and `Lock` share: a named lock on a client, an optional holder, and every
//! operation. The public types are thin wrappers that carry the documentation of their own
//! semantics.
//!
//! A handle without a holder mints a fresh one for every acquisition call (`lock/holder.rs`), so
//! its calls never share a hold; one given a holder (`with_holder`) makes all its calls that one
//! holder.
//!
//! Making a handle must never do I/O or fail: a name that cannot be used is reported by every
//! operation as `Error::InvalidName`.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::{acquire, Request};
use crate::engine::inner::Inner;
use crate::error::{Error, Result};
use crate::keys;
use crate::keys::{Kind, LockSpec};
use crate::lock::guard::LockGuard;
use crate::lock::holder::Holder;
use crate::state::LockState;
use crate::wire;

#[derive(Clone, Debug)]
pub(crate) struct Handle {
    inner: Arc<Inner>,
    name: String,
    /// The validated spec, or why the name was rejected (reported by every operation).
    spec: std::result::Result<Arc<LockSpec>, &'static str>,
    /// `None`: every acquisition call is its own holder.
    holder: Option<Holder>,
    fenced: bool,
}

impl Handle {
    pub(crate) fn new(inner: Arc<Inner>, name: String, kind: Kind) -> Self {
        let cluster = inner.conn.is_cluster();
        let spec = match keys::validate(&name, cluster) {
            Ok(()) => Ok(LockSpec::new(kind, &name)),
            Err(Error::InvalidName { reason, .. }) => Err(reason),
            Err(_) => Err("invalid name"),
        };
        Handle {
            inner,
            name,
            spec,
            holder: None,
            fenced: false,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The id of the client this handle works through.
    pub(crate) fn client_id(&self) -> uuid::Uuid {
        self.inner.id
    }

    pub(crate) fn set_holder(&mut self, holder: Holder) {
        self.holder = Some(holder);
    }

    pub(crate) fn set_fenced(&mut self) {
        self.fenced = true;
    }

    /// Makes a side of a read-write lock writer-preferring (`ReadWriteLock::writer_preferring`).
    pub(crate) fn set_prefer_writers(&mut self) {
        if let Ok(spec) = &self.spec {
            self.spec = Ok(LockSpec::new_rw(spec.kind, spec.name(), true));
        }
    }

    fn spec(&self) -> Result<&Arc<LockSpec>> {
        self.spec.as_ref().map_err(|reason| Error::InvalidName {
            name: self.name.clone(),
            reason,
        })
    }

    /// The holder of one acquisition call: the handle's, or one of its own (`true`): an idle one
    /// of this client on this lock when there is one (`Inner::reuse_holder`), else a fresh one.
    fn call_holder(&self, name: &str) -> (i64, bool) {
        match self.holder {
            Some(holder) => (holder.id(), false),
            None => (
                self.inner
                    .reuse_holder(name)
                    .unwrap_or_else(|| Holder::mint().id()),
                true,
            ),
        }
    }

    pub(crate) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        let spec = self.spec()?;
        let (holder, per_call) = self.call_holder(spec.name());
        let req = Request {
            holder,
            per_call,
            wait,
            lease,
            fenced: self.fenced,
        };
        Ok(acquire(&self.inner, spec, req).await?.map(LockGuard::new))
    }

    pub(crate) async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<LockGuard> {
        match self.acquire(None, lease).await? {
            Some(guard) => Ok(guard),
            None => unreachable!("a wait without a deadline ends only with the lock or an error"),
        }
    }

    pub(crate) async fn force_unlock(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        wire::force_unlock(&mut conn, spec).await
    }

    pub(crate) async fn is_locked(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        wire::is_locked(&mut conn, spec).await
    }

    pub(crate) async fn rw_state(&self) -> Result<crate::state::RwLockState> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        Ok(crate::state::RwLockState::from_raw(
            wire::rw_state(&mut conn, spec).await?,
        ))
    }

    pub(crate) async fn rw_force_unlock(&self, side: Option<Kind>) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        wire::rw_force_unlock(&mut conn, spec, side).await
    }

    pub(crate) async fn hold_count(&self) -> Result<u32> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        let field = self
            .holder
            .map(|holder| spec.owner_field(self.inner.field(holder.id())));
        let prefix = format!("{}:", self.inner.uuid);
        wire::hold_count(&mut conn, spec, field.as_deref(), &prefix).await
    }

    pub(crate) async fn state(&self) -> Result<LockState> {
        let spec = self.spec()?;
        let mut conn = self.inner.conn.clone();
        Ok(LockState::from_raw(wire::state(&mut conn, spec).await?))
    }
}
