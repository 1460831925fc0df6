//! From a request body to a validated configuration and request list.
//!
//! The configuration part is checked by charon-core exactly as a
//! configuration file is: the body's `kind` (default `rate`) and the fields
//! of that kind (`name`, `hard_limit` and `tiers` for `rate`; `burst`,
//! `count`, `period`, … for a bucket, a window or a queue) become one
//! resource, [`Config::from_value`] validates and normalizes it (SPEC §2,
//! §7–10), and its issue paths are reported relative to the body
//! (`tiers[1].window`, not `resources[0].tiers[1].window`).

use charon_core::Millis;
use charon_core::config::{Adjustment, Config, ConfigIssue, RateResource, ResourceKind};
use charon_core::fields::{self, Issues, Path, describe};
use charon_core::meter::{Meter, Op};
use charon_core::request::Amount;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The most requests one replay may hold. Past it the page asks for a reset:
/// at the generator's fastest this is several minutes of traffic.
pub const MAX_EVENTS: usize = 20_000;

/// The most tiers a simulated resource may have (a real configuration has
/// no such bound; a page with more lanes than this is unreadable anyway).
pub const MAX_TIERS: usize = 32;

/// The most work one replay may ask for, in events × tiers: each decision
/// walks every tier, and the answer grows with both. 20 000 events (the
/// most) with 5 tiers, 10 000 with 10, or 3 125 with 32 (one replay costs
/// about 20 MiB at most, debug build); past it the page is told to
/// reset or to use fewer tiers. With [`crate::MAX_CONCURRENT_REPLAYS`] this
/// bounds what the simulator can cost a server.
pub const MAX_EVENT_TIERS: usize = 100_000;

/// Every issue is reported, up to this many; a list of 20 000 broken events
/// needs only the first few to be understood.
const MAX_ISSUES: usize = 50;

/// The resource name used when the body has none (replays need no name).
const DEFAULT_NAME: &str = "simulator/example";

/// The fields a body may have. `/run` uses all of them; `/yaml` accepts the
/// same body and uses the configuration fields only.
const BODY_FIELDS: &[&str] = &[
    "name",
    "kind",
    "hard_limit",
    "tiers",
    "burst",
    "count",
    "period",
    "algorithm",
    "limit",
    "window",
    "rate",
    "size",
    "soft_limit",
    "ban",
    "events",
    "at",
    "report_from",
    "detail",
];
/// The configuration fields copied into the resource (the rest of
/// [`BODY_FIELDS`] is the replay's). charon-core says which of them the
/// kind does not have, at the body's path.
const RESOURCE_FIELDS: &[&str] = &[
    "hard_limit",
    "tiers",
    "burst",
    "count",
    "period",
    "algorithm",
    "limit",
    "window",
    "rate",
    "size",
    "soft_limit",
    "ban",
];
/// The kinds the page simulates: one domain of a rate-like resource
/// (`copy` needs sessions, which a replay of requests has not).
pub(crate) const KINDS: &[&str] = &["rate", "bucket", "window", "queue"];
const EVENT_FIELDS: &[&str] = &["t", "op", "copies", "min_copies", "dry_run"];
const OPS: &[&str] = &["request", "charge", "refund"];

/// A validated, normalized one-resource configuration.
#[derive(Debug)]
pub(crate) struct Setup {
    pub config: Config,
    /// What normalization changed, with body-relative paths.
    pub adjustments: Vec<Adjustment>,
}

impl Setup {
    /// The burst tiers, for `kind: rate`.
    pub fn rate(&self) -> Option<&RateResource> {
        match &self.config.resources().first()?.kind {
            ResourceKind::Rate(r) => Some(r),
            _ => None,
        }
    }

    /// A bucket's, window's or queue's parameters for `domain`.
    pub fn meter(&self, domain: &str) -> Option<Meter> {
        self.config.resources().first()?.kind.meter(domain)
    }
}

/// One simulated event: a request (maybe a dry run), a charge or a refund
/// (SPEC §10).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub t: Millis,
    pub op: Op,
}

impl Event {
    /// The amount of a request; `None` for a charge or a refund.
    pub fn amount(&self) -> Option<Amount> {
        match self.op {
            Op::Request { amount, .. } => Some(amount),
            Op::Charge(_) | Op::Refund(_) => None,
        }
    }

    /// `request`, `charge` or `refund`, as events and replies write it.
    pub fn op_name(&self) -> &'static str {
        match self.op {
            Op::Request { .. } => "request",
            Op::Charge(_) => "charge",
            Op::Refund(_) => "refund",
        }
    }

    /// What every kind's answer says of the event it decided, the
    /// `index`-th of the body.
    pub fn head(&self, index: usize) -> EventHead {
        EventHead {
            index,
            t: self.t,
            op: self.op_name(),
            copies: match self.op {
                Op::Request { amount, .. } => amount.copies(),
                Op::Charge(n) | Op::Refund(n) => n,
            },
            min_copies: self.amount().map(Amount::min_copies),
            dry_run: matches!(self.op, Op::Request { dry_run: true, .. }),
        }
    }
}

/// The event as an answer lists it, before the kind's own fields.
#[derive(Debug, Serialize)]
pub(crate) struct EventHead {
    /// Position in the request's `events`.
    index: usize,
    t: Millis,
    /// `request`, `charge` or `refund` (SPEC §10).
    op: &'static str,
    copies: u64,
    /// A request's; none for a charge or a refund.
    #[serde(skip_serializing_if = "Option::is_none")]
    min_copies: Option<u64>,
    dry_run: bool,
}

/// How much of each event's state `/run` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// Reply, hits placed, and every tier's state with its hits' times.
    Full,
    /// Reply and hits placed only (what the page needs for its log).
    Replies,
}

/// A validated `/run` body.
#[derive(Debug)]
pub(crate) struct Replay {
    pub setup: Setup,
    pub events: Vec<Event>,
    /// The page's clock, for the `now` snapshot.
    pub at: Option<Millis>,
    /// Events before this time are replayed but not listed.
    pub report_from: Millis,
    pub detail: Detail,
}

/// Parses a body as a JSON object.
pub(crate) fn body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::invalid(vec![issue(
            "",
            format!("expected a body (a mapping), found {}", describe(&other)),
        )])),
        Err(e) => Err(ApiError::invalid(vec![issue(
            "",
            format!("the body is not JSON: {e}"),
        )])),
    }
}

/// `setup` gives `None` only after reporting an issue; should that ever
/// not hold, the request is refused rather than the server panicking.
fn no_setup() -> ApiError {
    ApiError::invalid(vec![issue(
        "",
        "no configuration could be built from this body".to_owned(),
    )])
}

/// The configuration of a `/yaml` body: `name` is required there, since
/// what it renders is meant to be pasted into a real configuration.
pub(crate) fn yaml_setup(body: &Map<String, Value>) -> Result<Setup, ApiError> {
    let mut issues = Issues::default();
    fields::unknown_fields(body, &Path::root(), BODY_FIELDS, &mut issues);
    let setup = setup(body, None, &mut issues);
    finish(issues)?;
    setup.ok_or_else(no_setup)
}

/// A whole `/run` body.
pub(crate) fn replay(body: &Map<String, Value>) -> Result<Replay, ApiError> {
    // Counted before anything else is looked at, so an oversized list costs
    // nothing to refuse.
    if let Some(Value::Array(events)) = body.get("events") {
        if events.len() > MAX_EVENTS {
            return Err(ApiError::TooManyEvents(events.len()));
        }
        if let Some(Value::Array(tiers)) = body.get("tiers")
            && events.len().saturating_mul(tiers.len()) > MAX_EVENT_TIERS
        {
            return Err(ApiError::TooMuchWork {
                events: events.len(),
                tiers: tiers.len(),
            });
        }
    }
    let root = Path::root();
    let mut issues = Issues::default();
    fields::unknown_fields(body, &root, BODY_FIELDS, &mut issues);
    let setup = setup(body, Some(DEFAULT_NAME), &mut issues);
    let events = match body.get("events") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => fields::list(v, &root.key("events"), &mut issues)
            .map(|items| events(items, &root.key("events"), &mut issues))
            .unwrap_or_default(),
    };
    let at = fields::optional_count(body, "at", &root, &mut issues);
    let report_from = fields::optional_count(body, "report_from", &root, &mut issues).unwrap_or(0);
    let detail = match body.get("detail") {
        None | Some(Value::Null) => Some("full"),
        Some(v) => fields::one_of(v, &["full", "replies"], &root.key("detail"), &mut issues),
    };
    let detail = match detail {
        Some("replies") => Detail::Replies,
        _ => Detail::Full,
    };
    finish(issues)?;
    Ok(Replay {
        setup: setup.ok_or_else(no_setup)?,
        events,
        at,
        report_from,
        detail,
    })
}

/// Builds the one-resource configuration and lets charon-core judge it.
fn setup(
    body: &Map<String, Value>,
    default_name: Option<&str>,
    issues: &mut Issues,
) -> Option<Setup> {
    let mut resource = Map::new();
    match (body.get("name"), default_name) {
        (Some(name), _) => {
            resource.insert("name".into(), name.clone());
        }
        (None, Some(name)) => {
            resource.insert("name".into(), name.into());
        }
        (None, None) => {}
    }
    let kind = match body.get("kind") {
        None | Some(Value::Null) => "rate",
        Some(v) => fields::one_of(v, KINDS, &Path::root().key("kind"), issues)?,
    };
    resource.insert("kind".into(), kind.into());
    for key in RESOURCE_FIELDS {
        if let Some(v) = body.get(*key) {
            let v = match *key {
                "period" | "window" | "ban" => millis_to_span(v),
                _ => v.clone(),
            };
            resource.insert((*key).into(), v);
        }
    }
    if let Some(tiers) = body.get("tiers") {
        if let Value::Array(items) = tiers
            && items.len() > MAX_TIERS
        {
            issues.push(
                &Path::root().key("tiers"),
                format!(
                    "{} tiers; the simulator shows at most {MAX_TIERS}",
                    items.len()
                ),
            );
            return None;
        }
        resource.insert("tiers".into(), millis_to_spans(tiers));
    }
    match Config::from_value(&json!({ "resources": [resource] })) {
        Ok((config, adjustments)) => Some(Setup {
            config,
            adjustments: adjustments
                .into_iter()
                .map(|a| Adjustment {
                    path: local_path(&a.path),
                    change: a.change,
                })
                .collect(),
        }),
        Err(errors) => {
            issues.extend(errors.0.into_iter().map(|i| ConfigIssue {
                path: local_path(&i.path),
                message: i.message,
            }));
            None
        }
    }
}

/// A duration given as whole milliseconds, as the string charon-core reads.
fn millis_to_span(v: &Value) -> Value {
    match v.as_u64() {
        Some(ms) => format!("{ms}ms").into(),
        None => v.clone(),
    }
}

/// Durations may be given as whole milliseconds for convenience; charon-core
/// reads the human strings of SPEC §1, so `250` becomes `"250ms"`.
fn millis_to_spans(tiers: &Value) -> Value {
    let Value::Array(items) = tiers else {
        return tiers.clone();
    };
    let items = items
        .iter()
        .map(|t| {
            let Value::Object(map) = t else {
                return t.clone();
            };
            let mut map = map.clone();
            for key in ["window", "active", "cooldown"] {
                if let Some(ms) = map.get(key).and_then(Value::as_u64) {
                    map.insert(key.into(), format!("{ms}ms").into());
                }
            }
            Value::Object(map)
        })
        .collect();
    Value::Array(items)
}

/// `resources[0].tiers[1].window` → `tiers[1].window`.
fn local_path(path: &str) -> String {
    if path == "resources[0]" {
        return String::new();
    }
    path.strip_prefix("resources[0].")
        .unwrap_or(path)
        .to_owned()
}

/// The events of a body. Whether an operation suits the kind (a refund on
/// burst tiers) is core's to say when the event is decided.
fn events(items: &[Value], path: &Path, issues: &mut Issues) -> Vec<Event> {
    let mut out = Vec::with_capacity(items.len());
    let mut latest: Option<Millis> = None;
    for (i, item) in items.iter().enumerate() {
        let path = path.index(i);
        let Some(map) = fields::object(item, &path, issues, "an event", EVENT_FIELDS) else {
            continue;
        };
        let t = fields::required(map, "t", &path, issues)
            .and_then(|v| fields::count(v, &path.key("t"), issues));
        if let (Some(t), Some(before)) = (t, latest)
            && t < before
        {
            issues.push(
                &path.key("t"),
                format!(
                    "{t} is before the previous event's t ({before}); events must be in time order"
                ),
            );
        }
        let op = match map.get("op") {
            None | Some(Value::Null) => Some("request"),
            Some(v) => fields::one_of(v, OPS, &path.key("op"), issues),
        };
        let dry_run = fields::boolean(map, "dry_run", &path, issues);
        let copies = fields::count_or(map, "copies", 1, &path, issues);
        let min_copies = fields::count_or(map, "min_copies", 1, &path, issues);
        let Some(op) = op else { continue };
        if op != "request" {
            for key in ["dry_run", "min_copies"] {
                if map.get(key).is_some_and(|v| !v.is_null()) {
                    issues.push(&path.key(key), format!("only for op request, not {op}"));
                }
            }
        }
        let (Some(t), Some(copies), Some(min_copies)) = (t, copies, min_copies) else {
            continue;
        };
        latest = Some(latest.map_or(t, |l| l.max(t)));
        let op = match op {
            "charge" => Op::Charge(copies),
            "refund" => Op::Refund(copies),
            _ => match Amount::new(copies, min_copies) {
                Ok(amount) => Op::Request { amount, dry_run },
                Err(e) => {
                    issues.push(&path, e.to_string());
                    continue;
                }
            },
        };
        out.push(Event { t, op });
    }
    out
}

fn finish(issues: Issues) -> Result<(), ApiError> {
    let mut issues = issues.into_vec();
    if issues.is_empty() {
        return Ok(());
    }
    if issues.len() > MAX_ISSUES {
        let more = issues.len() - MAX_ISSUES;
        issues.truncate(MAX_ISSUES);
        issues.push(issue("", format!("… and {more} more issues")));
    }
    Err(ApiError::invalid(issues))
}

fn issue(path: &str, message: impl Into<String>) -> ConfigIssue {
    ConfigIssue {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// The resource as it will be enforced (SPEC §6 layout, normalized).
pub(crate) fn resource_value(replay: &Replay) -> Value {
    replay
        .setup
        .config
        .to_value()
        .get_mut("resources")
        .and_then(|r| r.get_mut(0))
        .map(Value::take)
        .unwrap_or_default()
}
