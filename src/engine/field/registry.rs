//! The client's registry of fields: one [`Held`] per lock name and owner field, whatever the
//! kind, made on first use and swept away once nobody refers to it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::Held;
use crate::engine::inner::Inner;
use crate::error::{Error, Result};
use crate::keys::LockSpec;

/// Registry key of a field: (name, field), whatever the kind (see [`Helds::get`]). It shares the spec and field rather than copying
/// the name.
#[derive(Debug, Clone)]
struct HeldKey {
    spec: Arc<LockSpec>,
    field: Arc<str>,
}

impl PartialEq for HeldKey {
    fn eq(&self, other: &Self) -> bool {
        self.spec.name() == other.spec.name() && self.field == other.field
    }
}

impl Eq for HeldKey {}

impl Hash for HeldKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.name().hash(state);
        self.field.hash(state);
    }
}

/// The client's registry of fields, keyed by (kind, name, field).
#[derive(Debug, Default)]
pub(crate) struct Helds {
    map: Mutex<HashMap<HeldKey, Weak<Held>>>,
    /// Map size after the last sweep of dead entries: the next sweep comes at twice that.
    swept_at: AtomicU64,
}

impl Helds {
    fn lock(&self) -> MutexGuard<'_, HashMap<HeldKey, Weak<Held>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The field's state, made on first use. Entries of fields nobody refers to any more are
    /// swept away as the map grows (amortised O(1) per call).
    ///
    /// One lock name and owner field have one account, whatever the kind: a fair and a plain
    /// lock of one name write the same owner hash, so two accounts would each believe they
    /// count the field's holds, and one's release would take the other's away. A call of the
    /// other kind while the field's state is in use (a guard, a waiting call, a release or any
    /// operation in its line, or holds Redis may still have) is refused with
    /// [`Error::KindConflict`] before anything is sent; an idle state of the other kind is
    /// replaced.
    pub(crate) fn get(
        &self,
        inner: &Arc<Inner>,
        spec: &Arc<LockSpec>,
        field: &Arc<str>,
    ) -> Result<Arc<Held>> {
        let key = HeldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        let mut map = self.lock();
        if let Some(held) = map.get(&key).and_then(Weak::upgrade) {
            if held.spec.kind == spec.kind {
                return Ok(held);
            }
            let in_use = !held.lane.is_idle()
                || held.lane.with(|a| {
                    a.has_guards()
                        || a.waiting_calls > 0
                        || a.pending_releases > 0
                        || a.count > 0
                        || a.uncertain > 0
                        || a.dark
                });
            if in_use {
                return Err(Error::KindConflict {
                    name: spec.name().to_owned(),
                    field: field.to_string(),
                    held_as: held.spec.kind.label(),
                });
            }
        }
        let held = Arc::new(Held::new(inner.clone(), spec.clone(), field.clone()));
        map.insert(key, Arc::downgrade(&held));
        let swept = self.swept_at.load(Ordering::Relaxed) as usize;
        if map.len() >= (2 * swept).max(64) {
            // Dropping the dead `Weak`s frees nothing a live caller uses; no `Held` is dropped
            // while the map is locked (upgrades above return before we get here).
            map.retain(|_, w| w.strong_count() > 0);
            self.swept_at.store(map.len() as u64, Ordering::Relaxed);
        }
        Ok(held)
    }

    /// The state of `spec`'s lock and `field` if one lives; none is made.
    pub(crate) fn existing(&self, spec: &Arc<LockSpec>, field: &Arc<str>) -> Option<Arc<Held>> {
        let key = HeldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        self.lock().get(&key).and_then(Weak::upgrade)
    }

    /// Every field with live state (for shutdown).
    pub(crate) fn all(&self) -> Vec<Arc<Held>> {
        self.lock().values().filter_map(Weak::upgrade).collect()
    }
}
