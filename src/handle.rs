//! What `FairLock` and `Lock` share: a named lock on a client, a holder, and every operation.
//! The public types are thin wrappers that carry the documentation of their own semantics.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

use crate::acquire::{acquire, Request};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::holder;
use crate::keys;
use crate::ops::{self, Kind, LockSpec};
use crate::state::LockState;

#[derive(Clone, Debug)]
pub(crate) struct Handle {
    client: Client,
    name: String,
    /// The validated spec, or why the name was rejected (reported by every operation).
    spec: std::result::Result<Arc<LockSpec>, &'static str>,
    holder: Option<i64>,
    fenced: bool,
}

impl Handle {
    pub(crate) fn new(client: Client, name: String, kind: Kind) -> Self {
        let cluster = client.inner.conn.is_cluster();
        let spec = match keys::validate(&name, cluster) {
            Ok(()) => Ok(LockSpec::new(kind, &name)),
            Err(Error::InvalidName { reason, .. }) => Err(reason),
            Err(_) => Err("invalid name"),
        };
        Handle {
            client,
            name,
            spec,
            holder: None,
            fenced: false,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn set_holder(&mut self, id: i64) {
        self.holder = Some(id);
    }

    pub(crate) fn set_fenced(&mut self) {
        self.fenced = true;
    }

    fn spec(&self) -> Result<&Arc<LockSpec>> {
        self.spec.as_ref().map_err(|reason| Error::InvalidName {
            name: self.name.clone(),
            reason,
        })
    }

    fn holder_id(&self) -> i64 {
        self.holder.unwrap_or_else(holder::current)
    }

    pub(crate) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        let spec = self.spec()?;
        let req = Request {
            holder: self.holder_id(),
            wait,
            lease,
            fenced: self.fenced,
        };
        acquire(&self.client.inner, spec, req).await
    }

    pub(crate) async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<LockGuard> {
        match self.acquire(None, lease).await? {
            Some(guard) => Ok(guard),
            // An unbounded wait only ends with the lock or an error.
            None => Err(Error::UnexpectedReply(
                "an unbounded wait ended without the lock".into(),
            )),
        }
    }

    pub(crate) async fn force_unlock(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.client.inner.conn.clone();
        ops::force_unlock(&mut conn, spec).await
    }

    pub(crate) async fn is_locked(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.client.inner.conn.clone();
        Ok(conn.exists(spec.name()).await?)
    }

    pub(crate) async fn hold_count(&self) -> Result<u32> {
        let spec = self.spec()?;
        let field = self.client.inner.field(self.holder_id());
        let mut conn = self.client.inner.conn.clone();
        let count: Option<i64> = conn.hget(spec.name(), &*field).await?;
        Ok(count.unwrap_or(0).clamp(0, u32::MAX as i64) as u32)
    }

    pub(crate) async fn state(&self) -> Result<LockState> {
        let spec = self.spec()?;
        let mut conn = self.client.inner.conn.clone();
        Ok(LockState::from_raw(ops::state(&mut conn, spec).await?))
    }
}
