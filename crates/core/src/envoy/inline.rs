//! What a node or a limit of the `envoy:` section limits with when it
//! names no configured resource: an inline `rate_limit` (a window of
//! `requests_per_unit` hits per `unit` or per `window`), and how values
//! are read as client networks (`mask`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::limits::Tier;
use crate::meter::{FieldError, Meter, Policy};
use crate::time::Millis;
use crate::window::{self, Algorithm};

const DAY: Millis = 86_400_000;

/// `unit:` of an inline `rate_limit`: the length of its window, as
/// envoyproxy/ratelimit counts it (a week, a month and a year are fixed
/// spans of 7, 30 and 365 days from the epoch, never calendar ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Every unit as the configuration writes it.
    pub const NAMES: &'static [&'static str] =
        &["second", "minute", "hour", "day", "week", "month", "year"];

    const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit named `name` (one of [`Unit::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.name() == name)
    }

    /// The name as the configuration writes it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window's length: what envoyproxy/ratelimit divides time by
    /// (a day is a UTC day; a month 30 days; a year 365 days).
    pub fn millis(self) -> Millis {
        match self {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// The unit exactly `ms` long, if there is one.
    pub fn of_window(ms: Millis) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.millis() == ms)
    }
}

/// How long an inline limit's window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// `unit: minute`.
    Unit(Unit),
    /// `window: 90s`: any span (Limitador's `seconds`).
    Window(Millis),
}

/// Which window inline limits count in (the section's `windows:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Windows {
    /// Windows aligned to the epoch (`[k·W, (k+1)·W)`), as
    /// envoyproxy/ratelimit counts.
    #[default]
    Fixed,
    /// A window opened by the first hit after the previous one ended, as
    /// Limitador counts.
    FirstHit,
    /// Charon's exact sliding window (a burst tier of one: every hit
    /// counts for exactly one window after it).
    Sliding,
}

impl Windows {
    /// Every value as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["fixed", "first_hit", "sliding"];

    /// The value named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "fixed" => Some(Windows::Fixed),
            "first_hit" => Some(Windows::FirstHit),
            "sliding" => Some(Windows::Sliding),
            _ => None,
        }
    }

    /// The name as the configuration writes it.
    pub fn name(self) -> &'static str {
        match self {
            Windows::Fixed => "fixed",
            Windows::FirstHit => "first_hit",
            Windows::Sliding => "sliding",
        }
    }
}

/// An inline `rate_limit: {unit | window, requests_per_unit}`, built and
/// checked when the configuration is. `requests_per_unit: 0` refuses every
/// hit (both peers accept it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    per: Per,
    requests_per_unit: u64,
    fixed: Option<window::Params>,
    first_hit: Option<window::Params>,
    /// The one tier of `windows: sliding` (borrowed by the stores).
    tier: [Tier; 1],
}

/// What decides an inline limit, by the section's `windows:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inline<'a> {
    /// `requests_per_unit: 0`: every hit is over, nothing is recorded.
    DenyAll,
    /// A window (`fixed` or `first_hit`).
    Meter(Meter),
    /// One burst tier: an exact sliding window.
    Tiers(&'a [Tier]),
}

impl RateLimit {
    /// `requests_per_unit` from 0 to 2^53 − 1 and a window from 1 ms to
    /// 2^50 ms (an error names the field).
    pub fn new(per: Per, requests_per_unit: u64) -> Result<Self, FieldError> {
        let window = match per {
            Per::Unit(u) => u.millis(),
            Per::Window(ms) => ms,
        };
        let params = |algorithm| {
            (requests_per_unit > 0)
                .then(|| {
                    window::Params::new(algorithm, requests_per_unit, window, Policy::default())
                })
                .transpose()
                .map_err(|e| FieldError {
                    field: if e.field == "limit" {
                        "requests_per_unit"
                    } else {
                        e.field
                    },
                    message: e.message,
                })
        };
        let fixed = params(Algorithm::Fixed)?;
        let first_hit = params(Algorithm::FirstHit)?;
        if requests_per_unit == 0 && window > crate::meter::MAX_SPAN {
            return Err(FieldError {
                field: "window",
                message: format!("must be at most {}ms (2^50 ms)", crate::meter::MAX_SPAN),
            });
        }
        Ok(Self {
            per,
            requests_per_unit,
            fixed,
            first_hit,
            tier: [Tier {
                limit: requests_per_unit,
                window,
                active: None,
                cooldown: 0,
                skippable: false,
            }],
        })
    }

    /// How the window's length was written.
    pub fn per(&self) -> Per {
        self.per
    }

    /// The unit, if the window is as long as one (what Envoy's replies
    /// can say).
    pub fn unit(&self) -> Option<Unit> {
        match self.per {
            Per::Unit(u) => Some(u),
            Per::Window(ms) => Unit::of_window(ms),
        }
    }

    /// The window's length in ms.
    pub fn window(&self) -> Millis {
        self.tier[0].window
    }

    /// The limit per window.
    pub fn requests_per_unit(&self) -> u64 {
        self.requests_per_unit
    }

    /// What decides it when inline limits count in `windows`.
    pub fn decider(&self, windows: Windows) -> Inline<'_> {
        match (windows, self.fixed, self.first_hit) {
            (_, None, _) | (_, _, None) => Inline::DenyAll,
            (Windows::Fixed, Some(p), _) => Inline::Meter(Meter::Window(p)),
            (Windows::FirstHit, _, Some(p)) => Inline::Meter(Meter::Window(p)),
            (Windows::Sliding, _, _) => Inline::Tiers(&self.tier),
        }
    }

    /// The fixed window (`windows: fixed`); `None` for a limit of 0.
    pub fn meter(&self) -> Option<Meter> {
        self.fixed.map(Meter::Window)
    }
}

/// `mask: {ipv4, ipv6}` of a value-less node: the request's value is an IP
/// address, and the client is identified by its network of these prefix
/// lengths. The defaults are /32 (one IPv4 address) and /48 (an IPv6 site,
/// what Let's Encrypt limits per subscriber: one customer usually holds a
/// whole /48 or /56, so a /128 would let it rotate addresses for free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask {
    /// The IPv4 prefix length, 0 to 32.
    pub ipv4: u8,
    /// The IPv6 prefix length, 0 to 128.
    pub ipv6: u8,
}

impl Default for Mask {
    fn default() -> Self {
        Self { ipv4: 32, ipv6: 48 }
    }
}

impl Mask {
    /// `addr/prefix` of the network `text` belongs to, or `None` if `text`
    /// is not an IP address. An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`,
    /// what a dual-stack listener reports) is its IPv4 address, so one
    /// client is one key whichever socket it came in on.
    pub fn network(&self, text: &str) -> Option<String> {
        let ip: IpAddr = text.parse().ok()?;
        Some(self.of(ip))
    }

    /// `addr/prefix` of the network of `ip`.
    pub fn of(&self, ip: IpAddr) -> String {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        match ip {
            IpAddr::V4(a) => {
                let p = u32::from(self.ipv4.min(32));
                let keep = u32::MAX.checked_shl(32 - p).unwrap_or(0);
                format!("{}/{p}", Ipv4Addr::from(u32::from(a) & keep))
            }
            IpAddr::V6(a) => {
                let p = u32::from(self.ipv6.min(128));
                let keep = u128::MAX.checked_shl(128 - p).unwrap_or(0);
                format!("{}/{p}", Ipv6Addr::from(u128::from(a) & keep))
            }
        }
    }
}
