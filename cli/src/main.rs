//! `fairlock`: the operator's tool for fair and plain Redis locks, whoever holds them (fairlock,
//! or Java services using Redisson's `RLock` / `RFairLock`).
//!
//! ```text
//! fairlock inspect NAME        who holds it, who waits, until when, who looks dead, orphans
//! fairlock watch NAME          a live view: acquisitions, releases, hand-over gaps, queue length
//! fairlock scan [PATTERN]      every lock (SCAN, bounded and paced) and every orphan
//! fairlock force-unlock NAME   delete a lock, wake the next waiter
//! fairlock purge-dead NAME     remove the waiters that look dead, wake the new head
//! ```
//!
//! The crate `fairlock-cli` (`cargo install --path cli`); its README documents options, JSON fields and exit codes.
//! Every failure is one line on standard error and a documented exit code; nothing panics on
//! bad input, and a panic (a bug) is reported as one line too, never a backtrace.

mod admin;
mod args;
mod connect;
mod counters;
mod error;
mod glob;
mod inspect;
mod listen;
mod output;
mod scan;
mod snapshot;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::connect::{Session, Target};
use crate::error::{Failure, EXIT_INTERNAL};

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        eprintln!(
            "fairlock: internal error (please report it): {}",
            error::one_line(&message)
        );
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fairlock: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(run(cli))));
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(Failure::BrokenPipe)) => ExitCode::SUCCESS,
        Ok(Err(failure)) => {
            eprintln!("fairlock: {failure}");
            if json && !output::wrote_stdout() {
                let _ = output::Out.json(&failure.to_json());
            }
            failure.exit_code()
        }
        // The hook has printed the one line.
        Err(_) => ExitCode::from(EXIT_INTERNAL),
    }
}

/// Help and version go to stdout with 0; a usage error becomes one line on stderr, exit 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.render().to_string();
    // The message is the first paragraph; usage and tips follow after a blank line.
    let first: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).collect();
    let message = error::one_line(&first.join(" "));
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    eprintln!("fairlock: {message} (see fairlock --help)");
    ExitCode::from(error::EXIT_USAGE)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let target = Target::from_args(&cli.conn)?;
    if let Some(name) = cli.command.lock_name() {
        let problem = if matches!(cli.command, Command::Latch { .. }) {
            args::invalid_latch_name(name, target.is_cluster())
        } else {
            args::invalid_name(name, target.is_cluster())
        };
        if let Some(why) = problem {
            return Err(Failure::Usage(why));
        }
    }
    if let Command::Scan { pattern, .. } = &cli.command {
        if pattern.is_empty() {
            return Err(Failure::Usage(
                "the pattern must not be empty (use \"*\" for every lock)".into(),
            ));
        }
    }
    let mut session = Session::open(target).await?;
    let json = cli.json;
    match cli.command {
        Command::Inspect {
            name,
            limit,
            no_latch_scan,
        } => inspect::run(&mut session, &name, limit, no_latch_scan, json).await,
        Command::Watch {
            name,
            interval,
            max_events,
        } => watch::run(&mut session, &name, interval, max_events, json).await,
        Command::Scan {
            pattern,
            count,
            pause,
            limit,
        } => {
            let opts = scan::Options {
                pattern,
                count,
                pause,
                limit,
            };
            scan::run(&mut session, opts, json).await
        }
        Command::ForceUnlock { name, yes } => {
            admin::force_unlock(&mut session, &name, yes, json).await
        }
        Command::PurgeDead { name } => admin::purge_dead(&mut session, &name, json).await,
        Command::Semaphore { name } => counters::semaphore(&mut session, &name, json).await,
        Command::Latch { name } => counters::latch(&mut session, &name, json).await,
    }
}
