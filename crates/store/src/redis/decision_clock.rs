//! The clock the Redis scripts decide with: Redis `TIME`, read inside each
//! script, so that servers with skewed clocks agree. A virtual clock can
//! stand in for it ([`crate::RedisOptions::clock`]): `charon simulate
//! --store redis://…` replays events at their own times through the
//! scripts, and tests decide on a manual clock. A server never sets one.

use std::sync::Arc;

use charon_core::{Clock, Millis};

/// How long expiry is pushed back under a virtual clock, whose time does
/// not move with Redis' own: long enough that no key vanishes during a
/// replay or a test (a replay deletes its keys at its end).
const VIRTUAL_CLOCK_EXPIRY_SLACK: Millis = 86_400_000;

/// Redis `TIME`, or a virtual clock.
#[derive(Debug, Clone, Default)]
pub(crate) struct DecisionClock {
    virtual_clock: Option<Arc<dyn Clock>>,
}

impl DecisionClock {
    /// Decides with `clock` instead of Redis `TIME` (`None`: Redis `TIME`).
    pub(crate) fn new(clock: Option<Arc<dyn Clock>>) -> Self {
        Self {
            virtual_clock: clock,
        }
    }

    /// The scripts' clock argument: the virtual clock's time, or '' for
    /// Redis `TIME`.
    pub(crate) fn arg(&self) -> String {
        match &self.virtual_clock {
            Some(c) => c.now().to_string(),
            None => String::new(),
        }
    }

    /// The virtual clock's time, if there is one (`None`: Redis `TIME`).
    pub(crate) fn virtual_now(&self) -> Option<Millis> {
        self.virtual_clock.as_ref().map(|c| c.now())
    }

    /// How much later than the decision clock says keys expire (see
    /// `expire_at` in `common.lua`): 0 with Redis `TIME`.
    pub(crate) fn expiry_slack(&self) -> Millis {
        if self.virtual_clock.is_some() {
            VIRTUAL_CLOCK_EXPIRY_SLACK
        } else {
            0
        }
    }
}
