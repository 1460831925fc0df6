//! The real clock of a single limiting server.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use charon_core::{Clock, Millis};

/// Milliseconds since the Unix epoch, read once at start and then advanced
/// by the monotonic clock: an NTP step never moves it backwards, which the
/// windows of SPEC §2 rely on.
#[derive(Debug)]
pub struct SystemClock {
    epoch_at_start: Millis,
    start: Instant,
}

impl SystemClock {
    /// A clock anchored at the current wall time.
    #[allow(clippy::disallowed_methods)] // the one place that reads it
    pub fn new() -> Self {
        let epoch_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            epoch_at_start,
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_at_start.saturating_add(elapsed)
    }
}
