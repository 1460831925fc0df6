//! The limits a decision is handed: a rate tier, the limits of one
//! (resource, domain) pair of each kind, and whether they are enforced.
//! The configuration builds them ([`crate::config`] re-exports them); the
//! decisions (`rate`, `copy`) and the Envoy section read them, so they
//! live below all of these and none of them depends on the configuration.

use crate::time::Millis;

/// One burst tier `(L, Tw, Ta, Tc, S)` of SPEC §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    /// L: the most hits its window may hold.
    pub limit: u64,
    /// Tw: the span of its sliding window, at least 1 ms.
    pub window: Millis,
    /// Ta: how long the tier stays active once entered; `None` is infinite.
    pub active: Option<Millis>,
    /// Tc: how long it cannot be entered after its active period.
    pub cooldown: Millis,
    /// S: whether a burst search may skip it while it is in cooldown (or has
    /// a limit of zero).
    pub skippable: bool,
}

/// The limits that decide one (rate-limited resource, domain) pair: the
/// resource's H and G, and the tiers of the domain's override if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits<'a> {
    /// H: most hits per domain in the last second.
    pub hard_limit: Option<u64>,
    /// G: most hits across all domains in the last second.
    pub global_limit: Option<u64>,
    /// The ordered tiers; tier `i` (one-indexed) is `tiers[i - 1]`.
    pub tiers: &'a [Tier],
}

/// A group as a reserve sees it: its name and limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLimit {
    pub name: String,
    pub limit: u64,
}

/// The limits that decide a reserve for one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyLimits {
    pub domain_limit: u64,
    pub global_limit: Option<u64>,
    /// Every group that contains the domain, in configuration order.
    pub groups: Vec<GroupLimit>,
}

/// Whether limits are enforced for a request (SPEC §4 `ignore_configured`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Enforce,
    /// Grant everything asked for, but record the accesses.
    Ignore,
}
