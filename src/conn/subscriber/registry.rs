//! The registry of wanted channels: reference counts, the `Notify` each channel's waiters sleep on,
//! which channels are confirmed live on the current connection, the linger of unused channels,
//! and the "dirty" list the task reconciles with Redis. Pure bookkeeping behind one mutex: no I/O,
//! no clock of its own (callers pass `now`), so every rule here is unit-tested.
//!
//! It must never: hold its lock across an await (every method is synchronous), or hand a returning
//! waiter a `Notify` that still carries a wake-up stored for a previous user of the channel.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::mailbox::Mailbox;

/// How long an unused channel stays subscribed.
pub(super) const LINGER: Duration = Duration::from_secs(3);
/// At most this many unused channels linger; beyond it the oldest are dropped first.
pub(super) const MAX_LINGERING: usize = 4096;

/// Registry of wanted channels, shared by the handles and the background task.
#[derive(Debug, Default)]
pub(super) struct Registry {
    state: Mutex<State>,
    /// Whether the task has a live subscription connection (for `Client::health`).
    pub(super) connected: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Channel → interest. A channel is wanted while it has an entry (in use or lingering).
    channels: HashMap<String, Slot>,
    /// Channels whose wanted state changed since the task last looked.
    dirty: Vec<String>,
}

#[derive(Debug)]
struct Slot {
    refs: usize,
    mail: Arc<Mailbox>,
    /// Confirmed subscribed on the current connection.
    live: bool,
    /// When the last user left (the slot lingers until `LINGER` after this).
    idle_since: Option<Instant>,
}

/// What the task must send to bring Redis in line with the registry.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    pub(super) subscribe: Vec<String>,
    pub(super) unsubscribe: Vec<String>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single insert/remove), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers a message with `payload` on `channel` (a grant is kept for its waiter, see
    /// [`Mailbox`]) and wakes one waiter; `false` when nobody wants the channel.
    pub(super) fn notify(&self, channel: &str, payload: &[u8]) -> bool {
        match self.lock().channels.get(channel) {
            Some(slot) => {
                slot.mail.post(payload);
                true
            }
            None => false,
        }
    }

    /// Wakes one waiter of every channel (after a reconnect, when messages may have been lost).
    pub(super) fn wake_all(&self) {
        for slot in self.lock().channels.values() {
            slot.mail.wake();
        }
    }

    /// Whether no channel is wanted at all.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().channels.is_empty()
    }

    /// Whether `channel` is wanted (in use or lingering).
    #[cfg(any(feature = "cluster", test))]
    pub(super) fn is_wanted(&self, channel: &str) -> bool {
        self.lock().channels.contains_key(channel)
    }

    /// Takes one more reference on `channel`, creating its slot if needed. Returns the mailbox and
    /// whether the channel is already live (no round trip needed). A slot taken back from
    /// lingering gets a fresh mailbox, so a stale wake-up or grant stored for its previous user is
    /// dropped.
    pub(super) fn take(&self, channel: &str) -> (Arc<Mailbox>, bool) {
        let mut state = self.lock();
        let state = &mut *state;
        let slot = match state.channels.get_mut(channel) {
            Some(slot) => slot,
            None => {
                state.dirty.push(channel.to_owned());
                state.channels.entry(channel.to_owned()).or_insert(Slot {
                    refs: 0,
                    mail: Arc::new(Mailbox::for_channel(channel)),
                    live: false,
                    idle_since: None,
                })
            }
        };
        if slot.refs == 0 && slot.idle_since.take().is_some() {
            slot.mail = Arc::new(Mailbox::for_channel(channel));
        }
        slot.refs += 1;
        (slot.mail.clone(), slot.live)
    }

    /// Takes a reference on `channel` only if it is live already (lingering from an earlier
    /// wait), in one step, so a disconnect cannot slip between the check and the take.
    pub(super) fn take_if_live(&self, channel: &str) -> Option<Arc<Mailbox>> {
        if !self.lock().channels.get(channel).is_some_and(|s| s.live) {
            return None;
        }
        let (notify, live) = self.take(channel);
        if live {
            Some(notify)
        } else {
            // Lost the race with a disconnect: give the reference back (it lingers).
            self.release(channel, Instant::now());
            None
        }
    }

    /// Drops one reference. The last one leaves the channel lingering (subscribed, unused) from
    /// `now`; returns `true` then, so the caller can have the task schedule its sweep.
    pub(super) fn release(&self, channel: &str, now: Instant) -> bool {
        let mut state = self.lock();
        match state.channels.get_mut(channel) {
            Some(slot) if slot.refs > 0 => {
                slot.refs -= 1;
                if slot.refs == 0 {
                    slot.idle_since = Some(now);
                }
                slot.refs == 0
            }
            _ => false,
        }
    }

    /// Forgets channels that have lingered unused for `LINGER` (or the oldest beyond
    /// `MAX_LINGERING`), marking them dirty; returns when the next lingering one expires.
    pub(super) fn sweep(&self, now: Instant) -> Option<Instant> {
        let mut state = self.lock();
        let mut idle: Vec<(Instant, String)> = state
            .channels
            .iter()
            .filter_map(|(c, s)| s.idle_since.map(|t| (t, c.clone())))
            .collect();
        idle.sort();
        let excess = idle.len().saturating_sub(MAX_LINGERING);
        let mut next: Option<Instant> = None;
        for (i, (since, channel)) in idle.into_iter().enumerate() {
            if i < excess || now >= since + LINGER {
                state.channels.remove(&channel);
                state.dirty.push(channel);
            } else {
                next = Some(next.map_or(since + LINGER, |n| n.min(since + LINGER)));
            }
        }
        next
    }

    /// The server dropped our subscription to `channel` (its cluster slot moved): it is no longer
    /// live, must be subscribed again, and its waiter re-checks meanwhile.
    #[cfg(any(feature = "cluster", test))]
    pub(super) fn dropped_by_server(&self, channel: &str) {
        let mut state = self.lock();
        if let Some(slot) = state.channels.get_mut(channel) {
            slot.live = false;
            slot.mail.wake();
        }
        state.dirty.push(channel.to_owned());
    }

    /// Every wanted channel must be subscribed again (a new connection, a topology change).
    pub(super) fn mark_all_dirty(&self) {
        let mut state = self.lock();
        let all: Vec<String> = state.channels.keys().cloned().collect();
        state.dirty.extend(all);
    }

    /// The connection is gone: nothing is live any more.
    pub(super) fn mark_all_down(&self) {
        for slot in self.lock().channels.values_mut() {
            slot.live = false;
        }
    }

    /// Takes the dirty list and turns it into what to send, given what Redis has confirmed on
    /// the current connection (`subscribed`). Each channel appears at most once.
    pub(super) fn take_changes(&self, subscribed: &HashSet<String>) -> Changes {
        let mut state = self.lock();
        let dirty = std::mem::take(&mut state.dirty);
        let mut changes = Changes::default();
        let mut seen = HashSet::new();
        for channel in dirty {
            if !seen.insert(channel.clone()) {
                continue;
            }
            let wanted = state.channels.contains_key(&channel);
            let have = subscribed.contains(&channel);
            if wanted && !have {
                changes.subscribe.push(channel);
            } else if !wanted && have {
                changes.unsubscribe.push(channel);
            }
        }
        changes
    }

    /// Redis confirmed these subscriptions.
    pub(super) fn set_live(&self, channels: &[String]) {
        let mut state = self.lock();
        for c in channels {
            if let Some(slot) = state.channels.get_mut(c) {
                slot.live = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscribed(channels: &[&str]) -> HashSet<String> {
        channels.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_new_channel_is_dirty_and_not_live_until_confirmed() {
        let r = Registry::default();
        let (_, live) = r.take("a");
        assert!(!live);
        let changes = r.take_changes(&subscribed(&[]));
        assert_eq!(changes.subscribe, vec!["a".to_string()]);
        assert!(changes.unsubscribe.is_empty());
        r.set_live(&["a".into()]);
        let (_, live) = r.take("a");
        assert!(live, "a second user finds it live");
        assert_eq!(r.take_changes(&subscribed(&["a"])), Changes::default());
    }

    #[test]
    fn users_share_one_notify_and_the_last_one_leaves_it_lingering() {
        let r = Registry::default();
        let (n1, _) = r.take("a");
        let (n2, _) = r.take("a");
        assert!(Arc::ptr_eq(&n1, &n2));
        let t0 = Instant::now();
        assert!(!r.release("a", t0), "one user is left");
        assert!(r.release("a", t0), "the last user leaves");
        assert!(r.is_wanted("a"), "it lingers");
        assert_eq!(r.sweep(t0), Some(t0 + LINGER));
        assert!(r.is_wanted("a"));
        assert_eq!(r.sweep(t0 + LINGER), None);
        assert!(!r.is_wanted("a"));
        // Swept: the task unsubscribes it.
        let changes = r.take_changes(&subscribed(&["a"]));
        assert_eq!(changes.unsubscribe, vec!["a".to_string()]);
    }

    #[test]
    fn a_lingering_channel_taken_back_gets_a_fresh_notify_and_stays_live() {
        let r = Registry::default();
        let (old, _) = r.take("a");
        r.set_live(&["a".into()]);
        // A message for the old user arrives after it stopped waiting: a permit and a grant are
        // stored.
        assert!(r.notify("a", b"fairlock:grant:7:1000:0"));
        assert!(old.take_grant().is_some());
        assert!(r.notify("a", b"fairlock:grant:7:1000:0"));
        r.release("a", Instant::now());
        let fresh = r.take_if_live("a").expect("live and lingering");
        assert!(
            !Arc::ptr_eq(&old, &fresh),
            "the stale permit must not reach the new user"
        );
        assert_eq!(fresh.take_grant(), None, "nor the stale grant");
        // Taking it back does not ask for a new subscription.
        assert_eq!(r.take_changes(&subscribed(&["a"])), Changes::default());
        assert!(r.sweep(Instant::now() + LINGER * 2).is_none());
        assert!(r.is_wanted("a"), "in use again: never swept");
    }

    #[test]
    fn take_if_live_refuses_channels_that_are_not_confirmed() {
        let r = Registry::default();
        assert!(r.take_if_live("a").is_none());
        r.take("a");
        assert!(r.take_if_live("a").is_none());
        r.set_live(&["a".into()]);
        assert!(r.take_if_live("a").is_some());
        r.mark_all_down();
        assert!(r.take_if_live("a").is_none());
    }

    #[test]
    fn too_many_lingering_channels_drop_the_oldest_first() {
        let r = Registry::default();
        let t0 = Instant::now();
        for i in 0..MAX_LINGERING + 2 {
            let c = format!("c{i}");
            r.take(&c);
            r.release(&c, t0 + Duration::from_micros(i as u64));
        }
        r.take_changes(&subscribed(&[]));
        // Well within the linger period: only the count limit applies.
        r.sweep(t0 + Duration::from_millis(100));
        assert!(!r.is_wanted("c0") && !r.is_wanted("c1"));
        assert!(r.is_wanted("c2") && r.is_wanted(&format!("c{}", MAX_LINGERING + 1)));
    }

    #[test]
    fn a_channel_dropped_by_the_server_is_resubscribed_and_its_waiter_woken() {
        let r = Registry::default();
        let (notify, _) = r.take("a");
        r.take_changes(&subscribed(&[]));
        r.set_live(&["a".into()]);
        r.dropped_by_server("a");
        // The waiter's wake-up is stored for it.
        let woken = notify.notify().notified();
        tokio::pin!(woken);
        assert!(woken.as_mut().enable(), "a permit was stored");
        // The task must subscribe it again though its old confirmation is gone.
        let changes = r.take_changes(&subscribed(&[]));
        assert_eq!(changes.subscribe, vec!["a".to_string()]);
        assert!(r.take_if_live("a").is_none());
    }

    #[test]
    fn dirty_channels_are_reported_once_and_only_when_out_of_line() {
        let r = Registry::default();
        r.take("a");
        r.take("b");
        r.mark_all_dirty();
        let changes = r.take_changes(&subscribed(&["b"]));
        assert_eq!(changes.subscribe, vec!["a".to_string()]);
        assert!(changes.unsubscribe.is_empty());
        // An unknown channel subscribed on the connection is unsubscribed when it turns dirty.
        r.dropped_by_server("zombie");
        let changes = r.take_changes(&subscribed(&["zombie"]));
        assert_eq!(changes.unsubscribe, vec!["zombie".to_string()]);
    }
}
