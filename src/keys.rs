//! Every Redis key and channel one lock uses, derived from its name, as Redisson names them
//! ([`crate::protocol`], sections 1 and 2): the owner hash, the release channel
//! and the fair waiters' own channels, the waiter queue, the deadline set, the fencing counter,
//! Redisson's unlock latches and fairlock's liveness set. Also the rule that checks a name, the
//! Redis Cluster slot every key of a lock shares, and the shape of an owner field. Pure data: no
//! I/O here.
//!
//! The library uses these names itself; they are public for tools that look at locks from the
//! outside (the `fairlock` command-line tool does) and must agree with the library byte for byte.
//!
//! ```
//! use fairlock::keys::{self, LockKeys};
//!
//! let k = LockKeys::new("orders:42");
//! assert_eq!(k.queue(), "redisson_lock_queue:{orders:42}");
//! assert_eq!(k.waiter_channel("u:7"), "redisson_lock__channel:{orders:42}:u:7");
//! // Every key of the lock lands in the slot of its name.
//! assert_eq!(keys::slot(k.deadlines()), keys::slot("orders:42"));
//! ```
//!
//! It must never let one lock's keys straddle cluster slots: in cluster mode [`check_name`]
//! refuses names whose derived keys would land elsewhere than the name.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Prefix of the release channel, `redisson_lock__channel:{NAME}` (two underscores); a fair
/// waiter's own channel is that channel, `:`, and its owner field.
pub const CHANNEL_PREFIX: &str = "redisson_lock__channel";
/// Prefix of a fair lock's waiter queue, `redisson_lock_queue:{NAME}` (a list of owner fields).
pub const QUEUE_PREFIX: &str = "redisson_lock_queue";
/// Prefix of a fair lock's deadline set, `redisson_lock_timeout:{NAME}` (a sorted set: owner
/// field, deadline in epoch milliseconds).
pub const DEADLINES_PREFIX: &str = "redisson_lock_timeout";
/// Prefix of the fencing counter, `redisson_lock_token:{NAME}` (an integer string).
pub const TOKEN_PREFIX: &str = "redisson_lock_token";
/// Prefix of fairlock's own liveness marks of its fair waiters, `fairlock_liveness:{NAME}` (a
/// sorted set: owner field, the server time by which the waiter must show life again).
pub const LIVENESS_PREFIX: &str = "fairlock_liveness";
/// Prefix of fairlock's own grant requests of its fair waiters, `fairlock_grants:{NAME}` (a
/// hash: owner field, `<lease ms>:<fenced 0|1>:<call nonce>`; what a queued waiter asks for when
/// the lock is handed to it directly, [PROTOCOL 8](crate::protocol)).
pub const GRANTS_PREFIX: &str = "fairlock_grants";
/// Prefix of a read-write lock's channel, `redisson_rwlock:{NAME}`, shared by its readers and
/// writers ([PROTOCOL 10](crate::protocol)): `0` when the last reader left, `1` when a writer did.
pub const RW_CHANNEL_PREFIX: &str = "redisson_rwlock";
/// What a read hold's lease key ends in before its number:
/// `{NAME}:<owner field>:rwlock_timeout:<k>` (Redisson's suffix form; [`LockKeys::lease_key`]).
pub const LEASE_KEY_SUFFIX: &str = "rwlock_timeout";
/// Prefix of the arrival queue of a read-write lock's writer-preferring waiters,
/// `fairlock_rw_queue:{NAME}` (a sorted set: owner field, arrival number; fairlock only,
/// [PROTOCOL 10](crate::protocol)).
pub const RW_QUEUE_PREFIX: &str = "fairlock_rw_queue";
/// Prefix of the writers among them, `fairlock_rw_writers:{NAME}` (a sorted set: writer field,
/// arrival number).
pub const RW_WRITERS_PREFIX: &str = "fairlock_rw_writers";
/// Prefix of their liveness marks, `fairlock_rw_liveness:{NAME}` (a sorted set: owner field, the
/// server time by which the waiter must show life again).
pub const RW_LIVENESS_PREFIX: &str = "fairlock_rw_liveness";
/// Prefix of the counter that numbers their arrivals, `fairlock_rw_seq:{NAME}`.
pub const RW_SEQ_PREFIX: &str = "fairlock_rw_seq";
/// Prefix of the channel on which fairlock's scripts announce who may enter next among
/// writer-preferring waiters, `fairlock_rw_turns:{NAME}`: payload `<head>:<first writer>`, the
/// arrival numbers of the queue's head and of its first writer (`0`: none). Redisson never
/// listens to it.
pub const RW_TURNS_PREFIX: &str = "fairlock_rw_turns";
/// Prefix of Redisson's unlock latches, `redisson_unlock_latch:{NAME}:<request id>` (strings
/// with a PX). fairlock never writes one.
pub const LATCH_PREFIX: &str = "redisson_unlock_latch";

/// Prefix of a semaphore's channel, `redisson_sc:{NAME}` (Redisson's `RSemaphore` and
/// `RPermitExpirableSemaphore`): every release publishes the new number of available permits
/// ([PROTOCOL 11](crate::protocol)).
pub const SEMAPHORE_CHANNEL_PREFIX: &str = "redisson_sc";
/// What a count-down latch's channel starts with. Redisson always adds braces after it,
/// `redisson_countdownlatch__channel__{NAME}`, whatever the name: `0` when the count reached
/// zero, `1` when it was set or the latch deleted ([PROTOCOL 12](crate::protocol)).
pub const COUNT_DOWN_CHANNEL_PREFIX: &str = "redisson_countdownlatch__channel__";
/// What fairlock's call marks end in before the call id: `{NAME}:fairlock_call:<id>` (Redisson's
/// suffix form; strings with a PX). A semaphore or latch write that is not idempotent records
/// its call id there, so a resend after a lost reply is applied at most once
/// ([PROTOCOL 11](crate::protocol)). Redisson never reads them.
pub const CALL_MARK_SUFFIX: &str = "fairlock_call";

/// What a permit-expirable semaphore's expiries are named with in the suffix form:
/// `{NAME}:timeout` (Redisson's `RPermitExpirableSemaphore`; a sorted set of raw 16-byte permit
/// ids scored by their expiry in ms since the epoch, [PROTOCOL 11](crate::protocol)).
pub const PERMIT_TIMEOUT_SUFFIX: &str = "timeout";

/// The expiries key of a permit-expirable semaphore: `{NAME}:timeout` (or `NAME:timeout` when
/// the name has a `{`).
///
/// ```
/// assert_eq!(fairlock::keys::permit_expiries("jobs"), "{jobs}:timeout");
/// assert_eq!(fairlock::keys::permit_expiries("{t}jobs"), "{t}jobs:timeout");
/// ```
pub fn permit_expiries(name: &str) -> String {
    if name.contains('{') {
        format!("{name}:{PERMIT_TIMEOUT_SUFFIX}")
    } else {
        format!("{{{name}}}:{PERMIT_TIMEOUT_SUFFIX}")
    }
}

/// A semaphore's channel: `redisson_sc:{NAME}` ([`SEMAPHORE_CHANNEL_PREFIX`], prefix form).
///
/// ```
/// assert_eq!(fairlock::keys::semaphore_channel("jobs"), "redisson_sc:{jobs}");
/// ```
pub fn semaphore_channel(name: &str) -> String {
    derived(SEMAPHORE_CHANNEL_PREFIX, name)
}

/// A count-down latch's channel: `redisson_countdownlatch__channel__{NAME}`, braces always (for
/// a name with its own hash tag this channel hashes elsewhere; see [`check_latch_name`]).
///
/// ```
/// use fairlock::keys::count_down_channel;
///
/// assert_eq!(count_down_channel("boot"), "redisson_countdownlatch__channel__{boot}");
/// assert_eq!(count_down_channel("{t}boot"), "redisson_countdownlatch__channel__{{t}boot}");
/// ```
pub fn count_down_channel(name: &str) -> String {
    format!("{COUNT_DOWN_CHANNEL_PREFIX}{{{name}}}")
}

/// The mark of call `id` on `name`: `{NAME}:fairlock_call:<id>` (suffix form, NAME's slot).
///
/// ```
/// use fairlock::keys::call_mark;
///
/// assert_eq!(call_mark("jobs", "u:9"), "{jobs}:fairlock_call:u:9");
/// assert_eq!(call_mark("{t}jobs", "u:9"), "{t}jobs:fairlock_call:u:9");
/// ```
pub fn call_mark(name: &str, id: &str) -> String {
    if name.contains('{') {
        format!("{name}:{CALL_MARK_SUFFIX}:{id}")
    } else {
        format!("{{{name}}}:{CALL_MARK_SUFFIX}:{id}")
    }
}

/// Redisson's prefix rule, byte for byte: `prefix:NAME` when the name contains `{` anywhere (the
/// user chose the hash tag), `prefix:{NAME}` otherwise, so every derived key shares its slot.
///
/// ```
/// use fairlock::keys::{derived, LATCH_PREFIX};
///
/// assert_eq!(derived(LATCH_PREFIX, "orders:42"), "redisson_unlock_latch:{orders:42}");
/// assert_eq!(derived(LATCH_PREFIX, "{user1}:cart"), "redisson_unlock_latch:{user1}:cart");
/// ```
pub fn derived(prefix: &str, name: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + name.len() + 3);
    push_derived(&mut out, prefix, name);
    out
}

/// Every Redis name one lock uses: its owner hash, release channel, waiter queue, deadline set,
/// fencing counter and liveness set. Derived once (the library keeps one per handle, back to back
/// in one allocation, since a held lock keeps its names for as long as it is held).
///
/// ```
/// use fairlock::keys::LockKeys;
///
/// let k = LockKeys::new("{user1}:cart");
/// assert_eq!(k.name(), "{user1}:cart");
/// assert_eq!(k.channel(), "redisson_lock__channel:{user1}:cart");
/// assert_eq!(k.liveness(), "fairlock_liveness:{user1}:cart");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The owner hash name, release channel, queue, deadline set, fencing counter, liveness set
    /// and grant requests, concatenated.
    buf: Box<str>,
    /// Where each of the nine names ends in `buf`.
    ends: [u32; 9],
}

impl LockKeys {
    /// Derives the names for `name`. Any name derives; [`check_name`] says whether a client
    /// can use it.
    pub fn new(name: &str) -> Self {
        let mut buf = String::with_capacity(9 * name.len() + 150);
        let mut ends = [0u32; 9];
        buf.push_str(name);
        ends[0] = buf.len() as u32;
        for (i, prefix) in [
            CHANNEL_PREFIX,
            QUEUE_PREFIX,
            DEADLINES_PREFIX,
            TOKEN_PREFIX,
            LIVENESS_PREFIX,
            GRANTS_PREFIX,
        ]
        .into_iter()
        .enumerate()
        {
            push_derived(&mut buf, prefix, name);
            ends[i + 1] = buf.len() as u32;
        }
        push_derived(&mut buf, RW_CHANNEL_PREFIX, name);
        ends[7] = buf.len() as u32;
        // Redisson's suffix form without a suffix: `{NAME}`, or NAME when it has a `{`.
        if name.contains('{') {
            buf.push_str(name);
        } else {
            buf.push('{');
            buf.push_str(name);
            buf.push('}');
        }
        ends[8] = buf.len() as u32;
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
    pub fn name(&self) -> &str {
        self.part(0)
    }

    /// The release channel; a fair lock's per-waiter channels are this plus `:<owner field>`.
    pub fn channel(&self) -> &str {
        self.part(1)
    }

    /// The fair waiter queue (a list of owner fields).
    pub fn queue(&self) -> &str {
        self.part(2)
    }

    /// The fair waiter deadlines (a sorted set).
    pub fn deadlines(&self) -> &str {
        self.part(3)
    }

    /// The fencing token counter.
    pub fn token(&self) -> &str {
        self.part(4)
    }

    /// fairlock's own liveness marks of its fair waiters (sorted set; [PROTOCOL 7]).
    ///
    /// [PROTOCOL 7]: crate::protocol
    pub fn liveness(&self) -> &str {
        self.part(5)
    }

    /// fairlock's own grant requests of its fair waiters (hash; [PROTOCOL 8]).
    ///
    /// [PROTOCOL 8]: crate::protocol
    pub fn grants(&self) -> &str {
        self.part(6)
    }

    /// The channel of a read-write lock of this name, shared by its readers and writers
    /// (`redisson_rwlock:{NAME}`).
    pub fn rw_channel(&self) -> &str {
        self.part(7)
    }

    /// What a read hold's lease keys are named from: `{NAME}`, or NAME itself when it contains
    /// `{` (Redisson's suffix form), in NAME's slot either way.
    pub fn lease_base(&self) -> &str {
        self.part(8)
    }

    /// The lease key of read hold number `k` (1 = the first) of owner field `field`:
    /// `{NAME}:<field>:rwlock_timeout:<k>`, a string with the hold's lease as its TTL.
    ///
    /// ```
    /// use fairlock::keys::LockKeys;
    ///
    /// let k = LockKeys::new("docs");
    /// assert_eq!(k.lease_key("u:7", 2), "{docs}:u:7:rwlock_timeout:2");
    /// assert_eq!(LockKeys::new("{t}docs").lease_key("u:7", 1), "{t}docs:u:7:rwlock_timeout:1");
    /// ```
    pub fn lease_key(&self, field: &str, k: u32) -> String {
        format!("{}:{field}:{LEASE_KEY_SUFFIX}:{k}", self.lease_base())
    }

    /// The keys of a read-write lock's writer-preferring waiters: the arrival queue, the
    /// writers among them, their liveness marks and the arrival counter (fairlock's own, in
    /// NAME's slot; they exist only while such a waiter is queued).
    ///
    /// ```
    /// use fairlock::keys::LockKeys;
    ///
    /// let [queue, writers, liveness, seq] = LockKeys::new("docs").rw_queue_keys();
    /// assert_eq!(queue, "fairlock_rw_queue:{docs}");
    /// assert_eq!(writers, "fairlock_rw_writers:{docs}");
    /// assert_eq!(liveness, "fairlock_rw_liveness:{docs}");
    /// assert_eq!(seq, "fairlock_rw_seq:{docs}");
    /// ```
    pub fn rw_queue_keys(&self) -> [String; 4] {
        let name = self.name();
        [
            derived(RW_QUEUE_PREFIX, name),
            derived(RW_WRITERS_PREFIX, name),
            derived(RW_LIVENESS_PREFIX, name),
            derived(RW_SEQ_PREFIX, name),
        ]
    }

    /// The channel announcing turns among a read-write lock's writer-preferring waiters
    /// (`fairlock_rw_turns:{NAME}`, [`RW_TURNS_PREFIX`]).
    pub fn rw_turns_channel(&self) -> String {
        derived(RW_TURNS_PREFIX, self.name())
    }

    /// The channel of one fair waiter: the release channel, `:`, its owner field.
    pub fn waiter_channel(&self, field: &str) -> String {
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
///
/// ```
/// use fairlock::keys::hash_tag;
///
/// assert_eq!(hash_tag("{user1000}.following"), Some("user1000"));
/// assert_eq!(hash_tag("foo{}{bar}"), None);
/// ```
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key when it
/// has none, modulo 16384.
///
/// ```
/// assert_eq!(fairlock::keys::slot("{user1000}.following"), fairlock::keys::slot("user1000"));
/// ```
pub fn slot(key: &str) -> u16 {
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

/// Why a lock name cannot be used (see [`check_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NameProblem {
    /// The name is empty.
    Empty,
    /// In cluster mode, some key derived from the name would land in another slot than the name
    /// itself (CROSSSLOT).
    CrossSlot,
    /// In cluster mode, a count-down latch's channel would land in another slot than its key:
    /// Redisson always wraps the whole name in braces (`redisson_countdownlatch__channel__{NAME}`),
    /// so a name with its own hash tag (`{user1}:latch`) gets a channel tagged `{user1`, and
    /// Redisson's own scripts on it fail with CROSSSLOT.
    LatchChannelSlot,
}

impl NameProblem {
    /// The problem in words (the reason of [`Error::InvalidName`]).
    pub fn reason(self) -> &'static str {
        match self {
            NameProblem::Empty => "a lock name must not be empty",
            NameProblem::CrossSlot => {
                "in cluster mode the name's keys must share one slot: use a name without braces, \
                 or one with a non-empty hash tag like {tag}"
            }
            NameProblem::LatchChannelSlot => {
                "in cluster mode a count-down latch's name must not contain braces: Redisson names \
                 its channel redisson_countdownlatch__channel__{NAME}, which for a hash-tagged name \
                 lands in another slot than the latch (Redisson's scripts fail with CROSSSLOT there)"
            }
        }
    }
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for NameProblem {}

/// Checks a lock name, as every client call does before touching Redis. `cluster` adds the rule
/// that every key derived from the name lands in the name's own slot: Redisson's prefix rule only
/// guarantees that for names without braces, or with a proper hash tag; a name like `a{b` (no
/// tag) or `x}y` (the brace the rule adds closes early) would spread one lock over several slots.
///
/// ```
/// use fairlock::keys::{check_name, NameProblem};
///
/// assert_eq!(check_name("orders:42", true), Ok(()));
/// assert_eq!(check_name("{orders}:42", true), Ok(()));
/// assert_eq!(check_name("a{b", false), Ok(()));
/// assert_eq!(check_name("a{b", true), Err(NameProblem::CrossSlot));
/// assert_eq!(check_name("", false), Err(NameProblem::Empty));
/// ```
pub fn check_name(name: &str, cluster: bool) -> std::result::Result<(), NameProblem> {
    if name.is_empty() {
        return Err(NameProblem::Empty);
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
            keys.grants(),
            keys.rw_channel(),
            keys.lease_base(),
        ];
        if derived.iter().any(|key| slot(key) != home) {
            return Err(NameProblem::CrossSlot);
        }
    }
    Ok(())
}

/// Checks a count-down latch's name: [`check_name`], and in cluster mode also that Redisson's
/// always-braced channel ([`count_down_channel`]) hashes to the latch's own slot, which holds
/// exactly for names without braces.
///
/// ```
/// use fairlock::keys::{check_latch_name, NameProblem};
///
/// assert_eq!(check_latch_name("boot", true), Ok(()));
/// assert_eq!(check_latch_name("{user1}:latch", false), Ok(()));
/// assert_eq!(check_latch_name("{user1}:latch", true), Err(NameProblem::LatchChannelSlot));
/// ```
pub fn check_latch_name(name: &str, cluster: bool) -> std::result::Result<(), NameProblem> {
    check_name(name, cluster)?;
    if cluster && slot(&count_down_channel(name)) != slot(name) {
        return Err(NameProblem::LatchChannelSlot);
    }
    Ok(())
}

/// [`check_latch_name`] as the library's error.
pub(crate) fn validate_latch(name: &str, cluster: bool) -> Result<()> {
    check_latch_name(name, cluster).map_err(|problem| Error::InvalidName {
        name: name.to_owned(),
        reason: problem.reason(),
    })
}

/// [`check_name`] as the library's error.
pub(crate) fn validate(name: &str, cluster: bool) -> Result<()> {
    check_name(name, cluster).map_err(|problem| Error::InvalidName {
        name: name.to_owned(),
        reason: problem.reason(),
    })
}

/// Which derived key of a lock a key is (see [`parse_derived`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum DerivedKey {
    /// The fair waiter queue, [`QUEUE_PREFIX`].
    Queue,
    /// The fair waiter deadlines, [`DEADLINES_PREFIX`].
    Deadlines,
    /// fairlock's liveness marks, [`LIVENESS_PREFIX`].
    Liveness,
    /// fairlock's grant requests, [`GRANTS_PREFIX`].
    Grants,
    /// The fencing counter, [`TOKEN_PREFIX`].
    Token,
    /// One of Redisson's unlock latches, [`LATCH_PREFIX`].
    Latch,
    /// A read-write lock's writer-preferring queue, [`RW_QUEUE_PREFIX`].
    RwQueue,
    /// The writers in it, [`RW_WRITERS_PREFIX`].
    RwWriters,
    /// Their liveness marks, [`RW_LIVENESS_PREFIX`].
    RwLiveness,
    /// Their arrival counter, [`RW_SEQ_PREFIX`].
    RwSeq,
    /// The lease key of one read hold, `{NAME}:<field>:rwlock_timeout:<k>`
    /// ([`LockKeys::lease_key`]).
    ReadLease,
}

impl DerivedKey {
    /// A short stable label: `queue`, `deadlines`, `liveness`, `grants`, `fencing`, `latch`,
    /// `rw_queue`, `rw_writers`, `rw_liveness`, `rw_seq` or `lease` (what the `fairlock` tool
    /// prints as a key's role).
    pub fn label(self) -> &'static str {
        match self {
            DerivedKey::Queue => "queue",
            DerivedKey::Deadlines => "deadlines",
            DerivedKey::Liveness => "liveness",
            DerivedKey::Grants => "grants",
            DerivedKey::Token => "fencing",
            DerivedKey::Latch => "latch",
            DerivedKey::RwQueue => "rw_queue",
            DerivedKey::RwWriters => "rw_writers",
            DerivedKey::RwLiveness => "rw_liveness",
            DerivedKey::RwSeq => "rw_seq",
            DerivedKey::ReadLease => "lease",
        }
    }

    /// The Redis type the key holds (`TYPE` answers it): `"list"`, `"zset"`, `"hash"` or
    /// `"string"`. A key of another type under a derived name is not the library's.
    pub fn value_type(self) -> &'static str {
        match self {
            DerivedKey::Queue => "list",
            DerivedKey::Grants => "hash",
            DerivedKey::Deadlines
            | DerivedKey::Liveness
            | DerivedKey::RwQueue
            | DerivedKey::RwWriters
            | DerivedKey::RwLiveness => "zset",
            DerivedKey::Token | DerivedKey::Latch | DerivedKey::RwSeq | DerivedKey::ReadLease => {
                "string"
            }
        }
    }
}

/// The lock name and kind of a derived key (`redisson_lock_queue:{orders}` is the queue of
/// `orders`), or `None` for any other key. `{NAME}` is read as the braces of the prefix rule: a
/// lock named `x` and one named `{x}` share every derived key in Redisson's layout, so they cannot
/// be told apart here either.
///
/// ```
/// use fairlock::keys::{parse_derived, DerivedKey};
///
/// assert_eq!(
///     parse_derived("redisson_lock_queue:{orders}"),
///     Some(("orders", DerivedKey::Queue))
/// );
/// assert_eq!(
///     parse_derived("redisson_unlock_latch:{t}x:0a1b2c"),
///     Some(("{t}x", DerivedKey::Latch))
/// );
/// assert_eq!(
///     parse_derived("{docs}:6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:57:rwlock_timeout:2"),
///     Some(("docs", DerivedKey::ReadLease))
/// );
/// assert_eq!(parse_derived("orders"), None);
/// ```
pub fn parse_derived(key: &str) -> Option<(&str, DerivedKey)> {
    if let Some(name) = parse_lease_key(key) {
        return Some((name, DerivedKey::ReadLease));
    }
    for (prefix, kind) in [
        (QUEUE_PREFIX, DerivedKey::Queue),
        (DEADLINES_PREFIX, DerivedKey::Deadlines),
        (LIVENESS_PREFIX, DerivedKey::Liveness),
        (GRANTS_PREFIX, DerivedKey::Grants),
        (TOKEN_PREFIX, DerivedKey::Token),
        (LATCH_PREFIX, DerivedKey::Latch),
        (RW_QUEUE_PREFIX, DerivedKey::RwQueue),
        (RW_WRITERS_PREFIX, DerivedKey::RwWriters),
        (RW_LIVENESS_PREFIX, DerivedKey::RwLiveness),
        (RW_SEQ_PREFIX, DerivedKey::RwSeq),
    ] {
        let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        let rest = if kind == DerivedKey::Latch {
            // `<derived>:<request id>`; Redisson's request ids are hex, without a colon.
            rest.rsplit_once(':')?.0
        } else {
            rest
        };
        let name = match rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            Some(inner) if !inner.contains('{') => inner,
            _ => rest,
        };
        if name.is_empty() {
            return None;
        }
        return Some((name, kind));
    }
    None
}

/// The lock name of a read hold's lease key `<base>:<client id>:<holder id>:rwlock_timeout:<k>`
/// (`<base>` = `{NAME}`, or NAME when it has a `{`).
fn parse_lease_key(key: &str) -> Option<&str> {
    let (rest, k) = key.rsplit_once(':')?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rest = rest.strip_suffix(LEASE_KEY_SUFFIX)?.strip_suffix(':')?;
    // `<base>:<client id>:<holder id>`: the owner field is the last two parts.
    let (rest, _holder) = rest.rsplit_once(':')?;
    let (base, _client) = rest.rsplit_once(':')?;
    let name = match base.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(inner) if !inner.contains('{') => inner,
        _ => base,
    };
    (!name.is_empty()).then_some(name)
}

/// Splits an owner field `<client id>:<holder id>` ([PROTOCOL 2]) at its last colon: the client
/// id, and the holder id when it is a number. A read-write lock's writer field
/// `<client id>:<holder id>:write` splits the same way (the suffix is dropped first).
///
/// ```
/// use fairlock::keys::split_field;
///
/// assert_eq!(split_field("6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:57").1, Some(57));
/// assert_eq!(split_field("c:57:write"), ("c", Some(57)));
/// assert_eq!(split_field("c:x"), ("c", None));
/// assert_eq!(split_field("c"), ("c", None));
/// ```
///
/// [PROTOCOL 2]: crate::protocol
pub fn split_field(field: &str) -> (&str, Option<i64>) {
    let field = field.strip_suffix(":write").unwrap_or(field);
    match field.rsplit_once(':') {
        Some((client, holder)) => (client, holder.parse().ok()),
        None => (field, None),
    }
}

/// Whether a hash field has the shape of an owner field as Redisson and fairlock write them: a
/// UUID (8-4-4-4-12 hex digits), a colon, a signed integer.
///
/// ```
/// use fairlock::keys::looks_like_owner_field;
///
/// assert!(looks_like_owner_field("6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:-3"));
/// assert!(!looks_like_owner_field("page:1"));
/// ```
pub fn looks_like_owner_field(field: &str) -> bool {
    matches!(split_field(field), (client, Some(_)) if looks_like_uuid(client))
}

/// Whether `s` has the shape of a UUID, as Redisson's and fairlock's client ids do.
fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Which Redisson layout a lock uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `RFairLock`: owner hash plus waiter queue and deadline zset.
    Fair,
    /// `RLock`: owner hash only; waiters listen on the shared release channel.
    NonFair,
    /// `RReadWriteLock`'s read lock: field `<owner>` plus one lease key per hold.
    Read,
    /// `RReadWriteLock`'s write lock: field `<owner>:write`.
    Write,
}

impl Kind {
    /// How errors and logs name the kind.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Fair => "fair",
            Kind::NonFair => "plain",
            Kind::Read => "read",
            Kind::Write => "write",
        }
    }

    /// Whether the kind is a side of a read-write lock.
    pub(crate) fn is_rw(self) -> bool {
        matches!(self, Kind::Read | Kind::Write)
    }
}

/// What a handle needs to talk about one lock: its kind and every derived name.
#[derive(Debug)]
pub(crate) struct LockSpec {
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
    /// A side of a read-write lock whose waiters queue in arrival order, writers first
    /// (`ReadWriteLock::writer_preferring`, PROTOCOL 10).
    pub(crate) prefer_writers: bool,
}

impl LockSpec {
    pub(crate) fn new(kind: Kind, name: &str) -> Arc<Self> {
        Arc::new(LockSpec {
            kind,
            keys: LockKeys::new(name),
            prefer_writers: false,
        })
    }

    /// A side of a read-write lock, writer-preferring or not.
    pub(crate) fn new_rw(kind: Kind, name: &str, prefer_writers: bool) -> Arc<Self> {
        Arc::new(LockSpec {
            kind,
            keys: LockKeys::new(name),
            prefer_writers: prefer_writers && kind.is_rw(),
        })
    }

    /// Whether waiters of this lock hold a place in a queue of fairlock's (a fair lock, or a
    /// writer-preferring read-write lock): they are heartbeaten while they wait and leave the
    /// queue when they stop waiting.
    pub(crate) fn queues(&self) -> bool {
        self.kind == Kind::Fair || self.prefer_writers
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
            Kind::Read | Kind::Write => self.keys.rw_channel().to_owned(),
        }
    }

    /// The channel releases of this lock are announced on.
    pub(crate) fn release_channel(&self) -> &str {
        if self.kind.is_rw() {
            self.keys.rw_channel()
        } else {
            self.keys.channel()
        }
    }

    /// The owner field of holder `base` (`<client uuid>:<holder id>`) on this lock: the same,
    /// plus `:write` for a write lock (Redisson's field of a writer).
    pub(crate) fn owner_field(&self, base: Arc<str>) -> Arc<str> {
        match self.kind {
            Kind::Write => format!("{base}:write").into(),
            _ => base,
        }
    }

    /// For a side of a read-write lock, the owner field the same holder has on the other side
    /// (a reader's `base:write`, a writer's `base`); `None` for a mutex.
    pub(crate) fn other_side_field(&self, base: &Arc<str>) -> Option<Arc<str>> {
        match self.kind {
            Kind::Read => Some(format!("{base}:write").into()),
            Kind::Write => Some(base.clone()),
            Kind::Fair | Kind::NonFair => None,
        }
    }

    /// The lease-key base a renewal of this lock's holds names (`''`: no lease keys).
    pub(crate) fn renewal_base(&self) -> &str {
        match self.kind {
            Kind::Read => self.keys.lease_base(),
            _ => "",
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
    fn derived_keys_parse_back() {
        for name in ["orders:42", "{t}x", "a*b", "x}y"] {
            let k = LockKeys::new(name);
            for (key, kind) in [
                (k.queue(), DerivedKey::Queue),
                (k.deadlines(), DerivedKey::Deadlines),
                (k.liveness(), DerivedKey::Liveness),
                (k.token(), DerivedKey::Token),
            ] {
                assert_eq!(parse_derived(key), Some((name, kind)), "{key}");
            }
            let latch = format!("{}:0a1b2c", derived(LATCH_PREFIX, name));
            assert_eq!(parse_derived(&latch), Some((name, DerivedKey::Latch)));
        }
        assert_eq!(parse_derived("orders:42"), None);
        assert_eq!(parse_derived("redisson_lock_queue:"), None);
    }

    #[test]
    fn owner_fields() {
        assert!(looks_like_owner_field(
            "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:57"
        ));
        assert!(looks_like_owner_field(
            "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:-3"
        ));
        assert!(!looks_like_owner_field("page:1"));
        assert!(!looks_like_owner_field(
            "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:x"
        ));
        assert_eq!(split_field("c:7"), ("c", Some(7)));
        assert_eq!(split_field("c"), ("c", None));
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
