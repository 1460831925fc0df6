use std::time::Duration;

use charon_proto::v1;

/// How a grant came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The server decided.
    Server,
    /// The server could not be reached or answered a server error; the
    /// client granted `min_copies` on its own (paper §4.3).
    Degraded,
    /// The server rejected and the kill switch turned the rejection into a
    /// grant of `min_copies`.
    KillSwitch,
}

/// The answer to a rate-limited request.
#[derive(Debug, Clone)]
pub struct RateGrant {
    /// Hits granted (0: rejected).
    pub granted: u64,
    /// Who decided.
    pub source: Source,
    /// The server's last reply (its full context), if there was one.
    pub reply: Option<v1::RateReply>,
    /// Time spent waiting for a grant (back-off included).
    pub waited: Duration,
}

impl RateGrant {
    /// Whether anything was granted.
    pub fn is_granted(&self) -> bool {
        self.granted > 0
    }

    /// When a request for `min_copies` would be granted if nothing else
    /// arrived (SPEC §10, every rate-like kind): zero if now, `None` if
    /// never, or if the server did not say.
    pub fn retry_after(&self) -> Option<Duration> {
        self.reply
            .as_ref()
            .and_then(|r| r.retry_after_ms)
            .map(Duration::from_millis)
    }

    /// How long to wait before proceeding with what a queue granted (SPEC
    /// §9): the queue throttles by delay instead of rejecting. Zero for
    /// other kinds.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.reply.as_ref().and_then(|r| r.delay_ms).unwrap_or(0))
    }

    /// Whether the client granted without the server (degraded mode).
    pub fn is_degraded(&self) -> bool {
        self.source == Source::Degraded
    }
}
