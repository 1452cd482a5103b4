//! Redis's glob patterns, as `SCAN MATCH` and `PSUBSCRIBE` read them: escaping a name, matching
//! one (the `scan` pattern against lock names), and the patterns the tool builds from a lock's
//! names (which come from the library's `fairlock::keys`).

use fairlock::keys::{self, LockKeys};

/// The pattern `SCAN` uses to find every derived key in one pass: each prefix contains `lock`.
pub const DERIVED_MATCH: &str = "*lock*:*";

/// The pattern matching every fair waiter's channel of a lock.
pub fn waiter_channel_pattern(keys: &LockKeys) -> String {
    format!("{}:*", glob_escape(keys.channel()))
}

/// The pattern matching every Redisson unlock latch of a lock.
pub fn latch_pattern(name: &str) -> String {
    format!(
        "{}:*",
        glob_escape(&keys::derived(keys::LATCH_PREFIX, name))
    )
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_of_a_lock() {
        assert_eq!(latch_pattern("{t}x"), "redisson_unlock_latch:{t}x:*");
        assert_eq!(
            waiter_channel_pattern(&LockKeys::new("a*b")),
            "redisson_lock__channel:{a\\*b}:*"
        );
        assert!(glob_match(
            &waiter_channel_pattern(&LockKeys::new("a*b")),
            &LockKeys::new("a*b").waiter_channel("u:1")
        ));
    }

    #[test]
    fn every_derived_key_matches_the_scan_pattern() {
        for prefix in [
            keys::QUEUE_PREFIX,
            keys::DEADLINES_PREFIX,
            keys::LIVENESS_PREFIX,
            keys::TOKEN_PREFIX,
            keys::LATCH_PREFIX,
        ] {
            assert!(glob_match(DERIVED_MATCH, &keys::derived(prefix, "x")));
        }
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
}
