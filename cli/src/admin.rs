//! `fairlock force-unlock NAME` and `fairlock purge-dead NAME`: the two commands that change a
//! lock. Each runs the library's repair (`fairlock::admin`), one script that reports exactly what
//! it removed and whom it told, atomically.

use std::io::{BufRead, IsTerminal, Write};

use fairlock::admin::{self, Announce, DeadWaiter};
use fairlock::keys::{self, LockKeys};
use serde::Serialize;

use crate::connect::{Raw, Session};
use crate::error::Failure;
use crate::output::{Out, Table};
use crate::snapshot::{self, Latches, OwnerView};

#[derive(Debug, Serialize)]
pub struct Removed {
    pub field: String,
    pub client_id: String,
    pub holder_id: Option<i64>,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub struct Told {
    pub field: String,
    pub channel: String,
    pub receivers: i64,
}

#[derive(Debug, Serialize)]
pub struct ForceUnlockReport {
    pub name: String,
    pub removed: bool,
    pub owners: Vec<OwnerView>,
    pub dropped_dead_waiters: Vec<Removed>,
    pub woken: Option<Told>,
    pub release_channel: String,
    pub release_channel_receivers: i64,
}

#[derive(Debug, Serialize)]
pub struct PurgeReport {
    pub name: String,
    pub purged: Vec<Removed>,
    pub woken: Option<Told>,
    pub queue_length: i64,
    pub locked: bool,
}

fn removed_list(waiters: Vec<DeadWaiter>) -> Vec<Removed> {
    waiters
        .into_iter()
        .map(|w| {
            let (client, holder) = keys::split_field(&w.field);
            Removed {
                client_id: client.to_owned(),
                holder_id: holder,
                reason: w.reason.code().to_owned(),
                field: w.field,
            }
        })
        .collect()
}

/// How the session's wake-ups are published, as the library names it.
fn announce(session: &Session) -> Announce {
    match (
        session.publish.contains(&"SPUBLISH"),
        session.publish.contains(&"PUBLISH"),
    ) {
        (true, true) => Announce::Both,
        (true, false) => Announce::Sharded,
        _ => Announce::Classic,
    }
}

/// Asks on the terminal; `Ok(())` when the answer is yes.
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Usage(
            "standard input is not a terminal, so there is nobody to confirm: pass --yes".into(),
        ));
    }
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "{question} [y/N] ");
    let _ = stderr.flush();
    drop(stderr);
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Internal(format!("cannot read the answer: {e}")))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::Declined(
            "not confirmed: nothing was changed".into(),
        )),
    }
}

pub async fn force_unlock(
    session: &mut Session,
    name: &str,
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    let before = snapshot::read(session, name, Latches::Skip).await?;
    if before.kind == "other" {
        return Err(Failure::NotFound(format!(
            "{name:?} is not a lock: the key holds another type"
        )));
    }
    if !before.locked {
        return Err(Failure::NotFound(format!(
            "lock {name:?} is not held: nothing to unlock{}",
            if before.queue_length > 0 {
                " (to clear dead waiters use purge-dead)"
            } else {
                ""
            }
        )));
    }
    if !yes {
        let holders: Vec<String> = before
            .owners
            .iter()
            .map(|o| format!("{} ({} holds)", o.field, o.holds))
            .collect();
        let question = format!(
            "Force-unlock {name:?}, held by {}{}? The holder is not told and may go on believing \
             it holds the lock.",
            holders.join(", "),
            if before.queue_length > 0 {
                format!("; {} waiting", before.queue_length)
            } else {
                String::new()
            }
        );
        // The prompt reads standard input: keep it off the async runtime.
        tokio::task::spawn_blocking(move || confirm(&question))
            .await
            .map_err(|e| Failure::Internal(format!("the prompt failed: {e}")))??;
    }

    let keys = LockKeys::new(name);
    let how = announce(session);
    let outcome = match &mut session.raw {
        Raw::Server(c) => admin::force_unlock(c, name, how).await,
        Raw::Cluster(c) => admin::force_unlock(c, name, how).await,
    };
    let Some(done) = outcome.map_err(|e| Failure::library("force-unlock failed", e))? else {
        return Err(Failure::NotFound(format!(
            "lock {name:?} was released meanwhile: nothing to unlock"
        )));
    };
    let report = ForceUnlockReport {
        name: name.to_owned(),
        removed: true,
        owners: done
            .owners
            .into_iter()
            .map(|(field, holds)| {
                let (client, holder) = keys::split_field(&field);
                OwnerView {
                    client_id: client.to_owned(),
                    holder_id: holder,
                    holds,
                    field,
                }
            })
            .collect(),
        dropped_dead_waiters: removed_list(done.dropped),
        woken: done.woken.map(|head| Told {
            channel: keys.waiter_channel(&head),
            field: head,
            receivers: done.woken_receivers as i64,
        }),
        release_channel: keys.channel().to_owned(),
        release_channel_receivers: done.release_receivers as i64,
    };
    let out = Out;
    if json {
        return out.json(&report);
    }
    let mut lines = Vec::new();
    for o in &report.owners {
        lines.push(format!(
            "removed  lock {name:?} held by {} ({} holds)",
            o.field, o.holds
        ));
    }
    for d in &report.dropped_dead_waiters {
        lines.push(format!(
            "dropped  dead waiter {} ({})",
            d.field,
            snapshot::reason_text(&d.reason)
        ));
    }
    match &report.woken {
        Some(t) => lines.push(format!(
            "woke     {} on {} ({} receivers)",
            t.field, t.channel, t.receivers
        )),
        None => lines.push("woke     no queued waiter (the queue is empty)".into()),
    }
    lines.push(format!(
        "told     plain-lock waiters on {} ({} receivers)",
        report.release_channel, report.release_channel_receivers
    ));
    out.lines(&lines)
}

pub async fn purge_dead(session: &mut Session, name: &str, json: bool) -> Result<(), Failure> {
    let keys = LockKeys::new(name);
    let how = announce(session);
    let outcome = match &mut session.raw {
        Raw::Server(c) => admin::purge_dead(c, name, how).await,
        Raw::Cluster(c) => admin::purge_dead(c, name, how).await,
    };
    let Some(done) = outcome.map_err(|e| Failure::library("purge-dead failed", e))? else {
        return Err(Failure::NotFound(format!(
            "no lock or queue named {name:?}"
        )));
    };
    let report = PurgeReport {
        name: name.to_owned(),
        purged: removed_list(done.removed),
        woken: done.woken.map(|told| Told {
            channel: keys.waiter_channel(&told),
            field: told,
            receivers: done.woken_receivers as i64,
        }),
        queue_length: done.queue_length as i64,
        locked: done.locked,
    };
    let out = Out;
    if json {
        return out.json(&report);
    }
    let mut lines = Vec::new();
    if report.purged.is_empty() {
        lines.push(format!(
            "nothing to purge: every waiter of {name:?} looks alive ({} waiting)",
            report.queue_length
        ));
    } else {
        lines.push(format!(
            "purged {} dead waiters of {name:?}; {} still waiting",
            report.purged.len(),
            report.queue_length
        ));
        let mut t = Table::new(&["FIELD", "REASON"]);
        for r in &report.purged {
            t.row(vec![
                r.field.clone(),
                snapshot::reason_text(&r.reason).into(),
            ]);
        }
        lines.extend(t.render("  "));
        match &report.woken {
            Some(w) => lines.push(format!(
                "woke {} on {} ({} receivers)",
                w.field, w.channel, w.receivers
            )),
            None if report.locked => {
                lines.push("woke nobody: the lock is held; its release wakes the head".into())
            }
            None => lines.push("woke nobody: the queue is empty".into()),
        }
    }
    out.lines(&lines)
}
