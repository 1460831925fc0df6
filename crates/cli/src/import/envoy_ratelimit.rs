//! envoyproxy/ratelimit's configuration files: one domain per file, a tree
//! of descriptors.
//!
//! Checked as envoyproxy/ratelimit loads a file (its reasons, word for
//! word where it has one): every mapping key anywhere must be one of its
//! known keys and a string, every list item a mapping; a domain is
//! required and appears in one file only; siblings have distinct
//! `key_value` composites; a limit has a valid unit (any case), or is
//! `unlimited` without one; `replaces` entries are named and never the
//! limit's own name; `share_threshold` needs a wildcard.
//!
//! The tree is kept as it is, with the section settings that make Charon
//! decide as envoyproxy/ratelimit does: `match: whole` (a limit applies
//! only to a descriptor whose last entry reached it), `record: every_hit`
//! (every descriptor's counter moves, hits over the limit included) and
//! fixed windows aligned to the epoch (a week, a month and a year are 7,
//! 30 and 365 days, as its `UnitToDivider` counts them). A node's
//! `shadow_mode` there belongs to its own limit; here it covers a subtree,
//! so a limit below a shadowed one gets its own `shadow_mode: false`.

use std::collections::HashMap;

use charon_core::fields::{Path, describe};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};

use super::yaml::{self, Yaml};
use super::{PeerSettings, Report, envoy_settings, with_envoy};

/// Every key envoyproxy/ratelimit accepts, anywhere in a file.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Its units (`RateLimitResponse.RateLimit.Unit` but `UNKNOWN`).
const UNITS: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];

/// The file as envoyproxy/ratelimit's typed reader sees it: text fields
/// keep their text as written.
#[derive(Debug, Default, Deserialize)]
struct Root {
    domain: Option<String>,
    descriptors: Option<Vec<Descriptor>>,
}

#[derive(Debug, Default, Deserialize)]
struct Descriptor {
    key: Option<String>,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    descriptors: Option<Vec<Descriptor>>,
    #[serde(default)]
    metadata: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
struct RateLimit {
    unit: Option<String>,
    name: Option<String>,
    replaces: Option<Vec<Replaces>>,
}

#[derive(Debug, Default, Deserialize)]
struct Replaces {
    name: Option<String>,
}

/// The domains converted so far.
#[derive(Debug, Default)]
pub(super) struct Output {
    domains: Vec<(String, Vec<Value>)>,
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true`.
    pub merge_domains: bool,
}

impl Output {
    /// The configuration: the trees, and the settings that decide as
    /// envoyproxy/ratelimit.
    pub(super) fn into_value(self, peer: &PeerSettings) -> Value {
        let domains: Vec<Value> = self
            .domains
            .into_iter()
            .map(|(domain, nodes)| json!({ "domain": domain, "descriptors": nodes }))
            .collect();
        let envoy = envoy_settings(
            peer,
            json!({
                "match": "whole",
                "record": "every_hit",
                "windows": "fixed",
                "descriptor_limits": "apply",
                "domains": domains,
            }),
        );
        with_envoy(Vec::new(), envoy)
    }
}

/// Converts one file into a domain of `out`.
pub(super) fn convert(text: &str, out: &mut Output, report: &mut Report) {
    let root = Path::root();
    let doc = match yaml::parse(text) {
        Ok(d) => d,
        Err(e) => {
            report.error(&root, format!("error loading config file: {e}"));
            return;
        }
    };
    let before = report.issues.len();
    check_keys(&doc, &root, report);
    if report.issues.len() > before {
        return;
    }
    let json = doc.to_json();
    let typed: Root = match yaml::typed(text) {
        Ok(t) => t,
        Err(e) => {
            report.error(&root, format!("error loading config file: {e}"));
            return;
        }
    };
    let domain = typed.domain.clone().unwrap_or_default();
    if domain.is_empty() {
        report.error(&root.key("domain"), "config file cannot have empty domain");
        return;
    }
    let merging = out.domains.iter().position(|(d, _)| *d == domain);
    if merging.is_some() && !out.merge_domains {
        report.error(
            &root.key("domain"),
            format!(
                "duplicate domain '{domain}' in config file (envoyproxy/ratelimit merges such \
                 files only with MERGE_DOMAIN_CONFIG=true: --merge-domains)"
            ),
        );
        return;
    }
    let items = json
        .get("descriptors")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let typed_items = typed.descriptors.unwrap_or_default();
    let mut nodes = nodes(
        items,
        &typed_items,
        &root.key("descriptors"),
        &format!("{domain}."),
        false,
        report,
    );
    match merging {
        // MERGE_DOMAIN_CONFIG: the file's top-level descriptors join the
        // domain's; a composite key already there is refused, as there.
        Some(at) => {
            let existing = &mut out.domains[at].1;
            for (i, n) in nodes.drain(..).enumerate() {
                let composite = |v: &Value| {
                    let key = v.get("key").and_then(Value::as_str).unwrap_or_default();
                    match v.get("value").and_then(Value::as_str) {
                        Some(val) => format!("{key}_{val}"),
                        None => key.to_owned(),
                    }
                };
                let c = composite(&n);
                if existing.iter().any(|e| composite(e) == c) {
                    report.error(
                        &root.key("descriptors").index(i),
                        format!("duplicate descriptor composite key '{domain}.{c}'"),
                    );
                } else {
                    existing.push(n);
                }
            }
        }
        None => out.domains.push((domain, nodes)),
    }
}

/// envoyproxy/ratelimit's key check: every mapping key is a string among
/// [`VALID_KEYS`] (what is under `metadata` is free), every list item a
/// mapping.
fn check_keys(v: &Yaml, path: &Path, report: &mut Report) {
    match v {
        Yaml::Map(entries) => {
            for (k, value) in entries {
                let Yaml::Str(key) = k else {
                    report.error(
                        path,
                        format!("config error, key is not of type string: {}", k.text()),
                    );
                    continue;
                };
                let at = path.key(key);
                if !VALID_KEYS.contains(&key.as_str()) {
                    report.error(&at, format!("config error, unknown key '{key}'"));
                    continue;
                }
                if key != "metadata" {
                    check_keys(value, &at, report);
                }
            }
        }
        Yaml::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                let at = path.index(i);
                if matches!(item, Yaml::Map(_)) {
                    check_keys(item, &at, report);
                } else {
                    report.error(
                        &at,
                        format!(
                            "config error, yaml file contains list of type other than map: {}",
                            item.text()
                        ),
                    );
                }
            }
        }
        _ => {}
    }
}

/// A boolean field as envoyproxy/ratelimit reads it (absent or null is
/// false).
fn flag(m: &Map<String, Value>, field: &str, path: &Path, report: &mut Report) -> bool {
    match m.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            report.error(
                &path.key(field),
                format!("expected true or false, found {}", describe(v)),
            );
            false
        }
    }
}

fn nodes(
    items: &[Value],
    typed: &[Descriptor],
    path: &Path,
    parent: &str,
    shadow_above: bool,
    report: &mut Report,
) -> Vec<Value> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    let empty = Descriptor::default();
    for (i, item) in items.iter().enumerate() {
        let p = path.index(i);
        let d = typed.get(i).unwrap_or(&empty);
        let Some(m) = item.as_object() else { continue };
        let key = d.key.clone().unwrap_or_default();
        if key.is_empty() {
            report.error(&p, "descriptor has empty key");
            continue;
        }
        let value = d.value.clone().filter(|v| !v.is_empty());
        let composite = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        if let Some(first) = seen.insert(composite.clone(), i) {
            report.error(
                &p,
                format!(
                    "duplicate descriptor composite key '{parent}{composite}' (first at {})",
                    path.index(first)
                ),
            );
            continue;
        }
        if let Some(n) = node(
            m,
            d,
            &p,
            (key, value, &composite),
            parent,
            shadow_above,
            report,
        ) {
            out.push(n);
        }
    }
    out
}

fn node(
    m: &Map<String, Value>,
    d: &Descriptor,
    p: &Path,
    (key, value, composite): (String, Option<String>, &str),
    parent: &str,
    shadow_above: bool,
    report: &mut Report,
) -> Option<Value> {
    let mut n = Map::new();
    if key.contains('*') {
        report.loss(
            &p.key("key"),
            format!(
                "the key {key:?} has a '*', which envoyproxy/ratelimit matches as a wildcard \
                 over `key_value`; Charon matches keys exactly and wildcards only in values"
            ),
        );
    }
    n.insert("key".into(), key.into());
    if let Some(v) = &value {
        n.insert("value".into(), v.clone().into());
    }
    let shadow = flag(m, "shadow_mode", p, report);
    let quota = flag(m, "quota_mode", p, report);
    let share = flag(m, "share_threshold", p, report);
    for field in ["detailed_metric", "value_to_metric"] {
        if flag(m, field, p, report) {
            n.insert(field.into(), true.into());
        }
    }
    if share {
        if composite.contains('*') {
            n.insert("share_threshold".into(), true.into());
        } else {
            report.error(
                &p.key("share_threshold"),
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but \
                     found key '{composite}'"
                ),
            );
        }
    }
    if d.metadata.is_some() {
        report.note(
            &p.key("metadata"),
            "envoyproxy/ratelimit sends it in the reply's dynamic metadata only with \
             RESPONSE_DYNAMIC_METADATA=true; Charon sends no dynamic metadata",
        );
    }
    let limited = match (m.get("rate_limit").filter(|v| !v.is_null()), &d.rate_limit) {
        (Some(Value::Object(rl)), Some(typed)) => {
            rate_limit(rl, typed, &p.key("rate_limit"), &mut n, report)
        }
        (Some(other), _) if !other.is_object() => {
            report.error(
                &p.key("rate_limit"),
                format!("expected a mapping, found {}", describe(other)),
            );
            false
        }
        _ => false,
    };
    let mut below = shadow_above;
    if limited {
        if shadow || shadow_above {
            n.insert("shadow_mode".into(), shadow.into());
        }
        below = shadow;
        if quota {
            n.insert("quota_mode".into(), true.into());
        }
    } else {
        for (field, on) in [("shadow_mode", shadow), ("quota_mode", quota)] {
            if on {
                report.note(
                    &p.key(field),
                    "this descriptor has no rate_limit, so it changes nothing (in \
                     envoyproxy/ratelimit either: it applies to a descriptor's own limit)",
                );
            }
        }
    }
    let children = m
        .get("descriptors")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let typed_children = d.descriptors.as_deref().unwrap_or_default();
    let kids = nodes(
        children,
        typed_children,
        &p.key("descriptors"),
        &format!("{parent}{composite}."),
        below,
        report,
    );
    if !kids.is_empty() {
        n.insert("descriptors".into(), kids.into());
    }
    Some(Value::Object(n))
}

/// A node's `rate_limit`; `true` when the node limits (or is unlimited).
fn rate_limit(
    rl: &Map<String, Value>,
    typed: &RateLimit,
    p: &Path,
    n: &mut Map<String, Value>,
    report: &mut Report,
) -> bool {
    let unlimited = flag(rl, "unlimited", p, report);
    let unit = typed.unit.clone().unwrap_or_default().to_ascii_lowercase();
    let valid = UNITS.contains(&unit.as_str());
    let name = typed.name.clone().filter(|s| !s.is_empty());
    let before = report.issues.len();
    if unlimited && valid {
        report.error(p, "should not specify rate limit unit when unlimited");
    } else if !unlimited && !valid {
        report.error(
            &p.key("unit"),
            format!(
                "invalid rate limit unit '{}' (second, minute, hour, day, week, month or year, \
                 in any case)",
                typed.unit.clone().unwrap_or_default()
            ),
        );
    }
    let rpu = match rl.get("requests_per_unit") {
        None | Some(Value::Null) => Some(0),
        Some(v) => match v.as_u64().filter(|&n| n <= u64::from(u32::MAX)) {
            Some(n) => Some(n),
            None => {
                report.error(
                    &p.key("requests_per_unit"),
                    format!(
                        "expected a whole number from 0 to 4294967295 (a uint32), found {}",
                        describe(v)
                    ),
                );
                None
            }
        },
    };
    let mut replaces = Vec::new();
    for (i, r) in typed
        .replaces
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let at = p.key("replaces").index(i);
        let rname = r.name.clone().unwrap_or_default();
        if rname.is_empty() {
            report.error(&at, "should not have an empty replaces entry");
        } else if Some(&rname) == name.as_ref() {
            report.error(&at, "replaces should not contain name of same descriptor");
        } else {
            replaces.push(Value::String(rname));
        }
    }
    if report.issues.len() > before {
        return false;
    }
    if let Some(name) = name {
        n.insert("name".into(), name.into());
    }
    if !replaces.is_empty() {
        n.insert("replaces".into(), replaces.into());
    }
    if unlimited {
        n.insert("unlimited".into(), true.into());
    } else if let Some(rpu) = rpu {
        n.insert(
            "rate_limit".into(),
            json!({ "unit": unit, "requests_per_unit": rpu }),
        );
    }
    true
}
