//! The Lua scripts, one per operation (shared prologues joined in front at compile time), compiled in from `lua/` and run through [`redis::Script`]
//! (EVALSHA first, one NOSCRIPT fallback that loads the script).

use std::sync::LazyLock;

use redis::Script;

/// Joins the shared fair-lock prologue in front of a fair script at compile time.
macro_rules! fair_script {
    ($file:literal) => {
        concat!(
            include_str!("../lua/fair_prologue.lua"),
            "\n",
            include_str!(concat!("../lua/", $file))
        )
    };
}

pub(crate) static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair_script!("fair_acquire.lua")));
pub(crate) static FAIR_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/unlock_latch.lua"),
        "\n",
        fair_script!("fair_unlock.lua")
    ))
});
pub(crate) static FAIR_GIVE_UP: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair_script!("fair_give_up.lua")));
pub(crate) static FAIR_FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair_script!("fair_force_unlock.lua")));
pub(crate) static FAIR_HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair_script!("fair_heartbeat.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/renew.lua")));
pub(crate) static HOLD_PROBE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/hold_probe.lua")));
pub(crate) static STATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/state.lua")));
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_acquire.lua")));
pub(crate) static LOCK_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/unlock_latch.lua"),
        "\n",
        include_str!("../lua/lock_unlock.lua")
    ))
});
pub(crate) static LOCK_FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_force_unlock.lua")));
