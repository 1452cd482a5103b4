//! What `FairLock`, `NonFairLock` and the sides of a `ReadWriteLock` share besides acquisition
//! (the engine's [`Handle`], `engine/acquire/call.rs`): the reads and force-unlocks, each one
//! request through `wire/`. The public types are thin wrappers that carry the documentation of
//! their own semantics.

use crate::engine::acquire::Handle;
use crate::error::Result;
use crate::keys::Kind;
use crate::state::LockState;
use crate::wire;

impl Handle {
    /// The id of the client this handle works through.
    pub(crate) fn client_id(&self) -> uuid::Uuid {
        self.inner().id
    }

    pub(crate) async fn force_unlock(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner().conn.clone();
        wire::force_unlock(&mut conn, spec).await
    }

    pub(crate) async fn is_locked(&self) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner().conn.clone();
        wire::is_locked(&mut conn, spec).await
    }

    pub(crate) async fn rw_state(&self) -> Result<crate::state::RwLockState> {
        let spec = self.spec()?;
        let mut conn = self.inner().conn.clone();
        Ok(crate::state::RwLockState::from_raw(
            wire::rw_state(&mut conn, spec).await?,
        ))
    }

    pub(crate) async fn rw_force_unlock(&self, side: Option<Kind>) -> Result<bool> {
        let spec = self.spec()?;
        let mut conn = self.inner().conn.clone();
        wire::rw_force_unlock(&mut conn, spec, side).await
    }

    pub(crate) async fn hold_count(&self) -> Result<u32> {
        let spec = self.spec()?;
        let inner = self.inner();
        let mut conn = inner.conn.clone();
        let field = self
            .holder()
            .map(|holder| spec.owner_field(inner.helds.field(holder)));
        let prefix = format!("{}:", inner.uuid);
        wire::hold_count(&mut conn, spec, field.as_deref(), &prefix).await
    }

    pub(crate) async fn state(&self) -> Result<LockState> {
        let spec = self.spec()?;
        let mut conn = self.inner().conn.clone();
        Ok(LockState::from_raw(wire::state(&mut conn, spec).await?))
    }
}
