//! A waiter's mailbox: what the subscriber tells the waiters of one channel (wake-ups, the
//! message count, a direct grant, the sleepers of a semaphore).

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::sleepers::Sleepers;

/// A direct grant announced on a waiter's channel (PROTOCOL 8):
/// `fairlock:grant:<nonce>:<server ms>:<token>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The nonce of the call the grant is for.
    pub(crate) nonce: u64,
    /// The server time of the grant (Unix epoch ms).
    pub(crate) server_ms: i64,
    /// The fencing token (0 when the call asked for none).
    pub(crate) token: u64,
}

impl Grant {
    /// Reads a grant payload; `None` for any other message (`0`, Redisson's payloads).
    pub(crate) fn parse(payload: &[u8]) -> Option<Grant> {
        let text = std::str::from_utf8(payload).ok()?;
        let mut parts = text.strip_prefix("fairlock:grant:")?.split(':');
        let grant = Grant {
            nonce: parts.next()?.parse().ok()?,
            server_ms: parts.next()?.parse().ok()?,
            token: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && grant.nonce != 0).then_some(grant)
    }
}

/// What the waiters of one channel are woken through: a `Notify` poked once per message, and the
/// last direct grant announced on the channel, kept until a waiter takes it.
///
/// A read-write lock's channel also has a broadcast side: every message wakes every reader
/// waiting on [`readers`](Self::readers) (a writer leaving may let all of them in at once) and
/// counts one in [`seq`](Self::seq), which such a waiter reads before its attempt and checks
/// before it sleeps, so a message that came in between is never missed (`notify_waiters` stores no
/// permit). Its writers wait on [`notify`](Self::notify), one woken per message, as for a
/// non-fair lock: only one of them can get in. A count-down latch's channel has the broadcast
/// side too, and all its waiters use it (a latch reaching zero opens for all). A semaphore's
/// channel counts its messages in `seq` as well, but its waiters sleep among its
/// [`sleepers`](Self::sleepers): a message carrying the available count wakes only those it can
/// serve (see `sleepers.rs`).
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    notify: Notify,
    grant: Mutex<Option<Grant>>,
    /// A read-write lock's channel (or its writer-preferring turns channel), a semaphore's or a
    /// count-down latch's: the broadcast side is used.
    broadcast: bool,
    readers: Notify,
    seq: std::sync::atomic::AtomicU64,
    /// The turns channel of a writer-preferring queue: its last announcement
    /// `(head, first writer)`, `None` after a wake-up without one (then every waiter looks).
    turns: bool,
    turn: Mutex<Option<(u64, u64)>>,
    /// A semaphore's channel: its waiters, woken by the counts its messages carry.
    sleepers: Option<Arc<Sleepers>>,
}

impl Mailbox {
    /// The mailbox of `channel`, with a broadcast side for a read-write lock's, a semaphore's or
    /// a count-down latch's channel.
    pub(crate) fn for_channel(channel: &str) -> Self {
        let under = |prefix: &str| {
            channel
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(':'))
        };
        let turns = under(crate::keys::RW_TURNS_PREFIX);
        let semaphore = under(crate::keys::SEMAPHORE_CHANNEL_PREFIX);
        Mailbox {
            broadcast: turns
                || semaphore
                || under(crate::keys::RW_CHANNEL_PREFIX)
                || channel.starts_with(crate::keys::COUNT_DOWN_CHANNEL_PREFIX),
            turns,
            sleepers: semaphore.then(Arc::default),
            ..Mailbox::default()
        }
    }

    /// The last turns announcement `(head, first writer)` of a writer-preferring queue, `None`
    /// when there was none or a wake-up without one came after it.
    pub(crate) fn turn(&self) -> Option<(u64, u64)> {
        *self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Poked once per message on the channel (a permit is stored when nobody is waiting).
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// A read-write lock's broadcast side: every registered waiter is woken by each message.
    pub(crate) fn readers(&self) -> &Notify {
        &self.readers
    }

    /// A semaphore channel's waiters (`None` for any other channel).
    pub(crate) fn sleepers(&self) -> Option<&Arc<Sleepers>> {
        self.sleepers.as_ref()
    }

    /// Messages (and wake-ups) the broadcast side has had so far.
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Wakes without a message (a heartbeat's finding, a reconnect): one waiter on
    /// [`notify`](Self::notify), and every one on the broadcast side.
    pub(crate) fn wake(&self) {
        if self.turns {
            *self.turn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if self.broadcast {
            self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.readers.notify_waiters();
        }
        if let Some(sleepers) = &self.sleepers {
            sleepers.wake_all();
        }
        self.notify.notify_one();
    }

    /// A message arrived: keeps it when it is a grant, then wakes (see [`wake`](Self::wake)).
    pub(super) fn post(&self, payload: &[u8]) {
        if let Some(grant) = Grant::parse(payload) {
            *self.grant.lock().unwrap_or_else(|p| p.into_inner()) = Some(grant);
        }
        if self.turns {
            let turn = std::str::from_utf8(payload).ok().and_then(|text| {
                let (head, writer) = text.split_once(':')?;
                Some((head.parse().ok()?, writer.parse().ok()?))
            });
            *self.turn.lock().unwrap_or_else(|p| p.into_inner()) = turn;
            self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.readers.notify_waiters();
            return;
        }
        if let Some(sleepers) = &self.sleepers {
            // A semaphore's message is its available count (PROTOCOL 11): wake whom it serves.
            let count = std::str::from_utf8(payload)
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok());
            if let Some(count) = count {
                self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.readers.notify_waiters();
                sleepers.counted(count);
                self.notify.notify_one();
                return;
            }
        }
        self.wake();
    }

    /// Takes the grant announced last, if any.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        self.grant.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[cfg(test)]
mod tests {
    use super::{Grant, Mailbox};

    #[tokio::test]
    async fn a_read_write_channel_wakes_every_reader_and_one_writer() {
        let mail = Mailbox::for_channel("redisson_rwlock:{docs}");
        let (r1, r2) = (mail.readers().notified(), mail.readers().notified());
        tokio::pin!(r1, r2);
        r1.as_mut().enable();
        r2.as_mut().enable();
        let before = mail.seq();
        mail.post(b"1");
        assert_eq!(mail.seq(), before + 1);
        r1.await;
        r2.await;
        // The writers' side keeps a permit for one writer.
        mail.notify().notified().await;
        // A plain lock's channel has no broadcast side.
        let plain = Mailbox::for_channel("redisson_lock__channel:{docs}");
        plain.post(b"0");
        assert_eq!(plain.seq(), 0);
    }

    #[test]
    fn turns_announcements_are_kept_and_a_wake_up_without_one_clears_them() {
        let turns = Mailbox::for_channel("fairlock_rw_turns:{docs}");
        assert_eq!(turns.turn(), None);
        turns.post(b"12:15");
        assert_eq!(turns.turn(), Some((12, 15)));
        assert_eq!(turns.seq(), 1);
        turns.post(b"nonsense");
        assert_eq!(
            turns.turn(),
            None,
            "an unreadable announcement makes everyone look"
        );
        turns.post(b"13:0");
        turns.wake();
        assert_eq!(turns.turn(), None);
        assert_eq!(turns.seq(), 4);
    }

    #[test]
    fn grants_are_read_and_anything_else_is_not_one() {
        assert_eq!(
            Grant::parse(b"fairlock:grant:42:1732550000123:7"),
            Some(Grant {
                nonce: 42,
                server_ms: 1_732_550_000_123,
                token: 7
            })
        );
        for other in [
            &b"0"[..],
            b"1",
            b"fairlock:grant:",
            b"fairlock:grant:0:1:0",
            b"fairlock:grant:1:2",
            b"fairlock:grant:1:2:3:4",
            b"fairlock:grant:x:2:3",
            b"\xff",
        ] {
            assert_eq!(Grant::parse(other), None, "{other:?}");
        }
    }
}
