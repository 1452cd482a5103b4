//! The state a client shares ([`Inner`]): its connections, its driver, and every lock and owner
//! field it works on. Handles, guards and each field's `Held` keep it alive; background tasks
//! never hold a strong reference to it, so they end when the last of those is gone.

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
    /// Every lock and owner field this client works on (see `field.rs`).
    pub(crate) helds: Helds,
    /// `true` once shut down; waiters watch it.
    pub(crate) closed: watch::Sender<bool>,
    /// The last owner field built: a holder taking many locks (or one lock many times) shares
    /// one allocation.
    last_field: std::sync::Mutex<Option<(i64, Arc<str>)>>,
}

impl Inner {
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
        }
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
