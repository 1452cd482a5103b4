//! `fairlock watch NAME`: a live view of one lock. It listens on the lock's channels (the
//! release channel, and every fair waiter's channel: a pattern subscription with classic pub/sub,
//! the current head's channel with sharded pub/sub, moved as the head changes) and re-reads the
//! lock on each message, at most once per [`MIN_GAP`], plus a slow periodic refresh. It never
//! polls fast. Each read is compared with the previous one and the differences are events. The
//! subscriptions themselves are in `listen.rs`.
//!
//! Output: on a terminal a table redrawn in place; otherwise one line per event; with `--json`
//! one JSON object per event. It ends on Ctrl-C / SIGTERM (exit 0), at `--max-events`, or when
//! its reader goes away (a broken pipe, exit 0).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IsTerminal;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fairlock::keys::LockKeys;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::connect::Session;
use crate::error::Failure;
use crate::listen::{Listener, Notice};
use crate::output::{self, Out};
use crate::snapshot::{self, Latches, OwnerView, Snapshot};

/// Reads triggered by messages are at least this far apart: a busy lock's messages are
/// coalesced instead of each costing a read.
const MIN_GAP: Duration = Duration::from_millis(50);
/// After a message, read again this much later too: an acquisition publishes nothing, so the
/// new owner of a lock released a moment ago shows up on one of these reads.
const FOLLOW_UPS: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(500)];
/// Events kept for the terminal view; samples of the queue length kept for its sparkline.
const RECENT_EVENTS: usize = 10;
const SAMPLES: usize = 60;

/// One line of `--json` output. Which fields appear depends on `event` (README.md).
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub event: &'static str,
    pub time_ms: i64,
    pub time: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owners: Option<Vec<OwnerView>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handover: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub queue_length: usize,
}

impl Event {
    fn new(event: &'static str, time_ms: i64, name: &str, queue_length: usize) -> Event {
        Event {
            event,
            time_ms,
            time: output::timestamp(time_ms),
            name: name.to_owned(),
            kind: None,
            owners: None,
            pttl_ms: None,
            field: None,
            client_id: None,
            holder_id: None,
            holds: None,
            gap_ms: None,
            handover: None,
            held_ms: None,
            position: None,
            reason: None,
            message: None,
            queue_length,
        }
    }

    fn with_field(mut self, field: &str) -> Event {
        let (client, holder) = fairlock::keys::split_field(field);
        self.field = Some(field.to_owned());
        self.client_id = Some(client.to_owned());
        self.holder_id = holder;
        self
    }

    /// The event as one human line.
    fn line(&self) -> String {
        let who = self
            .field
            .as_deref()
            .map(snapshot::short_field)
            .unwrap_or_default();
        let detail = match self.event {
            "snapshot" => format!(
                "{} lock {:?}: {}, {} waiting",
                self.kind.unwrap_or("?"),
                self.name,
                match self.owners.as_deref() {
                    Some([]) | None => "free".to_owned(),
                    Some(owners) => format!(
                        "held by {}",
                        owners
                            .iter()
                            .map(|o| snapshot::short_field(&o.field))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
                self.queue_length
            ),
            "acquired" => format!(
                "{who}  holds {}{}",
                self.holds.unwrap_or(1),
                match (self.gap_ms, self.handover) {
                    (Some(g), Some(true)) => format!("  hand-over gap {}", output::duration(g)),
                    (Some(g), _) => format!("  free for {}", output::duration(g)),
                    _ => String::new(),
                }
            ),
            "released" => format!(
                "{who}{}",
                self.held_ms
                    .map(|h| format!("  after {}", output::duration(h)))
                    .unwrap_or_default()
            ),
            "holds" => format!("{who}  holds {}", self.holds.unwrap_or(0)),
            "queued" => format!("{who}  at position {}", self.position.unwrap_or(0)),
            "left" => format!("{who}  left the queue without the lock"),
            "looks_dead" => format!(
                "{who}  {}",
                snapshot::reason_text(self.reason.unwrap_or(""))
            ),
            _ => self.message.clone().unwrap_or_default(),
        };
        format!(
            "{}  {:<10}  {detail}  (queue {})",
            self.time, self.event, self.queue_length
        )
    }
}

/// How the events are shown.
enum View {
    Json,
    Lines,
    Terminal(TerminalView),
}

struct TerminalView {
    recent: VecDeque<String>,
    samples: VecDeque<usize>,
    acquisitions: u64,
    releases: u64,
    gaps: Vec<i64>,
    last_sample: Option<Instant>,
}

pub async fn run(
    session: &mut Session,
    name: &str,
    interval: Duration,
    max_events: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    let keys = LockKeys::new(name);
    let out = Out;
    let mut view = if json {
        View::Json
    } else if std::io::stdout().is_terminal() {
        View::Terminal(TerminalView {
            recent: VecDeque::new(),
            samples: VecDeque::new(),
            acquisitions: 0,
            releases: 0,
            gaps: Vec::new(),
            last_sample: None,
        })
    } else {
        View::Lines
    };

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut listener = Listener::start(session, &keys, tx).await?;
    let mut signals = Signals::new()?;

    let mut watcher = Watcher {
        name: name.to_owned(),
        prev: None,
        acquired_at: HashMap::new(),
        last_release_ms: None,
        first_message_ms: None,
        offset_ms: 0,
        events: 0,
        seen_fair: false,
    };
    let mut first = snapshot::read(session, name, Latches::Skip).await?;
    watcher.keep_fair(&mut first);
    watcher.offset_ms = first.server_time_ms - local_ms();
    let start = snapshot_event(&first);
    listener.follow_head(&first).await;
    watcher.prev = Some(first);
    show(&out, &mut view, &watcher, &[start])?;

    let mut last_read = Instant::now();
    let mut next_periodic = last_read + interval;
    let mut extra: Vec<Instant> = Vec::new();
    let mut listening = true;
    loop {
        let due = extra
            .iter()
            .copied()
            .min()
            .map_or(next_periodic, |e| e.min(next_periodic));
        tokio::select! {
            biased;
            _ = signals.next() => break,
            notice = rx.recv(), if listening => match notice {
                Some(Notice::Message) => {
                    let now = Instant::now();
                    if watcher.first_message_ms.is_none() {
                        watcher.first_message_ms = Some(local_ms() + watcher.offset_ms);
                    }
                    extra.push(now.max(last_read + MIN_GAP));
                    extra.extend(FOLLOW_UPS.iter().map(|d| now + *d));
                }
                Some(Notice::Lost(why)) => {
                    let ev = note(&watcher, "subscription_lost", &format!(
                        "{why}; subscribing again, refreshing every {} meanwhile",
                        output::duration(interval.as_millis() as i64)
                    ));
                    show(&out, &mut view, &watcher, &[ev])?;
                }
                None => listening = false,
            },
            _ = tokio::time::sleep_until(due.into()) => {
                let now = Instant::now();
                extra.retain(|t| *t > now);
                if now >= next_periodic {
                    next_periodic = now + interval;
                }
                last_read = now;
                let events = match snapshot::read(session, name, Latches::Skip).await {
                    Ok(snap) => {
                        listener.follow_head(&snap).await;
                        watcher.observe(snap)
                    }
                    Err(e) => vec![note(&watcher, "error", &e.to_string())],
                };
                let counted = events.iter().filter(|e| !matches!(e.event, "error" | "subscription_lost")).count() as u64;
                show(&out, &mut view, &watcher, &events)?;
                watcher.events += counted;
                if max_events.is_some_and(|max| watcher.events >= max) {
                    break;
                }
            }
        }
    }
    listener.stop();
    if let View::Terminal(_) = view {
        out.line("")?;
    }
    Ok(())
}

struct Watcher {
    name: String,
    prev: Option<Snapshot>,
    /// When each current owner was first seen holding (server ms).
    acquired_at: HashMap<String, i64>,
    last_release_ms: Option<i64>,
    /// Server-time estimate of the first message since the last read.
    first_message_ms: Option<i64>,
    /// Server clock minus local clock, as of the last read.
    offset_ms: i64,
    events: u64,
    /// A fair lock's queue keys were seen: the lock stays `fair` when they go away (a fair lock
    /// held with nobody waiting has only its owner hash, which a read cannot tell from a plain
    /// lock's).
    seen_fair: bool,
}

impl Watcher {
    /// Keeps a lock seen fair labelled `fair` once its queue keys are gone.
    fn keep_fair(&mut self, snap: &mut Snapshot) {
        match snap.kind {
            "fair" => self.seen_fair = true,
            "plain" if self.seen_fair => snap.kind = "fair",
            _ => {}
        }
    }

    /// Compares a new read with the previous one; returns the events, in a fixed order.
    fn observe(&mut self, mut cur: Snapshot) -> Vec<Event> {
        self.keep_fair(&mut cur);
        self.offset_ms = cur.server_time_ms - local_ms();
        let Some(prev) = self.prev.take() else {
            let ev = snapshot_event(&cur);
            self.prev = Some(cur);
            return vec![ev];
        };
        let now = cur.server_time_ms;
        let q = cur.queue_length;
        let mut events = Vec::new();
        let prev_owners: HashMap<&str, u64> = prev
            .owners
            .iter()
            .map(|o| (o.field.as_str(), o.holds))
            .collect();
        let cur_owners: HashMap<&str, u64> = cur
            .owners
            .iter()
            .map(|o| (o.field.as_str(), o.holds))
            .collect();
        let prev_queue: HashSet<&str> = prev.queue.iter().map(|w| w.field.as_str()).collect();
        let cur_queue: HashSet<&str> = cur.queue.iter().map(|w| w.field.as_str()).collect();

        // A release happened at the first message since the last read, if there was one, and
        // no earlier than that read.
        let released_at = self
            .first_message_ms
            .take()
            .map_or(now, |m| m.clamp(prev.server_time_ms, now));
        for o in &prev.owners {
            if !cur_owners.contains_key(o.field.as_str()) {
                let mut ev =
                    Event::new("released", released_at, &self.name, q).with_field(&o.field);
                ev.held_ms = self.acquired_at.remove(&o.field).map(|at| released_at - at);
                self.last_release_ms = Some(released_at);
                events.push(ev);
            }
        }
        for o in &cur.owners {
            match prev_owners.get(o.field.as_str()) {
                None => {
                    let mut ev = Event::new("acquired", now, &self.name, q).with_field(&o.field);
                    ev.holds = Some(o.holds);
                    ev.gap_ms = self.last_release_ms.map(|r| (now - r).max(0));
                    ev.handover = Some(prev_queue.contains(o.field.as_str()));
                    self.acquired_at.insert(o.field.clone(), now);
                    events.push(ev);
                }
                Some(&holds) if holds != o.holds => {
                    let mut ev = Event::new("holds", now, &self.name, q).with_field(&o.field);
                    ev.holds = Some(o.holds);
                    events.push(ev);
                }
                Some(_) => {}
            }
        }
        for w in &cur.queue {
            if !prev_queue.contains(w.field.as_str()) {
                let mut ev = Event::new("queued", now, &self.name, q).with_field(&w.field);
                ev.position = Some(w.position);
                events.push(ev);
            }
        }
        for w in &prev.queue {
            if !cur_queue.contains(w.field.as_str()) && !cur_owners.contains_key(w.field.as_str()) {
                events.push(Event::new("left", now, &self.name, q).with_field(&w.field));
            }
        }
        let was_alive: HashSet<&str> = prev
            .queue
            .iter()
            .filter(|w| w.alive)
            .map(|w| w.field.as_str())
            .collect();
        for w in &cur.queue {
            if !w.alive
                && (was_alive.contains(w.field.as_str()) || !prev_queue.contains(w.field.as_str()))
            {
                let mut ev = Event::new("looks_dead", now, &self.name, q).with_field(&w.field);
                ev.reason = w.dead_reason;
                events.push(ev);
            }
        }
        self.prev = Some(cur);
        events
    }
}

fn snapshot_event(s: &Snapshot) -> Event {
    let mut ev = Event::new("snapshot", s.server_time_ms, &s.name, s.queue_length);
    ev.kind = Some(s.kind);
    ev.owners = Some(s.owners.clone());
    ev.pttl_ms = (s.pttl_ms != -2).then_some(s.pttl_ms);
    ev
}

fn note(w: &Watcher, event: &'static str, message: &str) -> Event {
    let q = w.prev.as_ref().map_or(0, |p| p.queue_length);
    let mut ev = Event::new(event, local_ms() + w.offset_ms, &w.name, q);
    ev.message = Some(message.to_owned());
    ev
}

fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn show(out: &Out, view: &mut View, w: &Watcher, events: &[Event]) -> Result<(), Failure> {
    match view {
        View::Json => {
            for ev in events {
                out.json(ev)?;
            }
            Ok(())
        }
        View::Lines => {
            for ev in events {
                if matches!(ev.event, "error" | "subscription_lost") {
                    eprintln!("fairlock: {}", ev.message.as_deref().unwrap_or(""));
                } else {
                    out.line(&ev.line())?;
                }
            }
            Ok(())
        }
        View::Terminal(t) => {
            for ev in events {
                match ev.event {
                    "acquired" => {
                        t.acquisitions += 1;
                        if let (Some(g), Some(true)) = (ev.gap_ms, ev.handover) {
                            t.gaps.push(g);
                        }
                    }
                    "released" => t.releases += 1,
                    _ => {}
                }
                if ev.event != "snapshot" {
                    t.recent.push_front(ev.line());
                    t.recent.truncate(RECENT_EVENTS);
                }
            }
            let Some(snap) = &w.prev else { return Ok(()) };
            let now = Instant::now();
            if t.last_sample
                .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
            {
                t.samples.push_back(snap.queue_length);
                if t.samples.len() > SAMPLES {
                    t.samples.pop_front();
                }
                t.last_sample = Some(now);
            }
            let mut lines = vec![
                format!(
                    "fairlock watch {:?}  {}  (Ctrl-C to quit)",
                    w.name, snap.server_time
                ),
                String::new(),
            ];
            lines.extend(snapshot::render(snap, 10));
            lines.push(String::new());
            lines.push(format!(
                "queue length, one sample a second: {}  (max {})",
                sparkline(&t.samples),
                t.samples.iter().max().copied().unwrap_or(0)
            ));
            let mut gaps = t.gaps.clone();
            gaps.sort_unstable();
            lines.push(format!(
                "acquisitions {}  releases {}  hand-over gap median {}  max {}",
                t.acquisitions,
                t.releases,
                gaps.get(gaps.len() / 2)
                    .map_or("-".into(), |g| output::duration(*g)),
                gaps.last().map_or("-".into(), |g| output::duration(*g)),
            ));
            lines.push(String::new());
            lines.push("recent events".into());
            lines.extend(t.recent.iter().map(|l| format!("  {l}")));
            let mut screen = String::from("\x1b[H");
            for line in lines {
                screen.push_str(&line);
                screen.push_str("\x1b[K\n");
            }
            screen.push_str("\x1b[J");
            out.raw(&screen)
        }
    }
}

fn sparkline(samples: &VecDeque<usize>) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = samples.iter().max().copied().unwrap_or(0).max(1);
    samples
        .iter()
        .map(|&n| BARS[(n * (BARS.len() - 1)).div_ceil(max).min(BARS.len() - 1)])
        .collect()
}

/// Ctrl-C and SIGTERM.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let fail = |e: std::io::Error| Failure::Internal(format!("cannot handle signals: {e}"));
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt()).map_err(fail)?,
                terminate: signal(SignalKind::terminate()).map_err(fail)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(time: i64, owners: &[(&str, u64)], queue: &[&str]) -> Snapshot {
        Snapshot {
            mode: None,
            readers: Vec::new(),
            name: "l".into(),
            kind: "fair",
            locked: !owners.is_empty(),
            server_time_ms: time,
            server_time: output::timestamp(time),
            owners: owners
                .iter()
                .map(|(f, h)| OwnerView {
                    field: (*f).into(),
                    client_id: "c".into(),
                    holder_id: None,
                    holds: *h,
                })
                .collect(),
            pttl_ms: 1000,
            expires_at_ms: None,
            expires_at: None,
            fencing_token: None,
            queue_length: queue.len(),
            dead_waiters: 0,
            queue: queue
                .iter()
                .enumerate()
                .map(|(i, f)| snapshot::WaiterView {
                    position: i + 1,
                    field: (*f).into(),
                    client_id: "c".into(),
                    holder_id: None,
                    fairlock: true,
                    deadline_ms: None,
                    deadline: None,
                    deadline_in_ms: None,
                    liveness_until_ms: None,
                    liveness_in_ms: None,
                    alive: true,
                    dead_reason: None,
                })
                .collect(),
            keys: vec![],
            orphans: vec![],
        }
    }

    #[test]
    fn differences_become_events() {
        let mut w = Watcher {
            name: "l".into(),
            prev: None,
            acquired_at: HashMap::new(),
            last_release_ms: None,
            first_message_ms: None,
            offset_ms: 0,
            events: 0,
            seen_fair: false,
        };
        assert_eq!(
            w.observe(snap(1000, &[("a:1", 1)], &[]))[0].event,
            "snapshot"
        );
        let ev = w.observe(snap(1100, &[("a:1", 1)], &["b:2"]));
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].event, ev[0].position), ("queued", Some(1)));
        // A hand-over seen in one read: released at the message, acquired at the read.
        w.first_message_ms = Some(1150);
        let ev = w.observe(snap(1200, &[("b:2", 1)], &[]));
        let kinds: Vec<_> = ev.iter().map(|e| e.event).collect();
        assert_eq!(kinds, ["released", "acquired"]);
        assert_eq!(ev[0].time_ms, 1150);
        assert_eq!(ev[1].gap_ms, Some(50));
        assert_eq!(ev[1].handover, Some(true));
        let ev = w.observe(snap(1300, &[("b:2", 2)], &["c:3"]));
        let kinds: Vec<_> = ev.iter().map(|e| e.event).collect();
        assert_eq!(kinds, ["holds", "queued"]);
        let ev = w.observe(snap(1400, &[], &[]));
        let kinds: Vec<_> = ev.iter().map(|e| e.event).collect();
        assert_eq!(kinds, ["released", "left"]);
        assert_eq!(ev[0].held_ms, Some(1400 - 1200));
    }

    /// A fair lock whose queue empties is still reported fair (it was relabelled `plain`).
    #[test]
    fn a_fair_lock_stays_fair_when_its_queue_empties() {
        let mut w = Watcher {
            name: "l".into(),
            prev: None,
            acquired_at: HashMap::new(),
            last_release_ms: None,
            first_message_ms: None,
            offset_ms: 0,
            events: 0,
            seen_fair: false,
        };
        let mut plain = snap(1000, &[("a:1", 1)], &[]);
        plain.kind = "plain";
        w.observe(plain.clone());
        assert_eq!(w.prev.as_ref().unwrap().kind, "plain", "never seen fair");
        w.observe(snap(1100, &[("a:1", 1)], &["b:2"]));
        let mut emptied = snap(1200, &[("b:2", 1)], &[]);
        emptied.kind = "plain";
        w.observe(emptied);
        assert_eq!(w.prev.as_ref().unwrap().kind, "fair");
    }

    #[test]
    fn sparklines_scale() {
        let s: VecDeque<usize> = [0, 1, 2, 4].into_iter().collect();
        assert_eq!(sparkline(&s), "▁▃▅█");
    }
}
