//! The client's driver task: one per client, one hashed timing wheel, all background work.
//!
//! Work arrives over an unbounded channel from lock handles, guards and dropped futures (so `Drop`
//! never does I/O), and from the driver's own I/O tasks reporting back; registering and forgetting
//! a held lock goes through a lazy inbox the driver reads on its next tick instead, so the
//! uncontended lock/unlock path never wakes it; and a grant its timers already cover ([`Watch`])
//! is not sent at all. The concerns live one per file:
//!
//! * [`work`]: what the driver is sent ([`Work`]) and the handle that sends it ([`DriverHandle`]);
//! * [`wheel`]: the hashed timing wheel, a pure data structure over integer ticks;
//! * [`timers`]: what the wheel holds, and the clock that turns monotonic time into its ticks;
//! * [`watchdog`]: renewals and validity deadlines of held locks, and permit renewals;
//! * [`heartbeat`]: deadline heartbeats of fair waiters that are still waiting;
//! * [`tracked`]: what the driver needs from a held lock ([`Tracked`]), so it sees no engine state;
//! * [`run_to_end`]: running an operation inside the caller's future, handing it to the driver only
//!   if the caller drops it;
//! * [`run`]: the driver's loop, which dispatches work and fires timers.
//!
//! The driver never awaits Redis itself: I/O runs in spawned tasks that report back, so one slow
//! round trip never delays a timer. It ends when the client (every handle and guard) is gone.

mod heartbeat;
mod run;
mod run_to_end;
mod timers;
mod tracked;
mod watchdog;
mod wheel;
mod work;

pub(crate) use heartbeat::WaiterBeat;
pub(crate) use run::start;
pub(crate) use run_to_end::RunToEnd;
pub(crate) use tracked::{Tracked, Watch};
pub(crate) use work::{Confirm, DriverHandle, Work};
