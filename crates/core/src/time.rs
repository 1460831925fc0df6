//! Time as the limiter sees it: integer milliseconds, read from an injected clock.
//!
//! Every rule of SPEC §2 is stated in whole milliseconds, so the core never
//! reads a wall clock itself; stores hand it `now`. Tests move a
//! [`ManualClock`] by hand and hit each boundary exactly.

use std::sync::atomic::{AtomicU64, Ordering};

/// A point in time or a span, in milliseconds.
pub type Millis = u64;

/// One second, the span of the hard limit H and the global limit G.
pub const SECOND: Millis = 1_000;

/// A source of `now`. Implemented by the system clock in the store crate, by
/// Redis `TIME` in the Redis store, and by [`ManualClock`] in tests and in
/// `charon simulate`.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time in milliseconds. Must never go backwards.
    fn now(&self) -> Millis;
}

/// A clock that only moves when told to: the virtual clock of tests and of
/// `charon simulate`.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Millis) -> Self {
        Self(AtomicU64::new(start))
    }

    /// Moves the clock to `t`. Callers are responsible for never moving it
    /// backwards (the simulator refuses such events before they get here).
    pub fn set(&self, t: Millis) {
        self.0.store(t, Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Millis) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// Formats a span the way configuration files write it (`250ms`, `1s`,
/// `1h 30m`), so that exported configuration parses back to the same value.
pub fn format_span(ms: Millis) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// Parses a human duration (`250ms`, `1s`, `15m`, `24h`, `1h 30m`) into whole
/// milliseconds. Sub-millisecond parts are refused rather than rounded, so
/// that nothing a user wrote is silently changed.
pub fn parse_span(text: &str) -> Result<Millis, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|_| {
        format!("{text:?} is not a duration (write it like \"250ms\", \"1s\", \"15m\" or \"24h\")")
    })?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{text:?} is not a whole number of milliseconds"));
    }
    u64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= crate::MAX_COUNT)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip() {
        for ms in [0, 1, 250, 1_000, 1_500, 60_000, 86_100_000, 86_400_000] {
            assert_eq!(parse_span(&format_span(ms)), Ok(ms), "{ms}");
        }
    }

    #[test]
    fn spans_refuse_garbage_and_fractions() {
        assert!(parse_span("1x").is_err());
        assert!(parse_span("").is_err());
        assert!(parse_span("1500us").is_err());
        assert!(parse_span("-1s").is_err());
        assert_eq!(parse_span("2000us"), Ok(2));
        assert_eq!(parse_span("1h 30m"), Ok(5_400_000));
    }
}
