//! The clock the Redis scripts decide with: Redis `TIME`, read inside each
//! script. Only with the `test-clock` feature (tests) can a manual clock
//! stand in for it; production builds have no way to pass a time in.

#[cfg(feature = "test-clock")]
use std::sync::Arc;

#[cfg(feature = "test-clock")]
use charon_core::Clock;
use charon_core::Millis;

/// How long expiry is pushed back under a test clock, whose time does not
/// move with Redis' own: long enough that no key vanishes during a test.
#[cfg(feature = "test-clock")]
const TEST_CLOCK_EXPIRY_SLACK: Millis = 86_400_000;

/// Redis `TIME`, or (feature `test-clock`) a test's clock.
#[derive(Debug, Clone, Default)]
pub(crate) struct DecisionClock {
    #[cfg(feature = "test-clock")]
    manual: Option<Arc<dyn Clock>>,
}

impl DecisionClock {
    /// Decides with `clock` instead of Redis `TIME`.
    #[cfg(feature = "test-clock")]
    pub(crate) fn manual(clock: Option<Arc<dyn Clock>>) -> Self {
        Self { manual: clock }
    }

    /// The scripts' clock argument: the test clock's time, or '' for Redis
    /// `TIME`.
    pub(crate) fn arg(&self) -> String {
        #[cfg(feature = "test-clock")]
        if let Some(c) = &self.manual {
            return c.now().to_string();
        }
        String::new()
    }

    /// How much later than the decision clock says keys expire (see
    /// `expire_at` in `common.lua`): 0 with Redis `TIME`.
    pub(crate) fn expiry_slack(&self) -> Millis {
        #[cfg(feature = "test-clock")]
        if self.manual.is_some() {
            return TEST_CLOCK_EXPIRY_SLACK;
        }
        0
    }
}
