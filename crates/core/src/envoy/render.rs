//! The `envoy:` section back to its SPEC §11 layout, for `charon config
//! check`, `charon config export` and the config API: every switch of the
//! section written out (so what applies is visible), a node's and a
//! limit's fields where set. What is rendered parses back to an equal
//! section (the configuration's round-trip test holds this).

use serde_json::{Map, Value, json};

use super::inline::{Per, RateLimit};
use super::limits::{Compare, LimitRule};
use super::node::{Action, Node};
use super::settings::{DescriptorLimits, HeaderNames, Headers, MatchMode, Record, UnknownDomain};
use super::{Envoy, EnvoyDomain};
use crate::time::format_span;

/// The section as a JSON value.
pub(crate) fn section(e: &Envoy) -> Value {
    let s = &e.settings;
    let headers = match s.headers {
        Headers::None => Value::Bool(false),
        Headers::Charon => Value::Bool(true),
        Headers::RateLimit => "ratelimit".into(),
        Headers::XRateLimit => "x_ratelimit".into(),
    };
    let unknown = match s.unknown_domain {
        UnknownDomain::Ok => "ok",
        UnknownDomain::Error => "error",
    };
    let matching = match s.matching {
        MatchMode::Deepest => "deepest",
        MatchMode::Whole => "whole",
    };
    let record = match s.record {
        Record::AllOrNothing => "all_or_nothing",
        Record::EveryHit => "every_hit",
    };
    let domains: Vec<Value> = e.domains().iter().map(domain).collect();
    let mut m = Map::new();
    m.insert("shadow_mode".into(), s.shadow_mode.into());
    m.insert("headers".into(), headers);
    // Only when set.
    if !s.header_names.is_empty() {
        let mut names = Map::new();
        for (field, name) in HeaderNames::FIELDS.iter().zip(s.header_names.each()) {
            if let Some(n) = name {
                names.insert((*field).into(), n.as_str().into());
            }
        }
        m.insert("header_names".into(), names.into());
    }
    m.insert("unknown_domain".into(), unknown.into());
    m.insert("match".into(), matching.into());
    m.insert("record".into(), record.into());
    m.insert("windows".into(), s.windows.name().into());
    let descriptor_limits = match s.descriptor_limits {
        DescriptorLimits::Ignore => "ignore",
        DescriptorLimits::Apply => "apply",
    };
    m.insert("descriptor_limits".into(), descriptor_limits.into());
    m.insert("domains".into(), domains.into());
    m.into()
}

fn domain(d: &EnvoyDomain) -> Value {
    let mut m = Map::new();
    m.insert("domain".into(), d.name().into());
    if d.same_slot() {
        m.insert("same_slot".into(), true.into());
    }
    if !d.descriptors().is_empty() || d.limits().is_empty() {
        let nodes: Vec<Value> = d.descriptors().iter().map(node).collect();
        m.insert("descriptors".into(), nodes.into());
    }
    if !d.limits().is_empty() {
        let limits: Vec<Value> = d.limits().iter().map(limit).collect();
        m.insert("limits".into(), limits.into());
    }
    Value::Object(m)
}

fn rate_limit(l: &RateLimit) -> Value {
    match l.per() {
        Per::Unit(u) => json!({"unit": u.name(), "requests_per_unit": l.requests_per_unit()}),
        Per::Window(ms) => {
            json!({"window": format_span(ms), "requests_per_unit": l.requests_per_unit()})
        }
    }
}

fn action(a: Option<&Action>, m: &mut Map<String, Value>) {
    match a {
        Some(Action::Resource(r)) => {
            m.insert("resource".into(), r.clone().into());
        }
        Some(Action::RateLimit(l)) => {
            m.insert("rate_limit".into(), rate_limit(l));
        }
        Some(Action::Unlimited) => {
            m.insert("unlimited".into(), true.into());
        }
        None => {}
    }
}

fn node(n: &Node) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), n.key().into());
    if let Some(v) = n.value() {
        m.insert("value".into(), v.into());
    }
    if let Some(mask) = n.mask() {
        m.insert("mask".into(), json!({"ipv4": mask.ipv4, "ipv6": mask.ipv6}));
    }
    action(n.action(), &mut m);
    if let Some(s) = n.shadow_mode() {
        m.insert("shadow_mode".into(), s.into());
    }
    let x = n.extras();
    if let Some(name) = &x.name {
        m.insert("name".into(), name.clone().into());
    }
    if !x.replaces.is_empty() {
        m.insert("replaces".into(), x.replaces.clone().into());
    }
    for (field, on) in [
        ("share_threshold", x.share_threshold),
        ("detailed_metric", x.detailed_metric),
        ("value_to_metric", x.value_to_metric),
        ("quota_mode", x.quota_mode),
    ] {
        if on {
            m.insert(field.into(), true.into());
        }
    }
    if !n.descriptors().is_empty() {
        let children: Vec<Value> = n.descriptors().iter().map(node).collect();
        m.insert("descriptors".into(), children.into());
    }
    Value::Object(m)
}

fn limit(l: &LimitRule) -> Value {
    let mut m = Map::new();
    if let Some(name) = l.name() {
        m.insert("name".into(), name.into());
    }
    let conditions: Vec<Value> = l
        .conditions()
        .iter()
        .map(|c| {
            let op = match c.compare {
                Compare::Equals => "equals",
                Compare::NotEquals => "not_equals",
            };
            json!({"descriptor": c.descriptor, "key": c.key, op: c.value})
        })
        .collect();
    if !conditions.is_empty() {
        m.insert("conditions".into(), conditions.into());
    }
    let variables: Vec<Value> = l
        .variables()
        .iter()
        .map(|v| json!({"descriptor": v.descriptor, "key": v.key}))
        .collect();
    if !variables.is_empty() {
        m.insert("variables".into(), variables.into());
    }
    action(Some(l.action()), &mut m);
    Value::Object(m)
}
