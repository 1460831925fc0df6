//! The reply of a rate-like operation, whatever the resource's kind.

use charon_core::meter::Reply;
use charon_core::rate::RateReply;

/// Options of a request that callers of the plain [`crate::Limiter::request`]
/// never needed; `RequestOptions::default()` is an ordinary request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// Decide and answer exactly as the request would be, and record
    /// nothing (SPEC §10): a client can ask "would this pass?" before it
    /// spends the work.
    pub dry_run: bool,
}

impl RequestOptions {
    /// A dry run.
    pub fn dry_run() -> Self {
        Self { dry_run: true }
    }
}

/// A decision on a rate-like resource: the burst tiers answer with their
/// own reply (SPEC §2 rule 6), buckets, windows and queues with the shared
/// reply context of SPEC §10. Kept as two variants rather than one merged
/// struct so that no protocol can show a tier field for a bucket or the
/// reverse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `kind: rate` (and an unconfigured resource of a namespace that
    /// allows it).
    Tiers(RateReply),
    /// `kind: bucket`, `window` or `queue`.
    Meter {
        /// The store's reply.
        reply: Reply,
        /// The namespace ignores its limits (SPEC §4 `ignore_configured`):
        /// the request was granted whole and recorded as a charge.
        ignored: bool,
    },
}

impl Decision {
    /// Units granted (request), charged or refunded.
    pub fn granted(&self) -> u64 {
        match self {
            Decision::Tiers(r) => r.granted,
            Decision::Meter { reply, .. } => reply.granted,
        }
    }

    /// The reply context of a bucket, window or queue; `None` for tiers.
    pub fn meter(&self) -> Option<&Reply> {
        match self {
            Decision::Tiers(_) => None,
            Decision::Meter { reply, .. } => Some(reply),
        }
    }
}
