//! What a lock is on the wire: its kind, every Redis key and channel name derived from its name
//! (PROTOCOL 1), the name checks behind them, and the cluster slot they all share. Pure data: no
//! I/O here.
//!
//! It must never let one lock's keys straddle cluster slots: in cluster mode `validate` refuses
//! names whose derived keys would land elsewhere than the name.

use std::sync::Arc;

use crate::error::{Error, Result};

const RELEASE_CHANNEL_PREFIX: &str = "redisson_lock__channel";
const QUEUE_PREFIX: &str = "redisson_lock_queue";
const DEADLINES_PREFIX: &str = "redisson_lock_timeout";
const TOKEN_PREFIX: &str = "redisson_lock_token";
const LIVENESS_PREFIX: &str = "fairlock_liveness";

/// Every Redis name one lock uses, derived once per handle and kept back to back in one
/// allocation (a held lock keeps its names for as long as it is held, so this stays small).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The owner hash name, release channel, queue, deadline set, fencing counter and liveness
    /// set, concatenated.
    buf: Box<str>,
    /// Where each of the six names ends in `buf`.
    ends: [u32; 6],
}

impl LockKeys {
    /// Derives the names for `name`. Call [`validate`] first.
    pub(crate) fn new(name: &str) -> Self {
        let mut buf = String::with_capacity(6 * name.len() + 112);
        let mut ends = [0u32; 6];
        buf.push_str(name);
        ends[0] = buf.len() as u32;
        for (i, prefix) in [
            RELEASE_CHANNEL_PREFIX,
            QUEUE_PREFIX,
            DEADLINES_PREFIX,
            TOKEN_PREFIX,
            LIVENESS_PREFIX,
        ]
        .into_iter()
        .enumerate()
        {
            push_derived(&mut buf, prefix, name);
            ends[i + 1] = buf.len() as u32;
        }
        LockKeys {
            buf: buf.into_boxed_str(),
            ends,
        }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.buf[start..self.ends[i] as usize]
    }

    /// The owner hash: the lock name itself.
    pub(crate) fn name(&self) -> &str {
        self.part(0)
    }

    /// Release channel; the fair lock's per-waiter channels are this plus `:<owner field>`.
    pub(crate) fn channel(&self) -> &str {
        self.part(1)
    }

    /// Fair waiter queue (list).
    pub(crate) fn queue(&self) -> &str {
        self.part(2)
    }

    /// Fair waiter deadlines (sorted set).
    pub(crate) fn deadlines(&self) -> &str {
        self.part(3)
    }

    /// Fencing token counter.
    pub(crate) fn token(&self) -> &str {
        self.part(4)
    }

    /// fairlock's own liveness marks of its fair waiters (sorted set; PROTOCOL 7).
    pub(crate) fn liveness(&self) -> &str {
        self.part(5)
    }

    /// The per-waiter channel of a fair waiter (PROTOCOL 1).
    pub(crate) fn waiter_channel(&self, field: &str) -> String {
        format!("{}:{}", self.channel(), field)
    }
}

/// Redisson's prefix rule, byte for byte: a name containing `{` anywhere is used as is (the user
/// chose the hash tag), any other name is wrapped in braces so every derived key shares its slot.
fn push_derived(buf: &mut String, prefix: &str, name: &str) {
    buf.push_str(prefix);
    if name.contains('{') {
        buf.push(':');
        buf.push_str(name);
    } else {
        buf.push_str(":{");
        buf.push_str(name);
        buf.push('}');
    }
}

/// The hash tag Redis Cluster would use for `key`, if any: the bytes between the first `{` and the
/// first `}` after it, when that is not empty.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key when it
/// has none, modulo 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16(hashed.as_bytes()) & 0x3fff
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Checks a lock name. `cluster` adds the rule that every key derived from the name lands in
/// the name's own slot: Redisson's prefix rule only guarantees that for names without braces, or
/// with a proper hash tag; a name like `a{b` (no tag) or `x}y` (the brace the rule adds closes
/// early) would spread one lock over several slots (CROSSSLOT).
pub(crate) fn validate(name: &str, cluster: bool) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName {
            name: name.to_owned(),
            reason: "a lock name must not be empty",
        });
    }
    if cluster {
        let keys = LockKeys::new(name);
        let home = slot(name);
        let derived = [
            keys.channel(),
            keys.queue(),
            keys.deadlines(),
            keys.token(),
            keys.liveness(),
        ];
        if derived.iter().any(|key| slot(key) != home) {
            return Err(Error::InvalidName {
                name: name.to_owned(),
                reason: "in cluster mode the name's keys must share one slot: use a name without \
                         braces, or one with a non-empty hash tag like {tag}",
            });
        }
    }
    Ok(())
}

/// Which Redisson layout a lock uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `RFairLock`: owner hash plus waiter queue and deadline zset.
    Fair,
    /// `RLock`: owner hash only; waiters listen on the shared release channel.
    NonFair,
}

/// What a handle needs to talk about one lock: its kind and every derived name.
#[derive(Debug)]
pub(crate) struct LockSpec {
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
}

impl LockSpec {
    pub(crate) fn new(kind: Kind, name: &str) -> Arc<Self> {
        Arc::new(LockSpec {
            kind,
            keys: LockKeys::new(name),
        })
    }

    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    /// The channel a waiter of this lock listens on: its own per-waiter channel for a fair lock,
    /// the shared release channel for a non-fair one.
    pub(crate) fn wake_channel(&self, field: &str) -> String {
        match self.kind {
            Kind::Fair => self.keys.waiter_channel(field),
            Kind::NonFair => self.keys.channel().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_get_braces() {
        let k = LockKeys::new("orders:42");
        assert_eq!(k.name(), "orders:42");
        assert_eq!(k.channel(), "redisson_lock__channel:{orders:42}");
        assert_eq!(k.queue(), "redisson_lock_queue:{orders:42}");
        assert_eq!(k.deadlines(), "redisson_lock_timeout:{orders:42}");
        assert_eq!(k.token(), "redisson_lock_token:{orders:42}");
        assert_eq!(k.liveness(), "fairlock_liveness:{orders:42}");
        assert_eq!(
            k.waiter_channel("u:7"),
            "redisson_lock__channel:{orders:42}:u:7"
        );
    }

    #[test]
    fn names_with_a_brace_are_used_as_is() {
        let k = LockKeys::new("{user1}:cart");
        assert_eq!(k.queue(), "redisson_lock_queue:{user1}:cart");
        let k = LockKeys::new("a{b");
        assert_eq!(k.deadlines(), "redisson_lock_timeout:a{b");
    }

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        assert_eq!(hash_tag("{user1000}.following"), Some("user1000"));
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("foo{bar}{zap}"), Some("bar"));
        assert_eq!(hash_tag("plain"), None);
        assert_eq!(hash_tag("open{only"), None);
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The check value of CRC16/XMODEM, as given in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot("123456789"), 0x31c3 & 0x3fff);
        // A key and its hash tag share a slot; every derived key of a lock shares the name's.
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        let k = LockKeys::new("orders:42");
        for key in [k.channel(), k.queue(), k.deadlines(), k.token()] {
            assert_eq!(slot(key), slot("orders:42"));
        }
    }

    #[test]
    fn validation() {
        assert!(matches!(
            validate("", false),
            Err(Error::InvalidName { .. })
        ));
        assert!(validate("a{b", false).is_ok());
        assert!(matches!(
            validate("a{b", true),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            validate("a{}b", true),
            Err(Error::InvalidName { .. })
        ));
        assert!(validate("a{b}", true).is_ok());
        assert!(validate("plain", true).is_ok());
        // No brace to open a tag, but the one the prefix rule adds closes early: "{x}y}".
        assert!(matches!(
            validate("x}y", true),
            Err(Error::InvalidName { .. })
        ));
        assert!(validate("x}y", false).is_ok());
        assert!(validate("{t}x}y", true).is_ok());
    }

    #[test]
    fn derived_keys_share_the_hash_tag_of_tagged_names() {
        let k = LockKeys::new("{t}x");
        for key in [
            k.channel(),
            k.queue(),
            k.deadlines(),
            k.token(),
            k.liveness(),
        ] {
            assert_eq!(hash_tag(key), Some("t"));
        }
        let k = LockKeys::new("plain");
        for key in [k.channel(), k.queue(), k.deadlines(), k.token()] {
            assert_eq!(hash_tag(key), Some("plain"));
        }
    }
}
