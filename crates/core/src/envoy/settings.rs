//! The switches of the `envoy:` section: how a call is decided, recorded
//! and answered. Each default is Charon's own convention (SPEC §11); each
//! other value is how envoyproxy/ratelimit or Limitador behave, so that a
//! configuration imported from them (which writes these out) decides and
//! answers as the peer did.

use super::inline::Windows;

/// The section's switches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `shadow_mode: true`: decide and record every descriptor as usual,
    /// keep each descriptor's status (OVER_LIMIT stays visible), and
    /// answer the call OK (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub shadow_mode: bool,
    /// `headers:`: which response headers replies carry.
    pub headers: Headers,
    /// `header_names:`: other names for them.
    pub header_names: HeaderNames,
    /// `unknown_domain:`: the answer to a domain the section does not name.
    pub unknown_domain: UnknownDomain,
    /// `match:`: which node of a descriptor's path applies.
    pub matching: MatchMode,
    /// `record:`: what a call records when a descriptor is over.
    pub record: Record,
    /// `windows:`: the window inline limits count in.
    pub windows: Windows,
    /// `descriptor_limits:`: what a descriptor's own `limit` (Envoy's
    /// rate-limit override) does.
    pub descriptor_limits: DescriptorLimits,
}

/// `descriptor_limits:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DescriptorLimits {
    /// `ignore`: the configuration decides (SPEC §11).
    #[default]
    Ignore,
    /// `apply`: a descriptor that carries a `limit` is limited by it, as
    /// envoyproxy/ratelimit does (a fixed window of its unit, counted per
    /// descriptor).
    Apply,
}

impl DescriptorLimits {
    /// Every value as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["ignore", "apply"];
}

/// `headers:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Headers {
    /// `false`: none.
    #[default]
    None,
    /// `true`: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`
    /// and, when over, `Retry-After` (Charon's).
    Charon,
    /// `ratelimit`: `RateLimit-Limit`, `RateLimit-Remaining` and
    /// `RateLimit-Reset`, exactly as envoyproxy/ratelimit adds them.
    RateLimit,
    /// `x_ratelimit`: `X-RateLimit-Limit` (with the quota policy of every
    /// limit, `10, 10;w=60`), `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset`, as Limitador adds them.
    XRateLimit,
}

impl Headers {
    /// The values as the configuration writes them (besides `true` and
    /// `false`).
    pub const NAMES: &'static [&'static str] = &["ratelimit", "x_ratelimit"];
}

/// `header_names:`: the names of the limit, remaining and reset headers
/// when not the style's own (envoyproxy/ratelimit's `LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER` and `LIMIT_RESET_HEADER`). `None` is the
/// style's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderNames {
    /// Instead of `RateLimit-Limit` (`X-RateLimit-Limit`).
    pub limit: Option<String>,
    /// Instead of `RateLimit-Remaining` (`X-RateLimit-Remaining`).
    pub remaining: Option<String>,
    /// Instead of `RateLimit-Reset` (`X-RateLimit-Reset`).
    pub reset: Option<String>,
}

impl HeaderNames {
    /// The fields as the configuration writes them.
    pub const FIELDS: &'static [&'static str] = &["limit", "remaining", "reset"];
    /// The longest name, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// The names, in [`Self::FIELDS`]' order.
    pub fn each(&self) -> [&Option<String>; 3] {
        [&self.limit, &self.remaining, &self.reset]
    }

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self.each().iter().all(|n| n.is_none())
    }

    /// Whether `name` may name an HTTP header: 1 to [`Self::MAX_BYTES`]
    /// bytes of RFC 9110's token characters.
    pub fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= Self::MAX_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    }
}

/// `unknown_domain:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownDomain {
    /// `ok`: every descriptor OK, nothing recorded (envoyproxy/ratelimit
    /// and Limitador answer so): a domain configured later, or misspelt,
    /// never stops traffic behind `failure_mode_deny: true`.
    #[default]
    Ok,
    /// `error`: `INVALID_ARGUMENT`, so the caller sees at once that none
    /// of its limits apply.
    Error,
}

impl UnknownDomain {
    /// Every value as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["ok", "error"];
}

/// `match:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatchMode {
    /// `deepest`: the deepest matched node that names an action applies,
    /// even when the descriptor has entries the path did not match
    /// (SPEC §11).
    #[default]
    Deepest,
    /// `whole`: the node of the descriptor's last entry applies, only if
    /// every entry matched a node (envoyproxy/ratelimit).
    Whole,
}

impl MatchMode {
    /// Every value as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["deepest", "whole"];
}

/// `record:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Record {
    /// `all_or_nothing`: a call records only if no descriptor is over
    /// (SPEC §11; Limitador).
    #[default]
    AllOrNothing,
    /// `every_hit`: each descriptor is decided on its own and its hits are
    /// counted whether it is over or not, so a client over its limit
    /// stays over while it keeps calling (envoyproxy/ratelimit's counters).
    EveryHit,
}

impl Record {
    /// Every value as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["all_or_nothing", "every_hit"];
}
