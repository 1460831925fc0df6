//! The `envoy:` section read from its JSON/YAML value (SPEC §11), every
//! problem with its path, through [`crate::fields`]. Refused here, as
//! envoyproxy/ratelimit refuses it when it loads a file: a `replaces`
//! entry that is empty or names its own node, `share_threshold` on a value
//! without `*`, duplicate siblings; and what Charon cannot decide (a mask
//! on a node with a value, an unknown unit).

mod limits;

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::envoy::inline::{Mask, Per, RateLimit, Unit, Windows};
use crate::envoy::node::{Action, Extras, Node};
use crate::envoy::settings::{
    DescriptorLimits, HeaderNames, Headers, MatchMode, Record, Settings, UnknownDomain,
};
use crate::envoy::{
    Envoy, EnvoyDomain, MAX_DEPTH, MAX_DOMAINS, MAX_KEY_BYTES, MAX_NODES, MAX_VALUE_BYTES,
};
use crate::fields::{
    Issues, Path, boolean, count, count_or, describe, field_message, list, name, object, one_of,
    required, span, string, too_many,
};

const ENVOY_FIELDS: &[&str] = &[
    "shadow_mode",
    "headers",
    "header_names",
    "unknown_domain",
    "match",
    "record",
    "windows",
    "descriptor_limits",
    "domains",
];
const DOMAIN_FIELDS: &[&str] = &["domain", "same_slot", "descriptors", "limits"];
const NODE_FIELDS: &[&str] = &[
    "key",
    "value",
    "mask",
    "resource",
    "rate_limit",
    "unlimited",
    "shadow_mode",
    "descriptors",
    "name",
    "replaces",
    "share_threshold",
    "detailed_metric",
    "value_to_metric",
    "quota_mode",
];
const MASK_FIELDS: &[&str] = &["ipv4", "ipv6"];
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "window", "requests_per_unit"];

/// The `envoy:` section. Its size is bounded before any node is read
/// ([`MAX_DOMAINS`], [`MAX_NODES`], [`MAX_DEPTH`]); references to
/// resources are checked once the resources are known
/// ([`crate::config::Config::with_envoy`]).
pub(crate) fn section(v: &Value, path: &Path, issues: &mut Issues) -> Option<Envoy> {
    let before = issues.len();
    let map = object(v, path, issues, "the envoy section", ENVOY_FIELDS)?;
    let settings = settings(map, path, issues);
    let mut domains = Vec::new();
    if let Some(ds) = map.get("domains").filter(|v| !v.is_null()) {
        let dpath = path.key("domains");
        let nodes = |d: &Value| {
            let tree = d.get("descriptors").map_or(0, |n| count_nodes(n, 1));
            let limits = d
                .get("limits")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            tree.saturating_add(limits)
        };
        if let Some(items) = list(ds, &dpath, issues)
            && !too_many(items.len(), MAX_DOMAINS, "Envoy domains", &dpath, issues)
            && !too_many(
                items.iter().map(nodes).fold(0, usize::saturating_add),
                MAX_NODES,
                "descriptor nodes",
                &dpath,
                issues,
            )
        {
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                let p = dpath.index(i);
                if let Some(d) = domain_at(item, &p, issues) {
                    if let Some(first) = item
                        .get("domain")
                        .and_then(Value::as_str)
                        .and_then(|name| seen.insert(name, i))
                    {
                        issues.push(
                            &p.key("domain"),
                            format!(
                                "duplicate Envoy domain {:?} (first at {})",
                                d.name(),
                                dpath.index(first)
                            ),
                        );
                    }
                    domains.push(d);
                }
            }
        }
    }
    (issues.len() == before).then(|| Envoy::new(settings, domains))
}

fn settings(map: &Map<String, Value>, path: &Path, issues: &mut Issues) -> Settings {
    let mut s = Settings {
        shadow_mode: boolean(map, "shadow_mode", path, issues),
        ..Settings::default()
    };
    match map.get("headers") {
        None | Some(Value::Null | Value::Bool(false)) => {}
        Some(Value::Bool(true)) => s.headers = Headers::Charon,
        Some(v) => {
            let names = ["true", "false", Headers::NAMES[0], Headers::NAMES[1]];
            match one_of(v, &names, &path.key("headers"), issues) {
                Some("ratelimit") => s.headers = Headers::RateLimit,
                Some("x_ratelimit") => s.headers = Headers::XRateLimit,
                // The strings "true" and "false": quote-free YAML is a bool.
                Some("true") => s.headers = Headers::Charon,
                _ => {}
            }
        }
    }
    if let Some(v) = map.get("header_names").filter(|v| !v.is_null()) {
        let hpath = path.key("header_names");
        if s.headers == Headers::None {
            issues.push(
                &hpath,
                "names headers that are not sent: set headers: to true, ratelimit or x_ratelimit",
            );
        } else if let Some(names) = header_names(v, &hpath, issues) {
            s.header_names = names;
        }
    }
    let mut pick = |field: &str, names: &'static [&'static str]| -> Option<&'static str> {
        map.get(field)
            .filter(|v| !v.is_null())
            .and_then(|v| one_of(v, names, &path.key(field), issues))
    };
    if pick("unknown_domain", UnknownDomain::NAMES) == Some("error") {
        s.unknown_domain = UnknownDomain::Error;
    }
    if pick("match", MatchMode::NAMES) == Some("whole") {
        s.matching = MatchMode::Whole;
    }
    if pick("record", Record::NAMES) == Some("every_hit") {
        s.record = Record::EveryHit;
    }
    if let Some(w) = pick("windows", Windows::NAMES).and_then(Windows::from_name) {
        s.windows = w;
    }
    if pick("descriptor_limits", DescriptorLimits::NAMES) == Some("apply") {
        s.descriptor_limits = DescriptorLimits::Apply;
    }
    s
}

/// `header_names:`: each a header name, no two alike (HTTP header names
/// are case-insensitive), none `Retry-After`.
fn header_names(v: &Value, path: &Path, issues: &mut Issues) -> Option<HeaderNames> {
    let map = object(v, path, issues, "header names", HeaderNames::FIELDS)?;
    let before = issues.len();
    let mut seen: Vec<(String, &str)> = Vec::new();
    let mut read = |field: &'static str| -> Option<String> {
        let p = path.key(field);
        let name = string(map.get(field).filter(|v| !v.is_null())?, &p, issues)?;
        let lower = name.to_ascii_lowercase();
        if !HeaderNames::valid(&name) {
            issues.push(
                &p,
                format!(
                    "{name:?} is not a header name (1 to {} letters, digits or !#$%&'*+-.^_`|~)",
                    HeaderNames::MAX_BYTES
                ),
            );
        } else if lower == "retry-after" {
            issues.push(&p, "Retry-After is a header of its own");
        } else if let Some((_, first)) = seen.iter().find(|(l, _)| *l == lower) {
            issues.push(&p, format!("the same name as {}", path.key(first)));
        }
        seen.push((lower, field));
        Some(name)
    };
    let names = HeaderNames {
        limit: read("limit"),
        remaining: read("remaining"),
        reset: read("reset"),
    };
    (issues.len() == before).then_some(names)
}

/// The nodes of the descriptor list `v` at `depth` and below, counted down
/// to one level past [`MAX_DEPTH`] (deeper is refused anyway) and no
/// further than just past [`MAX_NODES`]: the bound is checked before a
/// node is read, at a cost bounded by the bound.
fn count_nodes(v: &Value, depth: usize) -> usize {
    let Some(items) = v.as_array() else {
        return 0;
    };
    let mut n = items.len();
    if depth > MAX_DEPTH {
        return n;
    }
    for item in items {
        if n > MAX_NODES {
            break;
        }
        if let Some(d) = item.get("descriptors") {
            n = n.saturating_add(count_nodes(d, depth + 1));
        }
    }
    n
}

fn domain_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<EnvoyDomain> {
    let map = object(v, path, issues, "an Envoy domain", DOMAIN_FIELDS)?;
    let before = issues.len();
    let domain = required(map, "domain", path, issues)
        .and_then(|v| name(v, &path.key("domain"), issues, "domain"));
    let descriptors = match map.get("descriptors").filter(|v| !v.is_null()) {
        None => Some(Vec::new()),
        Some(v) => nodes_at(v, &path.key("descriptors"), 1, issues),
    };
    let limits = match map.get("limits").filter(|v| !v.is_null()) {
        None => Some(Vec::new()),
        Some(v) => limits::limits_at(v, &path.key("limits"), issues),
    };
    let same_slot = boolean(map, "same_slot", path, issues);
    let (domain, descriptors, limits) = (domain?, descriptors?, limits?);
    (issues.len() == before).then(|| {
        EnvoyDomain::new(domain, descriptors)
            .with_limits(limits)
            .with_same_slot(same_slot)
    })
}

/// A list of sibling nodes at `depth` (1 for a domain's top level); no two
/// may have the same key and value.
fn nodes_at(v: &Value, path: &Path, depth: usize, issues: &mut Issues) -> Option<Vec<Node>> {
    let items = list(v, path, issues)?;
    let before = issues.len();
    let mut seen: HashMap<(&str, Option<&str>), usize> = HashMap::new();
    let mut nodes = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = path.index(i);
        if let Some(n) = node_at(item, &p, depth, issues) {
            nodes.push(n);
        }
        let key = item.get("key").and_then(Value::as_str);
        let value = item.get("value").and_then(Value::as_str);
        if let Some(key) = key
            && let Some(first) = seen.insert((key, value), i)
        {
            let what = match value {
                Some(v) => format!("key {key:?} and value {v:?}"),
                None => format!("key {key:?} and no value"),
            };
            issues.push(
                &p,
                format!(
                    "duplicate descriptor: {what} (first at {})",
                    path.index(first)
                ),
            );
        }
    }
    (issues.len() == before).then_some(nodes)
}

/// A key or value of a node: a non-empty string of at most `max` bytes
/// without control characters. A number or boolean is refused with a hint:
/// Envoy's values are strings, and `5` and `"05"` must not be guessed at.
pub(super) fn entry_text(
    v: &Value,
    path: &Path,
    issues: &mut Issues,
    max: usize,
) -> Option<String> {
    let s = match v {
        Value::String(s) => s,
        Value::Number(_) | Value::Bool(_) => {
            issues.push(
                path,
                format!(
                    "expected a string, found {}; quote it: \"{v}\"",
                    describe(v)
                ),
            );
            return None;
        }
        other => {
            issues.push(
                path,
                format!("expected a string, found {}", describe(other)),
            );
            return None;
        }
    };
    let problem = if s.is_empty() {
        "must not be empty".to_owned()
    } else if s.len() > max {
        format!("is {} bytes long; at most {max} are allowed", s.len())
    } else if s.chars().any(char::is_control) {
        "must not contain control characters".to_owned()
    } else {
        return Some(s.clone());
    };
    issues.push(path, problem);
    None
}

/// `resource`, `rate_limit` or `unlimited: true` of a node or limit (at
/// most one), with `unlimited` only where `allow_unlimited`.
pub(super) fn action_at(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
    allow_unlimited: bool,
) -> Option<Action> {
    let mut actions = Vec::new();
    if let Some(r) = map.get("resource").filter(|v| !v.is_null()) {
        let p = path.key("resource");
        actions.push((
            "resource",
            name(r, &p, issues, "resource").map(Action::Resource),
        ));
    }
    if let Some(l) = map.get("rate_limit").filter(|v| !v.is_null()) {
        actions.push((
            "rate_limit",
            rate_limit_at(l, &path.key("rate_limit"), issues).map(Action::RateLimit),
        ));
    }
    if allow_unlimited && boolean(map, "unlimited", path, issues) {
        actions.push(("unlimited", Some(Action::Unlimited)));
    }
    if actions.len() > 1 {
        let named: Vec<_> = actions.iter().map(|(n, _)| *n).collect();
        issues.push(
            path,
            format!(
                "names {}; a descriptor has at most one of resource, rate_limit and \
                 unlimited: true",
                named.join(" and ")
            ),
        );
    }
    actions.pop().and_then(|(_, a)| a)
}

fn node_at(v: &Value, path: &Path, depth: usize, issues: &mut Issues) -> Option<Node> {
    let map = object(v, path, issues, "a descriptor", NODE_FIELDS)?;
    let before = issues.len();
    let key = required(map, "key", path, issues)
        .and_then(|v| entry_text(v, &path.key("key"), issues, MAX_KEY_BYTES));
    let value = match map.get("value") {
        None | Some(Value::Null) => None,
        Some(v) => entry_text(v, &path.key("value"), issues, MAX_VALUE_BYTES),
    };
    let mask = match map.get("mask") {
        None | Some(Value::Null) => None,
        Some(m) => mask_at(m, &path.key("mask"), issues),
    };
    if mask.is_some() && map.get("value").is_some_and(|v| !v.is_null()) {
        issues.push(
            &path.key("mask"),
            "only a node without a value can have a mask (it reads each request's value as an \
             IP address; a node with a value matches that value only)",
        );
    }
    let action = action_at(map, path, issues, true);
    let shadow_mode = match map.get("shadow_mode") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            issues.push(
                &path.key("shadow_mode"),
                format!("expected true or false, found {}", describe(other)),
            );
            None
        }
    };
    let extras = extras_at(map, path, value.as_deref(), issues);
    let descriptors = match map.get("descriptors").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(d) if depth >= MAX_DEPTH && d.as_array().is_some_and(|a| !a.is_empty()) => {
            issues.push(
                &path.key("descriptors"),
                format!("descriptors nest deeper than {MAX_DEPTH} levels, the most allowed"),
            );
            Vec::new()
        }
        Some(d) => nodes_at(d, &path.key("descriptors"), depth + 1, issues).unwrap_or_default(),
    };
    let key = key?;
    (issues.len() == before)
        .then(|| Node::new(key, value, mask, action, shadow_mode, descriptors).with_extras(extras))
}

/// `name`, `replaces` and the peer switches of a node, refused where
/// envoyproxy/ratelimit refuses them (with its reasons).
fn extras_at(
    map: &Map<String, Value>,
    path: &Path,
    value: Option<&str>,
    issues: &mut Issues,
) -> Extras {
    let name = map
        .get("name")
        .filter(|v| !v.is_null())
        .and_then(|v| entry_text(v, &path.key("name"), issues, MAX_VALUE_BYTES));
    let mut replaces = Vec::new();
    if let Some(v) = map.get("replaces").filter(|v| !v.is_null()) {
        let p = path.key("replaces");
        for (i, item) in list(v, &p, issues).unwrap_or_default().iter().enumerate() {
            let at = p.index(i);
            let Some(r) = string(item, &at, issues) else {
                continue;
            };
            if r.is_empty() {
                issues.push(&at, "should not have an empty replaces entry");
            } else if name.as_deref() == Some(r.as_str()) {
                issues.push(
                    &at,
                    "replaces should not contain name of same descriptor (it would switch \
                     itself off)",
                );
            } else {
                replaces.push(r);
            }
        }
    }
    let share_threshold = boolean(map, "share_threshold", path, issues);
    if share_threshold && !value.is_some_and(|v| v.contains('*')) {
        issues.push(
            &path.key("share_threshold"),
            "share_threshold can only be used with wildcard values (containing '*')",
        );
    }
    Extras {
        name,
        replaces,
        share_threshold,
        detailed_metric: boolean(map, "detailed_metric", path, issues),
        value_to_metric: boolean(map, "value_to_metric", path, issues),
        quota_mode: boolean(map, "quota_mode", path, issues),
    }
}

fn mask_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Mask> {
    let map = object(v, path, issues, "a mask", MASK_FIELDS)?;
    let default = Mask::default();
    let mut prefix = |field: &str, default: u8, bits: u8, family: &str| {
        let n = count_or(map, field, u64::from(default), path, issues)?;
        match u8::try_from(n) {
            Ok(p) if p <= bits => Some(p),
            _ => {
                issues.push(
                    &path.key(field),
                    format!("{n} is longer than an {family} address ({bits} bits)"),
                );
                None
            }
        }
    };
    let ipv4 = prefix("ipv4", default.ipv4, 32, "IPv4");
    let ipv6 = prefix("ipv6", default.ipv6, 128, "IPv6");
    Some(Mask {
        ipv4: ipv4?,
        ipv6: ipv6?,
    })
}

fn rate_limit_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<RateLimit> {
    let map = object(v, path, issues, "a rate_limit", RATE_LIMIT_FIELDS)?;
    let unit = map.get("unit").filter(|v| !v.is_null());
    let window = map.get("window").filter(|v| !v.is_null());
    let per = match (unit, window) {
        (Some(u), None) => one_of(u, Unit::NAMES, &path.key("unit"), issues)
            .and_then(Unit::from_name)
            .map(Per::Unit),
        (None, Some(w)) => span(w, &path.key("window"), issues).map(Per::Window),
        (Some(_), Some(_)) => {
            issues.push(path, "names unit and window; a rate_limit has one of them");
            None
        }
        (None, None) => {
            issues.push(
                &path.key("unit"),
                "is required (or window: a duration such as 90s)",
            );
            None
        }
    };
    let written = required(map, "requests_per_unit", path, issues);
    let rpu = written.and_then(|n| count(n, &path.key("requests_per_unit"), issues));
    match RateLimit::new(per?, rpu?) {
        Ok(l) => Some(l),
        Err(e) => {
            let shown = if e.field == "window" { window } else { written };
            issues.push(&path.key(e.field), field_message(shown, &e));
            None
        }
    }
}
