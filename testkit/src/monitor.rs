//! `MONITOR` on one server: every command it executes (scripts' inner calls included, as
//! `[0 lua] "hexists" …` lines), collected by a background thread for a test to count.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::wait::wait_until;

/// A `MONITOR` connection; dropping it closes the connection.
pub struct Monitor {
    stream: TcpStream,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Monitor {
    /// Connects to `127.0.0.1:port`, sends `MONITOR` and returns once the server confirmed it.
    pub fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let (ok_tx, ok_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if line == "+OK" {
                    let _ = ok_tx.send(());
                    continue;
                }
                let text = line.strip_prefix('+').unwrap_or(&line).to_owned();
                sink.lock().unwrap().push((Instant::now(), text));
            }
        });
        ok_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("MONITOR was not confirmed");
        Monitor { stream, lines }
    }

    /// Lines seen since `since` that contain every one of `needles` (each quoted as Redis quotes
    /// arguments, e.g. `"hexists"`).
    pub fn count_since(&self, since: Instant, needles: &[&str]) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, line)| *at >= since && needles.iter().all(|n| line.contains(n)))
            .count()
    }

    /// The lines counted by [`count_since`](Self::count_since), for failure messages.
    pub fn lines_since(&self, since: Instant, needles: &[&str]) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, line)| *at >= since && needles.iter().all(|n| line.contains(n)))
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// Waits (with `deadline`) until a line containing every one of `needles` arrives after
    /// `since`; returns its arrival instant.
    pub fn wait_for(&self, since: Instant, needles: &[&str], deadline: Duration) -> Instant {
        let mut found = None;
        wait_until(
            deadline,
            &format!("MONITOR to show a command with {needles:?}"),
            || {
                found = self
                    .lines
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(at, line)| *at >= since && needles.iter().all(|n| line.contains(n)))
                    .map(|(at, _)| *at);
                found.is_some()
            },
        );
        found.unwrap()
    }

    /// Waits (with `deadline`) until a line containing every one of `needles` is at position
    /// `from` or later in the order the server reported its commands; returns that position. For
    /// "this happened after that" checks, where arrival instants could tie.
    pub fn wait_for_after(&self, from: usize, needles: &[&str], deadline: Duration) -> usize {
        let mut found = None;
        wait_until(
            deadline,
            &format!("MONITOR to show a command with {needles:?} at line {from} or later"),
            || {
                found = self
                    .lines
                    .lock()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .skip(from)
                    .find(|(_, (_, line))| needles.iter().all(|n| line.contains(n)))
                    .map(|(i, _)| i);
                found.is_some()
            },
        );
        found.unwrap()
    }

    /// The lines at positions `from..to` in the order the server reported its commands (positions
    /// as [`wait_for_after`](Self::wait_for_after) returns them).
    pub fn lines_between(&self, from: usize, to: usize) -> Vec<String> {
        self.lines.lock().unwrap()[from..to]
            .iter()
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// How many lines have arrived so far (a position for [`wait_for_after`](Self::wait_for_after)).
    pub fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// Whether no line has arrived yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
