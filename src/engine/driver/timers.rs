//! The driver's clock: what the timing wheel holds ([`Timer`]) and [`Timers`], the wheel with the
//! clock that drives it (monotonic instants in, ticks out).

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::heartbeat::WaiterBeat;
use super::wheel::{TimerHandle, Wheel};

/// What the wheel holds.
#[derive(Debug)]
pub(super) enum Timer {
    Renew(u64),
    Validity(u64),
    Heartbeat(Weak<WaiterBeat>),
    Permits(Weak<crate::engine::permit::PermitLease>),
}

/// The wheel and the clock that drives it: monotonic instants in, ticks out.
pub(super) struct Timers {
    pub(super) wheel: Wheel<Timer>,
    /// Tick 0.
    pub(super) start: Instant,
    pub(super) tick: Duration,
}

impl Timers {
    /// The tick an instant falls in (rounded down, so deadlines fire early rather than late).
    pub(super) fn tick_of(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.start);
        (since.as_nanos() / self.tick.as_nanos().max(1)) as u64
    }

    /// When the next tick starts, if anything is scheduled. (In nanoseconds since the start, so
    /// it holds beyond 2^32 ticks: 50 days at a 1 ms tick.)
    pub(super) fn next_tick(&self) -> Option<Instant> {
        if self.wheel.is_empty() {
            return None;
        }
        let ticks = u128::from(self.wheel.current_tick()) + 1;
        let nanos = (ticks * self.tick.as_nanos()).min(u128::from(u64::MAX));
        Some(self.start + Duration::from_nanos(nanos as u64))
    }

    /// The first point of a grid of `step` (anchored at the driver's start) at or after
    /// `earliest + step / 2`. Renewals and heartbeats are scheduled on such grids so that every
    /// entry of one kind comes due in the same tick and goes out in one batch, however the
    /// acquisitions were spread: after its first cycle, each entry fires on every grid point.
    /// The wait is between half a step and one and a half steps.
    pub(super) fn next_grid(&self, earliest: Instant, step: Duration) -> Instant {
        let since = (earliest + step / 2).saturating_duration_since(self.start);
        let step_ns = step.as_nanos().max(1);
        let k = since.as_nanos().div_ceil(step_ns);
        self.start + Duration::from_nanos((k * step_ns).min(u64::MAX as u128) as u64)
    }

    pub(super) fn schedule(&mut self, at: Instant, timer: Timer) -> TimerHandle {
        let tick = self.tick_of(at);
        self.wheel.insert(tick, timer)
    }

    pub(super) fn cancel(&mut self, handle: TimerHandle) {
        self.wheel.cancel(handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_tick_holds_beyond_two_to_the_thirty_two_ticks() {
        let start = Instant::now();
        let tick = Duration::from_millis(1);
        let current = (1u64 << 32) + 5;
        let mut timers = Timers {
            wheel: Wheel::with_start(16, current),
            start,
            tick,
        };
        assert_eq!(timers.next_tick(), None, "nothing scheduled");
        timers.wheel.insert(current + 10, Timer::Validity(1));
        assert_eq!(
            timers.next_tick(),
            Some(start + Duration::from_millis(current + 1))
        );
        assert_eq!(
            timers.tick_of(start + Duration::from_millis(current + 1)),
            current + 1
        );
    }
}
