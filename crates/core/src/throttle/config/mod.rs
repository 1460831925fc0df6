//! The `throttle:` section of a configuration file (SPEC §13), read with
//! the one field checker ([`crate::fields`]) so that every problem is
//! reported with its path (`throttle.rate: expected a whole number, found
//! the string "x"`).

mod read;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::Millis;
use crate::config::ConfigErrors;
use crate::fields::{Issues, Path};
use read::read;
pub use read::{cost, parse_cost};

/// How units are counted (SPEC §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    /// One unit per request; `rate` is requests per second, `queue`
    /// requests waiting.
    Qps,
    /// A request's units are its predicted CPU-milliseconds; `rate` is
    /// CPU-milliseconds per second, `queue` predicted CPU-milliseconds
    /// waiting.
    Cost,
}

impl Discipline {
    /// The name written in configuration files and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Discipline::Qps => "qps",
            Discipline::Cost => "cost",
        }
    }
}

/// How important a request is to the service (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Criticality {
    /// May evict queued `NOT_CRITICAL` requests from a full queue.
    Critical,
    /// Rejected by a full queue, evicted by a `CRITICAL` arrival.
    NotCritical,
}

impl Criticality {
    /// The header value and configuration spelling: `CRITICAL`,
    /// `NOT_CRITICAL`.
    pub fn name(self) -> &'static str {
        match self {
            Criticality::Critical => "CRITICAL",
            Criticality::NotCritical => "NOT_CRITICAL",
        }
    }

    /// Reads a header value (case-insensitive, surrounding spaces
    /// ignored); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("CRITICAL") {
            Some(Criticality::Critical)
        } else if t.eq_ignore_ascii_case("NOT_CRITICAL") {
            Some(Criticality::NotCritical)
        } else {
            None
        }
    }
}

/// What a rejected HTTP request is answered (gRPC requests always get
/// `RESOURCE_EXHAUSTED` with a retry delay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// 429 or 503, with `Retry-After`.
    Status(u16),
    /// A 307 redirect to this URL (another resource or an error page),
    /// with `Retry-After`.
    Redirect(String),
}

/// How a client is recognised, for per-client limits (seed 001: ALL, IP,
/// HTTP header, HTTP cookie, region code, user IP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKey {
    /// Every request is the same client (one key, `all`).
    All,
    /// The remote address (the peer, or the first address of
    /// `X-Forwarded-For` when `forwarded` is set: the user IP behind a
    /// proxy), masked to a network: `ipv4` and `ipv6` prefix lengths.
    Ip {
        /// IPv4 prefix length kept (32: the address itself).
        ipv4: u8,
        /// IPv6 prefix length kept (128: the address itself).
        ipv6: u8,
        /// Use the first `X-Forwarded-For` address (the user IP) when
        /// present.
        forwarded: bool,
    },
    /// The value of a request header.
    Header(String),
    /// The value of a cookie.
    Cookie(String),
    /// A region code from a header set by the edge (for example
    /// `x-client-region`).
    Region(String),
}

/// A limit per client of the throttled service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimit {
    /// How the client is recognised; its key is the Charon domain.
    pub key: ClientKey,
    /// A rate-like resource of the same file, decided in the throttler's
    /// process (no network hop).
    pub resource: Option<String>,
    /// A resource asked of the Charon server (`throttle.charon`) for the
    /// same domain.
    pub global: Option<String>,
}

/// What the throttler does when the Charon server cannot be reached
/// (the paper's degraded modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degraded {
    /// Admit as if the server had granted.
    Optimistic,
    /// Reject as if the server had refused.
    Pessimistic,
    /// Leases: spend the lease's safe capacity; requests: as optimistic.
    Safe,
}

/// The Charon server that global limits are asked of.
#[derive(Debug, Clone, PartialEq)]
pub struct Global {
    /// Its gRPC endpoint (`http://127.0.0.1:7070`).
    pub server: String,
    /// What to do when it cannot be reached.
    pub degraded: Degraded,
    /// A capacity lease resource for key `all`: the throttler holds a lease
    /// of `wants` requests per second and spends it locally, so no call is
    /// made per request.
    pub lease: Option<GlobalLease>,
}

/// A lease held of the Charon server (`throttle.charon.lease`).
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalLease {
    /// The `kind: lease` resource on the server.
    pub resource: String,
    /// Requests per second wanted.
    pub wants: f64,
}

/// The throttler's configuration (SPEC §13), validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleConfig {
    /// `qps` or `cost`.
    pub discipline: Discipline,
    /// Units per second released, at least 1.
    pub rate: u64,
    /// Units that may wait (requests, or predicted CPU-ms).
    pub queue: u64,
    /// A queued request not started this long after its arrival expires.
    pub max_wait: Millis,
    /// For requests that do not say.
    pub default_criticality: Criticality,
    /// A class's prediction before any measurement, in CPU-microseconds.
    pub default_cost_us: u64,
    /// Starting predictions per class, in CPU-microseconds.
    pub classes: BTreeMap<String, u64>,
    /// What a rejected HTTP request gets.
    pub reject: Reject,
    /// Limits per client.
    pub clients: Vec<ClientLimit>,
    /// The Charon server of the global limits, if any.
    pub charon: Option<Global>,
}

impl ThrottleConfig {
    /// The throttler of SPEC §13's example, less its classes: `discipline`,
    /// `rate` and `queue` as given, `max_wait` 2 s, CRITICAL by default,
    /// 5 ms default cost, 429.
    pub fn new(discipline: Discipline, rate: u64, queue: u64) -> Self {
        Self {
            discipline,
            rate: rate.max(1),
            queue,
            max_wait: 2_000,
            default_criticality: Criticality::Critical,
            default_cost_us: 5_000,
            classes: BTreeMap::new(),
            reject: Reject::Status(429),
            clients: Vec::new(),
            charon: None,
        }
    }

    /// The starting prediction of `class`, in CPU-microseconds.
    pub fn cold_cost_us(&self, class: &str) -> u64 {
        self.classes
            .get(class)
            .copied()
            .unwrap_or(self.default_cost_us)
    }

    /// Reads a `throttle:` section. Resource names are checked against
    /// `resources` (the names of the file's rate-like resources) by the
    /// caller, which knows them: see [`ThrottleConfig::local_resources`].
    pub fn from_value(v: &Value, path: &Path) -> Result<Self, ConfigErrors> {
        let mut issues = Issues::default();
        let parsed = read(v, path, &mut issues);
        match parsed {
            Some(c) if issues.is_empty() => Ok(c),
            _ => Err(ConfigErrors(issues.into_vec())),
        }
    }

    /// Every in-process resource the client limits name, with its path
    /// (`throttle.clients[0].resource`), for the caller to check.
    pub fn local_resources(&self, path: &Path) -> Vec<(Path, &str)> {
        let clients = path.key("clients");
        self.clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.resource
                    .as_deref()
                    .map(|r| (clients.index(i).key("resource"), r))
            })
            .collect()
    }
}

/// The fields of `throttle:`.
pub const FIELDS: &[&str] = &[
    "discipline",
    "rate",
    "queue",
    "max_wait",
    "default_criticality",
    "default_cost",
    "classes",
    "reject",
    "clients",
    "charon",
];
const CLIENT_FIELDS: &[&str] = &["key", "mask", "forwarded", "name", "resource", "global"];
const CHARON_FIELDS: &[&str] = &["server", "degraded", "lease"];
const LEASE_FIELDS: &[&str] = &["resource", "wants"];
/// The most starting predictions one section may name.
pub const MAX_CLASSES: usize = 10_000;
/// The most client limits one section may hold.
pub const MAX_CLIENT_LIMITS: usize = 64;
/// The largest cost a prediction may start from: an hour of CPU.
pub const MAX_COST_US: u64 = 3_600_000_000;
/// The longest `max_wait`: an hour. A request queued longer than that has
/// long been given up by its caller.
pub const MAX_WAIT: Millis = 3_600_000;
/// The largest `rate` and `queue`: far above any one process, far below
/// where the exact arithmetic could overflow.
pub const MAX_UNITS: u64 = 1_000_000_000;

/// Reads `v` and returns it or every problem (for callers that keep a
/// `throttle:` section beside other sections).
pub fn parse(v: &Value, path: &Path) -> Result<ThrottleConfig, ConfigErrors> {
    ThrottleConfig::from_value(v, path)
}
