//! Rate-limited resources: burst tiers, hard limit H, global limit G
//! (SPEC §2, paper §2.1), with what every rate-like kind shares (SPEC §10:
//! reply context, soft limits, bans, dry runs, charges).

mod context;
mod decide;
mod log;
mod state;

pub use context::{decide, decide_op, retry_after};
pub use decide::{RateReply, TierContext};
pub use log::HitLog;
pub use state::{Phase, RateState, TierState};

/// How long a dormant tier-1 state (see [`RateState::forget_at`]) is kept
/// after its window emptied: an hour, so a domain that pauses keeps exact
/// replies, and memory still does not grow as domains come and go.
pub const DORMANT_GRACE: crate::Millis = 3_600_000;

#[cfg(test)]
mod tests;
