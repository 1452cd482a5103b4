//! Every Redis name one lock uses (docs/PROTOCOL.md section 1), the cluster slot rule behind
//! them, and the glob helpers `scan` and `watch` need. Pure functions: no I/O here.
//!
//! The library keeps its own copy of these rules private (`src/keys.rs`); this one must agree
//! with it byte for byte, which `tests/cli.rs` checks against locks the library writes.

pub const CHANNEL_PREFIX: &str = "redisson_lock__channel";
pub const QUEUE_PREFIX: &str = "redisson_lock_queue";
pub const DEADLINES_PREFIX: &str = "redisson_lock_timeout";
pub const TOKEN_PREFIX: &str = "redisson_lock_token";
pub const LIVENESS_PREFIX: &str = "fairlock_liveness";
pub const LATCH_PREFIX: &str = "redisson_unlock_latch";

/// Redisson's prefix rule: a name containing `{` is used as it is, any other is put in braces.
pub fn derived(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// The keys and channel of one lock.
#[derive(Debug, Clone)]
pub struct LockKeys {
    pub name: String,
    pub channel: String,
    pub queue: String,
    pub deadlines: String,
    pub token: String,
    pub liveness: String,
}

impl LockKeys {
    pub fn new(name: &str) -> LockKeys {
        LockKeys {
            name: name.to_owned(),
            channel: derived(CHANNEL_PREFIX, name),
            queue: derived(QUEUE_PREFIX, name),
            deadlines: derived(DEADLINES_PREFIX, name),
            token: derived(TOKEN_PREFIX, name),
            liveness: derived(LIVENESS_PREFIX, name),
        }
    }

    /// The channel of one fair waiter: the release channel, `:`, its owner field.
    pub fn waiter_channel(&self, field: &str) -> String {
        format!("{}:{field}", self.channel)
    }

    /// The pattern matching every fair waiter's channel of this lock.
    pub fn waiter_channel_pattern(&self) -> String {
        format!("{}:*", glob_escape(&self.channel))
    }

    /// The pattern matching every Redisson unlock latch of this lock.
    pub fn latch_pattern(&self) -> String {
        format!("{}:*", glob_escape(&derived(LATCH_PREFIX, &self.name)))
    }
}

/// Why a name cannot be used, or `None`. On a cluster every key of the lock must share the slot
/// of the name (the same rule the library enforces with `Error::InvalidName`).
pub fn invalid_name(name: &str, cluster: bool) -> Option<String> {
    if name.is_empty() {
        return Some("a lock name must not be empty".into());
    }
    if cluster {
        let keys = LockKeys::new(name);
        let home = slot(name);
        let spread = [
            &keys.channel,
            &keys.queue,
            &keys.deadlines,
            &keys.token,
            &keys.liveness,
        ]
        .iter()
        .any(|key| slot(key) != home);
        if spread {
            return Some(format!(
                "lock name {name:?} cannot be used on a cluster: its keys would land in different \
                 slots; a name containing '{{' needs a non-empty hash tag such as {{orders}}:42"
            ));
        }
    }
    None
}

/// What kind of lock key a scanned key is, and the lock name it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Lock,
    Queue,
    Deadlines,
    Liveness,
    Token,
    Latch,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Lock => "lock",
            Role::Queue => "queue",
            Role::Deadlines => "deadlines",
            Role::Liveness => "liveness",
            Role::Token => "fencing",
            Role::Latch => "latch",
        }
    }
}

/// The lock name and role of a derived key (`redisson_lock_queue:{orders}` → `orders`, queue),
/// or `None` for any other key. `{NAME}` is read as the braces of the prefix rule: a lock named
/// `x` and one named `{x}` share every derived key in Redisson's layout, so they cannot be told
/// apart here either.
pub fn parse_derived(key: &str) -> Option<(String, Role)> {
    for (prefix, role) in [
        (QUEUE_PREFIX, Role::Queue),
        (DEADLINES_PREFIX, Role::Deadlines),
        (LIVENESS_PREFIX, Role::Liveness),
        (TOKEN_PREFIX, Role::Token),
        (LATCH_PREFIX, Role::Latch),
    ] {
        let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        let rest = if role == Role::Latch {
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
        return Some((name.to_owned(), role));
    }
    None
}

/// The pattern `SCAN` uses to find every derived key in one pass: each prefix contains `lock`.
pub const DERIVED_MATCH: &str = "*lock*:*";

/// Escapes Redis glob characters so `s` matches only itself.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Redis's glob matching (`*`, `?`, `[abc]`, `[^a-z]`, `\x`), as `SCAN MATCH` applies it.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t)
}

fn glob_at(p: &[char], t: &[char]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    // Where to resume after the last `*`: (pattern index after it, text index it absorbed to).
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi + 1, ti));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class_at(p, pi, t[ti]) {
                        if matched {
                            pi = next;
                            ti += 1;
                            continue;
                        }
                    } else if t[ti] == '[' {
                        pi += 1;
                        ti += 1;
                        continue;
                    }
                }
                '\\' if pi + 1 < p.len() && p[pi + 1] == t[ti] => {
                    pi += 2;
                    ti += 1;
                    continue;
                }
                '\\' if pi + 1 < p.len() => {}
                c if c == t[ti] => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((after, absorbed)) => {
                pi = after;
                ti = absorbed + 1;
                star = Some((after, absorbed + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[open] == '['`: (matched, index after `]`), or
/// `None` when the class is not closed.
fn class_at(p: &[char], open: usize, c: char) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = p.get(i) == Some(&'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if p[i] == '\\' && i + 1 < p.len() {
            matched |= p[i + 1] == c;
            i += 2;
        } else if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            let (lo, hi) = if p[i] <= p[i + 2] {
                (p[i], p[i + 2])
            } else {
                (p[i + 2], p[i])
            };
            matched |= lo <= c && c <= hi;
            i += 3;
        } else {
            matched |= p[i] == c;
            i += 1;
        }
    }
    None
}

/// The Redis Cluster slot of `key` (CRC16/XMODEM of its hash tag or of the whole key).
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 0x3fff
}

/// Whether `s` has the shape of a UUID (8-4-4-4-12 hex digits), as Redisson's and fairlock's
/// client ids do.
pub fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Splits an owner field `<client id>:<holder id>` at its last colon.
pub fn split_field(field: &str) -> (&str, Option<i64>) {
    match field.rsplit_once(':') {
        Some((client, holder)) => (client, holder.parse().ok()),
        None => (field, None),
    }
}

/// Whether a hash field looks like an owner field: a UUID, a colon, a signed integer.
pub fn looks_like_owner_field(field: &str) -> bool {
    matches!(split_field(field), (client, Some(_)) if looks_like_uuid(client))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_follow_the_prefix_rule() {
        let k = LockKeys::new("orders:42");
        assert_eq!(k.queue, "redisson_lock_queue:{orders:42}");
        assert_eq!(k.liveness, "fairlock_liveness:{orders:42}");
        assert_eq!(
            k.waiter_channel("u:1"),
            "redisson_lock__channel:{orders:42}:u:1"
        );
        let k = LockKeys::new("{t}x");
        assert_eq!(k.deadlines, "redisson_lock_timeout:{t}x");
        assert_eq!(k.latch_pattern(), "redisson_unlock_latch:{t}x:*");
    }

    #[test]
    fn derived_keys_parse_back() {
        for name in ["orders:42", "{t}x", "a*b", "x}y"] {
            let k = LockKeys::new(name);
            for (key, role) in [
                (&k.queue, Role::Queue),
                (&k.deadlines, Role::Deadlines),
                (&k.liveness, Role::Liveness),
                (&k.token, Role::Token),
            ] {
                assert_eq!(parse_derived(key), Some((name.to_owned(), role)), "{key}");
            }
            let latch = format!("{}:0a1b2c", derived(LATCH_PREFIX, name));
            assert_eq!(parse_derived(&latch), Some((name.to_owned(), Role::Latch)));
        }
        assert_eq!(parse_derived("orders:42"), None);
        assert_eq!(parse_derived("redisson_lock_queue:"), None);
    }

    #[test]
    fn names_are_checked_like_the_library() {
        assert!(invalid_name("", false).is_some());
        assert!(invalid_name("a{b", false).is_none());
        assert!(invalid_name("a{b", true).is_some());
        assert!(invalid_name("a{}b", true).is_some());
        assert!(invalid_name("x}y", true).is_some());
        assert!(invalid_name("{t}x}y", true).is_none());
        assert!(invalid_name("plain", true).is_none());
    }

    #[test]
    fn slots_match_the_cluster_spec() {
        assert_eq!(slot("123456789"), 0x31c3 & 0x3fff);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
    }

    #[test]
    fn globs_match_like_redis() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("orders:*", "orders:42"));
        assert!(!glob_match("orders:*", "order:42"));
        assert!(glob_match("h?llo", "hello"));
        assert!(glob_match("h[ae]llo", "hallo"));
        assert!(!glob_match("h[^e]llo", "hello"));
        assert!(glob_match("h[a-c]llo", "hbllo"));
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "axb"));
        assert!(glob_match("*lock*:*", "redisson_lock_queue:{x}"));
        assert!(glob_match(&glob_escape("a*[b]"), "a*[b]"));
        assert!(!glob_match(&glob_escape("a*"), "ab"));
        assert!(glob_match("*a*b", "xxaxxb"));
        assert!(!glob_match("*a*b", "xxaxxc"));
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
        assert_eq!(split_field("c:7"), ("c", Some(7)));
        assert_eq!(split_field("c"), ("c", None));
    }
}
