//! Human output (durations, UTC timestamps, aligned tables) and the one writer every command
//! prints through, which turns a closed pipe into a clean exit instead of a panic.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::error::Failure;

/// A duration in milliseconds the way people read it: `850ms`, `4.2s`, `3m07s`, `2h05m`,
/// `3d04h`; negative values (a deadline that passed) get a leading `-`.
pub fn duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let text = if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        // One decimal, truncated so that 59.99 s does not read as 60.0s.
        format!("{}.{}s", ms / 1_000, (ms % 1_000) / 100)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1_000)
    } else if ms < 86_400_000 {
        format!("{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    } else {
        format!("{}d{:02}h", ms / 86_400_000, (ms % 86_400_000) / 3_600_000)
    };
    format!("{sign}{text}")
}

/// Unix epoch milliseconds as UTC RFC 3339 with milliseconds: `2026-11-23T21:40:12.345Z`.
/// A PTTL in JSON: `null` for a key that does not exist (Redis's -2), else the number (-1: no
/// expiry).
pub fn pttl_json<S: serde::Serializer>(pttl: &i64, s: S) -> Result<S::Ok, S::Error> {
    if *pttl == -2 {
        s.serialize_none()
    } else {
        s.serialize_i64(*pttl)
    }
}

/// `n` and the noun, singular for one: `1 orphan`, `2 orphans`.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub fn timestamp(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let in_day = epoch_ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        (in_day / 60_000) % 60,
        (in_day / 1_000) % 60,
        in_day % 1_000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): the well-known
/// era-based conversion (400-year eras of 146 097 days, years starting in March).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A table with left-aligned columns two spaces apart; the last column is not padded.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, each prefixed by `indent`.
    pub fn render(&self, indent: &str) -> Vec<String> {
        let columns = self.headers.len();
        let width = |i: usize| {
            std::iter::once(&self.headers)
                .chain(&self.rows)
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        std::iter::once(&self.headers)
            .chain(&self.rows)
            .map(|row| {
                let mut line = indent.to_owned();
                for (i, w) in widths.iter().enumerate() {
                    let cell = row.get(i).map_or("", String::as_str);
                    if i + 1 == columns {
                        line.push_str(cell);
                    } else {
                        line.push_str(cell);
                        let pad = w - cell.chars().count() + 2;
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
                line.trim_end().to_owned()
            })
            .collect()
    }
}

/// Lines of `key  value` pairs with the values aligned.
pub fn pairs(items: &[(&str, String)]) -> Vec<String> {
    let width = items.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    items
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}").trim_end().to_owned())
        .collect()
}

static WROTE: AtomicBool = AtomicBool::new(false);

/// Whether anything was written to standard output (an error is then not repeated there as
/// JSON: one document per run).
pub fn wrote_stdout() -> bool {
    WROTE.load(Ordering::Relaxed)
}

/// Standard output. Every write is checked: a reader that went away (`head`, a closed pipe)
/// ends the command quietly with [`Failure::BrokenPipe`].
pub struct Out;

impl Out {
    pub fn line(&self, text: &str) -> Result<(), Failure> {
        WROTE.store(true, Ordering::Relaxed);
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")
            .and_then(|()| stdout.flush())
            .map_err(Failure::from_io)
    }

    pub fn lines<S: AsRef<str>>(&self, lines: &[S]) -> Result<(), Failure> {
        WROTE.store(true, Ordering::Relaxed);
        let mut stdout = std::io::stdout().lock();
        for line in lines {
            writeln!(stdout, "{}", line.as_ref()).map_err(Failure::from_io)?;
        }
        stdout.flush().map_err(Failure::from_io)
    }

    /// Raw text without a newline (terminal control sequences of `watch`).
    pub fn raw(&self, text: &str) -> Result<(), Failure> {
        WROTE.store(true, Ordering::Relaxed);
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(Failure::from_io)
    }

    /// One JSON document on one line.
    pub fn json<T: Serialize>(&self, value: &T) -> Result<(), Failure> {
        let text = serde_json::to_string(value)
            .map_err(|e| Failure::Internal(format!("cannot encode JSON: {e}")))?;
        self.line(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(0), "0ms");
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(4_249), "4.2s");
        assert_eq!(duration(59_999), "59.9s");
        assert_eq!(duration(187_000), "3m07s");
        assert_eq!(duration(7_500_000), "2h05m");
        assert_eq!(duration(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
        assert_eq!(duration(-1_300), "-1.3s");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(timestamp(1_763_933_412_345), "2025-11-23T21:30:12.345Z");
        assert_eq!(timestamp(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["A", "LONGER", "C"]);
        t.row(vec!["xyz".into(), "1".into(), "last".into()]);
        assert_eq!(t.render(""), vec!["A    LONGER  C", "xyz  1       last"]);
        assert_eq!(
            pairs(&[("a", "1".into()), ("bbb", "2".into())]),
            vec!["a    1", "bbb  2"]
        );
    }
}
