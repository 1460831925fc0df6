//! Why a call of the page's API got no answer, shared by the handlers
//! (`api`, which maps each to HTTP) and the replays that fail with one
//! (`input`, `replay`, `meters`, `throttle`), so that none of those
//! depends on the handlers.

use charon_core::config::ConfigIssue;

/// Why a call got no answer. A rejected request is not an error: it is an
/// ordinary reply inside a successful replay.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The body is wrong; every issue with its path.
    Invalid(Vec<ConfigIssue>),
    /// More events than [`MAX_EVENTS`](crate::input::MAX_EVENTS).
    TooManyEvents(usize),
    /// More events × tiers than [`MAX_EVENT_TIERS`](crate::input::MAX_EVENT_TIERS).
    TooMuchWork { events: usize, tiers: usize },
    /// The tier snapshots would list more than [`MAX_HIT_TIMES`](crate::replay::MAX_HIT_TIMES) hits.
    TooManyHitTimes,
    /// `detail: "full"` would list more than [`MAX_LISTED_TIER_STATES`](crate::replay::MAX_LISTED_TIER_STATES)
    /// tier states.
    TooManyTierStates,
    /// A body over [`BODY_LIMIT`](crate::BODY_LIMIT) bytes.
    TooLarge,
    /// [`MAX_CONCURRENT_REPLAYS`](crate::MAX_CONCURRENT_REPLAYS) calls are running already.
    Busy,
    /// The replay task died (a bug; reported, not hidden).
    Internal(String),
}

impl ApiError {
    pub(crate) fn invalid(issues: Vec<ConfigIssue>) -> Self {
        Self::Invalid(issues)
    }
}

/// A JSON encoding failure of an answer (a bug; reported, not hidden).
pub(crate) fn encoding(e: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("cannot encode the answer: {e}"))
}
