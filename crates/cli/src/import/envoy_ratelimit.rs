//! envoyproxy/ratelimit's configuration files: one domain per file, a tree
//! of descriptors.
//!
//! The tree is kept as it is (Charon's matching follows envoyproxy's, see
//! `docs/envoy.md`), with two adjustments so that every descriptor that
//! matches a path exactly is decided as envoyproxy/ratelimit decides it:
//!
//! - a node without a `rate_limit` below one with a limit becomes
//!   `unlimited: true`: in envoyproxy/ratelimit such a descriptor matched a
//!   node with no limit and is not limited, where Charon would apply the
//!   deepest limit above it;
//! - `shadow_mode` there belongs to one rule; in Charon it also covers the
//!   nodes below, so a limit below a shadowed one gets its own
//!   `shadow_mode: false`.

use std::collections::HashMap;

use charon_core::MAX_COUNT;
use serde_json::Value;

use super::tree::{Action, NAMESPACE, Node, Output, name_part};
use super::{
    Report, bool_field, count_field, index, join, list_field, object, text_field, text_of,
};

const TOP_FIELDS: &[&str] = &["domain", "descriptors"];
const NODE_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
];
const LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];

/// What the nodes above say.
#[derive(Debug, Clone, Copy, Default)]
struct Above {
    /// A node above has a limit.
    limited: bool,
    /// The nearest `shadow_mode` written above is `true`.
    shadow: bool,
}

/// Converts one file (a parsed YAML value) into a domain of `out`.
pub(super) fn convert(v: &Value, out: &mut Output, report: &mut Report) {
    let Some(map) = object(
        v,
        "",
        "an envoyproxy/ratelimit configuration",
        TOP_FIELDS,
        report,
    ) else {
        return;
    };
    let Some(domain) = text_field(map, "domain", "", report) else {
        return;
    };
    if out.has_domain(&domain) {
        report.error(
            "domain",
            format!(
                "the domain {domain:?} is in an earlier file too (envoyproxy/ratelimit refuses \
                 that unless MERGE_DOMAIN_CONFIG is set): merge the two files into one"
            ),
        );
        return;
    }
    let items = list_field(map, "descriptors", "", report);
    let mut name = format!("{NAMESPACE}/");
    name_part(&mut name, &domain);
    let nodes = nodes(items, "descriptors", &name, Above::default(), out, report);
    *out.domain_mut(&domain) = nodes;
}

fn nodes(
    items: &[Value],
    path: &str,
    name: &str,
    above: Above,
    out: &mut Output,
    report: &mut Report,
) -> Vec<Node> {
    let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
    let mut result = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = index(path, i);
        let Some(n) = node(item, &p, name, above, out, report) else {
            continue;
        };
        let pair = (n.key.clone(), n.value.clone());
        if let Some(first) = seen.get(&pair) {
            report.error(
                &p,
                format!(
                    "the descriptor key {:?}{} is also at {} (envoyproxy/ratelimit refuses \
                     duplicates too)",
                    pair.0,
                    pair.1
                        .as_ref()
                        .map(|v| format!(", value {v:?},"))
                        .unwrap_or_default(),
                    index(path, *first)
                ),
            );
            continue;
        }
        seen.insert(pair, i);
        result.push(n);
    }
    result
}

fn node(
    item: &Value,
    path: &str,
    parent: &str,
    above: Above,
    out: &mut Output,
    report: &mut Report,
) -> Option<Node> {
    let map = object(item, path, "a descriptor", NODE_FIELDS, report)?;
    let key = text_field(map, "key", path, report);
    // An empty value is no value there (any value matches).
    let value = match map.get("value") {
        None | Some(Value::Null) => None,
        Some(v) => text_of(v, &join(path, "value"), report).filter(|s| !s.is_empty()),
    };
    let key = key?;
    let mut name = format!("{parent}/");
    name_part(&mut name, &key);
    if let Some(v) = &value {
        name.push('=');
        name_part(&mut name, v);
    }
    let mut node = Node::new(key, value);
    let shadow = bool_field(map, "shadow_mode", path, report);
    for field in ["detailed_metric", "value_to_metric"] {
        if bool_field(map, field, path, report) == Some(true) {
            report.drop(
                &join(path, field),
                "Charon's metrics are per Envoy domain and matched node, never per request \
                 value, so that their cardinality stays bounded by the configuration",
            );
        }
    }
    if let Some(rl) = map.get("rate_limit").filter(|v| !v.is_null()) {
        node.action = rate_limit(rl, &join(path, "rate_limit"), &name, out, report);
    }
    let limits = matches!(
        node.action,
        Some(Action::RateLimit { .. } | Action::Resource(_))
    );
    let mut below = above;
    if limits {
        let own = shadow.unwrap_or(false);
        if own || above.shadow {
            node.shadow_mode = Some(own);
        }
        below = Above {
            limited: true,
            shadow: own,
        };
    } else {
        if shadow == Some(true) && node.action.is_none() {
            report.drop(
                &join(path, "shadow_mode"),
                "this descriptor has no rate_limit, so there is nothing to shadow (its \
                 descendants keep their own shadow_mode)",
            );
        }
        if node.action.is_none() && above.limited {
            // envoyproxy/ratelimit does not limit a descriptor that matched
            // a node without a limit; Charon would apply the limit above.
            node.action = Some(Action::Unlimited);
        }
    }
    let children = list_field(map, "descriptors", path, report);
    node.children = nodes(
        children,
        &join(path, "descriptors"),
        &name,
        below,
        out,
        report,
    );
    Some(node)
}

fn rate_limit(
    v: &Value,
    path: &str,
    name: &str,
    out: &mut Output,
    report: &mut Report,
) -> Option<Action> {
    let map = object(v, path, "a rate_limit", LIMIT_FIELDS, report)?;
    if map.get("name").is_some_and(|n| !n.is_null()) {
        report.drop(
            &join(path, "name"),
            "Charon's limits are named by their node's path (envoy/DOMAIN/KEY=VALUE/…); a \
             name only served replaces",
        );
    }
    if !list_field(map, "replaces", path, report).is_empty() {
        report.drop(
            &join(path, "replaces"),
            "Charon decides every descriptor of a call (all or nothing) and one limit cannot \
             switch another off; have Envoy send only the descriptor whose limit should apply",
        );
    }
    if bool_field(map, "unlimited", path, report) == Some(true) {
        return Some(Action::Unlimited);
    }
    let unit = text_field(map, "unit", path, report);
    let count = count_field(map, "requests_per_unit", path, (0, MAX_COUNT), report);
    let seconds = match unit?.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        u @ ("month" | "year") => {
            report.drop(
                &join(path, "unit"),
                format!(
                    "a {u} has no fixed length (envoyproxy/ratelimit counts calendar {u}s) and \
                     Charon's windows do; write a `kind: window` resource of the length you \
                     want (e.g. 30 days) and name it with `resource:`"
                ),
            );
            return None;
        }
        other => {
            report.error(
                &join(path, "unit"),
                format!("expected second, minute, hour, day, week, month or year, found {other:?}"),
            );
            return None;
        }
    };
    Some(out.limit(count?, seconds, name))
}
