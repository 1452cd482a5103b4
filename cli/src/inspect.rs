//! `fairlock inspect NAME`: one snapshot of a lock, as a table or as JSON.

use crate::connect::Session;
use crate::error::Failure;
use crate::output::Out;
use crate::snapshot::{self, Latches};

pub async fn run(
    session: &mut Session,
    name: &str,
    limit: usize,
    no_latch_scan: bool,
    json: bool,
) -> Result<(), Failure> {
    let latches = if no_latch_scan {
        Latches::Skip
    } else {
        Latches::Search
    };
    let snap = snapshot::read(session, name, latches).await?;
    let out = Out;
    if json {
        out.json(&snap)?;
    } else {
        out.lines(&snapshot::render(&snap, limit))?;
    }
    match snap.kind {
        "absent" => Err(Failure::NotFound(format!("no lock named {name:?}"))),
        "other" => Err(Failure::NotFound(format!(
            "{name:?} is not a lock: the key holds another type"
        ))),
        _ => Ok(()),
    }
}
