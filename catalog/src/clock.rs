//! The clock that stamps syncs and failures, injected so tests are deterministic.

use std::time::{SystemTime, UNIX_EPOCH};

use psych_types::UnixMillis;

/// Tells the time, in milliseconds since the Unix epoch. The catalogue stamps every sync and
/// every failure with it, and the freshener reads it to decide when a stored sync is stale.
///
/// Any `Fn() -> UnixMillis` closure is a clock, so a test can pass a counter.
pub trait Clock: Send + Sync + 'static {
    /// The time now.
    fn now(&self) -> UnixMillis;
}

impl<F> Clock for F
where
    F: Fn() -> UnixMillis + Send + Sync + 'static,
{
    fn now(&self) -> UnixMillis {
        self()
    }
}

/// The system's wall clock. A clock set before 1970 reads as 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_are_clocks_and_the_system_clock_is_after_2020() {
        let fixed = || 42;
        assert_eq!(Clock::now(&fixed), 42);
        assert!(SystemClock.now() > 1_577_836_800_000);
    }
}
