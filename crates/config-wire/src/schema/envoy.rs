//! The `envoy:` section of the configuration, as the document describes it.

// Described, never constructed or read (so no `Debug`); the derive
// qualifies the public field types it names.
#![allow(dead_code, missing_debug_implementations, unused_qualifications)]

use utoipa::ToSchema;

use super::{Count, Duration, Name};

/// The `envoy:` section (docs/envoy.md): which Charon resource
/// limits which of Envoy's rate-limit descriptors, and how calls are
/// decided and answered. At most 10000 domains and 100000 nodes in all,
/// trees at most 16 levels deep.
#[derive(ToSchema)]
pub struct EnvoySection {
    /// Decide and record every descriptor, keep each status, and answer
    /// every call OK. Default false.
    shadow_mode: Option<bool>,
    /// false (none), true (RateLimit-* and Retry-After when over),
    /// `ratelimit` (RateLimit-*, as envoyproxy/ratelimit) or `x_ratelimit`
    /// (X-RateLimit-*, as Limitador). Default false.
    #[schema(value_type = Option<serde_json::Value>)]
    headers: Option<bool>,
    /// Other names for the limit, remaining and reset headers (only with
    /// `headers:` set).
    header_names: Option<EnvoyHeaderNames>,
    /// The answer to a domain not named here: `ok` (default) or `error`.
    #[schema(inline)]
    unknown_domain: Option<EnvoyUnknownDomain>,
    /// Which node of a descriptor's path applies: `deepest` (default) or
    /// `whole` (the last entry's, if every entry matched).
    #[schema(inline)]
    r#match: Option<EnvoyMatch>,
    /// `all_or_nothing` (default) or `every_hit` (each descriptor counted
    /// on its own, hits over the limit too).
    #[schema(inline)]
    record: Option<EnvoyRecord>,
    /// The window inline limits count in: `fixed` (default), `first_hit`
    /// or `sliding`.
    #[schema(inline)]
    windows: Option<EnvoyWindows>,
    /// What a descriptor's own limit override does: `ignore` (default) or
    /// `apply`.
    #[schema(inline)]
    descriptor_limits: Option<EnvoyDescriptorLimits>,
    /// Distinct domain names.
    domains: Option<Vec<EnvoyDomain>>,
}

/// `header_names`: HTTP header names (1 to 128 token characters), no two
/// alike, none `Retry-After`.
#[derive(ToSchema)]
pub struct EnvoyHeaderNames {
    limit: Option<String>,
    remaining: Option<String>,
    reset: Option<String>,
}

/// `unknown_domain`.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvoyUnknownDomain {
    Ok,
    Error,
}

/// `match`.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvoyMatch {
    Deepest,
    Whole,
}

/// `record`.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvoyRecord {
    AllOrNothing,
    EveryHit,
}

/// `windows`.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvoyWindows {
    Fixed,
    FirstHit,
    Sliding,
}

/// `descriptor_limits`.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvoyDescriptorLimits {
    Ignore,
    Apply,
}

/// One Envoy domain (`RateLimitRequest.domain`): its descriptor tree and
/// its `limits` (Limitador's kind: conditions over any descriptor).
#[derive(ToSchema)]
pub struct EnvoyDomain {
    domain: Name,
    /// Keep every count a call of this domain touches under one Redis hash
    /// tag (one Redis Cluster slot); those counts are then the domain's
    /// own. Default false.
    same_slot: Option<bool>,
    descriptors: Option<Vec<EnvoyNode>>,
    /// At most 1000.
    limits: Option<Vec<EnvoyLimit>>,
}

/// A descriptor node: matches the entry `key` (with `value`, only that
/// value, `*` a wildcard; without, any value, each its own Charon domain).
/// At most one of `resource`, `rate_limit` and `unlimited: true`.
#[derive(ToSchema)]
pub struct EnvoyNode {
    /// 1 to 256 bytes, no control characters.
    key: String,
    /// 1 to 1024 bytes, no control characters; a string.
    value: Option<String>,
    /// Only on a node without a value.
    mask: Option<EnvoyMask>,
    /// A rate-like resource (rate, bucket, window or queue) of the same
    /// configuration.
    resource: Option<Name>,
    rate_limit: Option<EnvoyRateLimit>,
    unlimited: Option<bool>,
    shadow_mode: Option<bool>,
    /// How replies name the limit; what `replaces` of other nodes name.
    name: Option<String>,
    /// Names of limits this node's limit switches off in the same call.
    replaces: Option<Vec<String>>,
    /// A wildcard node: every matching value shares one count.
    share_threshold: Option<bool>,
    /// Metrics carry the descriptor's values.
    detailed_metric: Option<bool>,
    /// Metrics carry this node's value.
    value_to_metric: Option<bool>,
    /// Over, the call is over only when every quota descriptor is.
    quota_mode: Option<bool>,
    #[schema(no_recursion)]
    descriptors: Option<Vec<EnvoyNode>>,
}

/// A limit over a whole call (Limitador's): every condition holds and every
/// variable is set.
#[derive(ToSchema)]
pub struct EnvoyLimit {
    name: Option<String>,
    /// At most 64.
    conditions: Option<Vec<EnvoyCondition>>,
    /// At most 64.
    variables: Option<Vec<EnvoyVariable>>,
    resource: Option<Name>,
    rate_limit: Option<EnvoyRateLimit>,
}

/// `descriptors[descriptor][key] == equals` (or `!= not_equals`).
#[derive(ToSchema)]
pub struct EnvoyCondition {
    /// The descriptor's index in the call, 0 to 1023 (default 0).
    #[schema(minimum = 0, maximum = 1023)]
    descriptor: Option<u16>,
    key: String,
    equals: Option<String>,
    not_equals: Option<String>,
}

/// `descriptors[descriptor][key]`: its value tells counts apart.
#[derive(ToSchema)]
pub struct EnvoyVariable {
    #[schema(minimum = 0, maximum = 1023)]
    descriptor: Option<u16>,
    key: String,
}

/// The value is an IP address; the client is its network of these prefix
/// lengths (defaults 32 and 48).
#[derive(ToSchema)]
pub struct EnvoyMask {
    #[schema(minimum = 0, maximum = 32)]
    ipv4: Option<u8>,
    #[schema(minimum = 0, maximum = 128)]
    ipv6: Option<u8>,
}

/// An inline limit of `requests_per_unit` per `unit` or per `window` (one
/// of them); 0 refuses every hit.
#[derive(ToSchema)]
pub struct EnvoyRateLimit {
    unit: Option<EnvoyUnit>,
    window: Option<Duration>,
    requests_per_unit: Count,
}

/// The length of an inline `rate_limit`'s window (a week, month and year
/// are 7, 30 and 365 days).
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum EnvoyUnit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}
