//! The normalized model back to the SPEC §6 layout, for `charon config
//! check`, `charon config export` and the config API. What is rendered
//! parses back to an equal configuration (a round-trip test holds this).

use serde_json::{Map, Value, json};

use super::{Config, CopyResource, RateResource, ResourceKind, Tier};
use crate::time::format_span;

pub(super) fn config_value(config: &Config) -> Value {
    let mut root = Map::new();
    if !config.namespaces.is_empty() {
        let mut nss = Map::new();
        for (name, s) in &config.namespaces {
            nss.insert(
                name.clone(),
                json!({"allow_unconfigured": s.allow_unconfigured, "ignore_configured": s.ignore_configured}),
            );
        }
        root.insert("namespaces".into(), Value::Object(nss));
    }
    let resources = config
        .resources
        .iter()
        .map(|r| resource_value(&r.name, &r.kind))
        .collect();
    root.insert("resources".into(), Value::Array(resources));
    Value::Object(root)
}

/// One resource in the SPEC §6 layout.
pub(crate) fn resource_value(name: &str, kind: &ResourceKind) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), name.into());
    m.insert("kind".into(), kind.name().into());
    match kind {
        ResourceKind::Rate(r) => rate_fields(r, &mut m),
        ResourceKind::Copy(c) => copy_fields(c, &mut m),
    }
    Value::Object(m)
}

fn rate_fields(r: &RateResource, m: &mut Map<String, Value>) {
    if let Some(h) = r.hard_limit {
        m.insert("hard_limit".into(), h.into());
    }
    if let Some(g) = r.global_limit {
        m.insert("global_limit".into(), g.into());
    }
    m.insert("tiers".into(), tiers_value(&r.tiers));
    if !r.domains.is_empty() {
        let mut ds = Map::new();
        for (d, o) in &r.domains {
            let mut om = Map::new();
            if let Some(h) = o.hard_limit {
                om.insert("hard_limit".into(), h.into());
            }
            if let Some(t) = &o.tiers {
                om.insert("tiers".into(), tiers_value(t));
            }
            ds.insert(d.clone(), Value::Object(om));
        }
        m.insert("domains".into(), Value::Object(ds));
    }
}

fn tiers_value(tiers: &[Tier]) -> Value {
    tiers
        .iter()
        .map(|t| {
            let mut tm = Map::new();
            tm.insert("limit".into(), t.limit.into());
            tm.insert("window".into(), format_span(t.window).into());
            if let Some(a) = t.active {
                tm.insert("active".into(), format_span(a).into());
            }
            tm.insert("cooldown".into(), format_span(t.cooldown).into());
            tm.insert("skippable".into(), t.skippable.into());
            Value::Object(tm)
        })
        .collect()
}

fn copy_fields(c: &CopyResource, m: &mut Map<String, Value>) {
    m.insert("domain_limit".into(), c.domain_limit.into());
    if let Some(g) = c.global_limit {
        m.insert("global_limit".into(), g.into());
    }
    if !c.domains.is_empty() {
        let ds: Map<String, Value> = c
            .domains
            .iter()
            .map(|(d, l)| (d.clone(), json!({ "domain_limit": l })))
            .collect();
        m.insert("domains".into(), Value::Object(ds));
    }
    if !c.groups.is_empty() {
        let gs = c
            .groups
            .iter()
            .map(|g| json!({"name": g.name, "limit": g.limit, "domains": g.domains}))
            .collect();
        m.insert("groups".into(), Value::Array(gs));
    }
}

pub(super) fn to_yaml(v: &Value) -> String {
    // Serializing a JSON value cannot fail: every key is a string.
    serde_saphyr::to_string(v).unwrap_or_else(|e| format!("# could not render: {e}\n"))
}
