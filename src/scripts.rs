//! The Lua scripts, one per operation (shared prologues joined in front at compile time), compiled
//! in from `lua/`, kept as plain data ([`Lua`]: source and hash) and called as `EVALSHA` by the
//! command connection (`conn::ScriptCall`). A `NOSCRIPT` reply (after
//! `SCRIPT FLUSH`, a restart or a failover to a node that never ran the script) is answered by
//! the connection layer with the same call as `EVAL` of the script's source
//! ([`eval_instead`]), on the node that owns the keys, which also caches the script there.
//! (`SCRIPT LOAD` is not enough on a cluster: it goes to the masters of a slot map that may be
//! stale during a failover.)

use std::sync::LazyLock;

use redis::Script;

/// The shared fair-lock prologue (`lua/fair_prologue.lua`): local helpers only.
const FAIR_PROLOGUE: &str = include_str!("../lua/fair_prologue.lua");

/// The read-write lock's writer-preferring queue helpers (`lua/rw_prologue.lua`), joined in front
/// of the scripts that use them (`rw "file"` below).
const RW_PROLOGUE: &str = include_str!("../lua/rw_prologue.lua");

/// The release scripts' compare-and-set and TTL helpers (`lua/release_prologue.lua`), joined in
/// front of every unlock script (`release "file"` and `fair_release "file"` below).
const RELEASE_PROLOGUE: &str = include_str!("../lua/release_prologue.lua");

/// The expirable semaphore's helpers (`lua/permit_prologue.lua`), joined in front of its scripts
/// (`permit "file"` below), after the count helpers.
const PERMIT_PROLOGUE: &str = include_str!("../lua/permit_prologue.lua");

/// The helpers that answer and publish counts and fencing tokens exactly
/// (`lua/count_prologue.lua`), joined in front of the semaphores', the latch's and every granting
/// lock script (`count`, `permit`, `rw`, `fair` and `fair_release` below).
const COUNT_PROLOGUE: &str = include_str!("../lua/count_prologue.lua");

/// Joined in front of the operators' scripts (`admin_*.lua`).
const ADMIN_PROLOGUE: &str = include_str!("../lua/admin_prologue.lua");

/// The line in a fair script where the prologue goes; a script without it gets the prologue in
/// front. What a script does above the marker (its cheapest paths) runs without defining any of
/// the prologue's helpers.
const PROLOGUE_MARKER: &str = "-- @prologue\n";

/// A fair script's source: the count helpers in front (fencing tokens, on every path), the fair
/// prologue joined in at its marker (or in front).
fn with_prologue(file: &str) -> String {
    match file.split_once(PROLOGUE_MARKER) {
        Some((before, after)) => format!("{COUNT_PROLOGUE}\n{before}{FAIR_PROLOGUE}\n{after}"),
        None => format!("{COUNT_PROLOGUE}\n{FAIR_PROLOGUE}\n{file}"),
    }
}

/// One script, as plain data: its source (assembled on first use) and the [`Script`] (hash
/// computed on first use). A call of it is built and sent by the command connection
/// (`conn::ScriptCall`: one `EVALSHA`, `NOSCRIPT` answered with `EVAL`).
pub(crate) struct Lua {
    pub(crate) source: LazyLock<String, fn() -> String>,
    pub(crate) script: LazyLock<Script, fn() -> Script>,
}

/// Declares the scripts as `Lua` statics (`fair "file"`: with the count helpers in front and the
/// fair prologue at its marker; `rw "file"`: with the count helpers and the read-write queue's
/// prologue in front; `permit "file"`: with the count helpers and the expirable semaphore's;
/// `count "file"`: with the count helpers; `release "file"`: with the release prologue in front;
/// `fair_release "file"`: the release prologue in front, then as `fair`; `plain "file"`: as it
/// is), and [`ALL`] listing them.
macro_rules! scripts {
    ($($name:ident = $how:ident $file:literal;)*) => {
        $(
            pub(crate) static $name: Lua = Lua {
                source: LazyLock::new(|| scripts!(@source $how $file)),
                script: LazyLock::new(|| Script::new(&$name.source)),
            };
        )*
        /// Every script, for [`eval_instead`].
        static ALL: &[&Lua] = &[$(&$name),*];
    };
    (@source fair $file:literal) => {
        with_prologue(include_str!(concat!("../lua/", $file)))
    };
    (@source rw $file:literal) => {
        format!(
            "{}\n{}\n{}",
            COUNT_PROLOGUE,
            RW_PROLOGUE,
            include_str!(concat!("../lua/", $file))
        )
    };
    (@source release $file:literal) => {
        format!("{}\n{}", RELEASE_PROLOGUE, include_str!(concat!("../lua/", $file)))
    };
    (@source fair_release $file:literal) => {
        format!(
            "{}\n{}",
            RELEASE_PROLOGUE,
            with_prologue(include_str!(concat!("../lua/", $file)))
        )
    };
    (@source permit $file:literal) => {
        format!(
            "{}\n{}\n{}",
            COUNT_PROLOGUE,
            PERMIT_PROLOGUE,
            include_str!(concat!("../lua/", $file))
        )
    };
    (@source count $file:literal) => {
        format!("{}\n{}", COUNT_PROLOGUE, include_str!(concat!("../lua/", $file)))
    };
    (@source admin $file:literal) => {
        format!("{}\n{}", ADMIN_PROLOGUE, include_str!(concat!("../lua/", $file)))
    };
    (@source plain $file:literal) => {
        include_str!(concat!("../lua/", $file)).to_owned()
    };
}

scripts! {
    FAIR_ACQUIRE = fair "fair_acquire.lua";
    FAIR_UNLOCK = fair_release "fair_unlock.lua";
    FAIR_GIVE_UP = fair "fair_give_up.lua";
    FAIR_FORCE_UNLOCK = fair "fair_force_unlock.lua";
    FAIR_HEARTBEAT = fair "fair_heartbeat.lua";
    RENEW = plain "renew.lua";
    STATE = plain "state.lua";
    LOCK_ACQUIRE = count "lock_acquire.lua";
    LOCK_UNLOCK = release "lock_unlock.lua";
    LOCK_FORCE_UNLOCK = plain "lock_force_unlock.lua";
    RW_READ_ACQUIRE = rw "rw_read_acquire.lua";
    RW_WRITE_ACQUIRE = rw "rw_write_acquire.lua";
    RW_GIVE_UP = rw "rw_give_up.lua";
    RW_HEARTBEAT = rw "rw_heartbeat.lua";
    RW_READ_UNLOCK = release "rw_read_unlock.lua";
    RW_WRITE_UNLOCK = release "rw_write_unlock.lua";
    RW_FORCE_UNLOCK = plain "rw_force_unlock.lua";
    RW_STATE = plain "rw_state.lua";
    SEMAPHORE_ACQUIRE = plain "semaphore_acquire.lua";
    SEMAPHORE_RELEASE = count "semaphore_release.lua";
    SEMAPHORE_GIVE_BACK = count "semaphore_give_back.lua";
    SEMAPHORE_SET_PERMITS = plain "semaphore_set_permits.lua";
    SEMAPHORE_ADD_PERMITS = count "semaphore_add_permits.lua";
    SEMAPHORE_DRAIN = count "semaphore_drain.lua";
    PERMIT_ACQUIRE = permit "permit_acquire.lua";
    PERMIT_RELEASE = permit "permit_release.lua";
    PERMIT_RENEW = permit "permit_renew.lua";
    PERMIT_COUNTS = permit "permit_counts.lua";
    LATCH_SET_COUNT = plain "latch_set_count.lua";
    LATCH_COUNT_DOWN = count "latch_count_down.lua";
    LATCH_DELETE = plain "latch_delete.lua";
    ADMIN_FORCE_UNLOCK = admin "admin_force_unlock.lua";
    ADMIN_PURGE_DEAD = admin "admin_purge_dead.lua";
}

/// The `EVAL` equivalent of `cmd` when it is an `EVALSHA` of one of our scripts: the source in
/// place of the hash, keys and arguments unchanged. `None` for any other command.
pub(crate) fn eval_instead(cmd: &redis::Cmd) -> Option<redis::Cmd> {
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(hash))) =
        (args.next(), args.next())
    else {
        return None;
    };
    if !name.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let lua = ALL
        .iter()
        .find(|l| l.script.get_hash().as_bytes() == hash)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(lua.source.as_str());
    for arg in args {
        match arg {
            redis::Arg::Simple(a) => eval.arg(a),
            _ => return None,
        };
    }
    Some(eval)
}

/// [`eval_instead`] for every command of `pipe`; `None` if any is not one of our `EVALSHA`s.
pub(crate) fn eval_pipeline(pipe: &redis::Pipeline) -> Option<redis::Pipeline> {
    let mut out = redis::Pipeline::new();
    for cmd in pipe.cmd_iter() {
        out.add_command(eval_instead(cmd)?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evalsha_of_each_script_becomes_eval_of_its_source_with_the_same_keys_and_args() {
        for lua in ALL {
            let mut evalsha = redis::cmd("EVALSHA");
            evalsha
                .arg(lua.script.get_hash())
                .arg(2)
                .arg("k1")
                .arg("k2")
                .arg(30_000);
            let eval = eval_instead(&evalsha).expect("one of our scripts");
            let args: Vec<Vec<u8>> = eval
                .args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => b.to_vec(),
                    _ => panic!("cursor argument"),
                })
                .collect();
            let expected: Vec<&[u8]> =
                vec![b"EVAL", lua.source.as_bytes(), b"2", b"k1", b"k2", b"30000"];
            assert_eq!(args, expected);
        }
        let names: std::collections::HashSet<&str> =
            ALL.iter().map(|l| l.script.get_hash()).collect();
        assert_eq!(names.len(), ALL.len(), "two scripts share a hash");
    }

    #[test]
    fn other_commands_and_unknown_scripts_are_left_alone() {
        assert!(eval_instead(redis::cmd("GET").arg("k")).is_none());
        assert!(eval_instead(redis::cmd("EVALSHA").arg("0".repeat(40)).arg(0)).is_none());
        let mut pipe = redis::pipe();
        pipe.add_command(
            redis::cmd("EVALSHA")
                .arg(RENEW.script.get_hash())
                .arg(0)
                .clone(),
        );
        assert_eq!(eval_pipeline(&pipe).unwrap().cmd_iter().count(), 1);
        pipe.add_command(redis::cmd("GET").arg("k").clone());
        assert!(eval_pipeline(&pipe).is_none());
    }
}
