//! The CLI's own Lua scripts (`lua/cli_*.lua`), each with `lua/cli_prologue.lua` joined in front
//! at compile time. Lua lives in those files only.

use std::sync::LazyLock;

use redis::Script;

macro_rules! cli_script {
    ($file:literal) => {
        concat!(
            include_str!("../lua/cli_prologue.lua"),
            "\n",
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// Deletes a lock, drops dead heads, wakes the live head and plain waiters.
pub static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(cli_script!("cli_force_unlock.lua")));

/// Removes every waiter that looks dead; wakes the new head of a free lock.
pub static PURGE_DEAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(cli_script!("cli_purge_dead.lua")));
