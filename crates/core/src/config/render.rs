//! The normalized model back to the SPEC §6 layout, for `charon config
//! check`, `charon config export` and the config API. What is rendered
//! parses back to an equal configuration (a round-trip test holds this).

use serde_json::{Map, Value, json};

use super::{
    BucketFields, Config, CopyResource, MeterFields, MeterResource, MeterSpec, QueueFields,
    RateResource, ResourceKind, Tier, WindowFields,
};
use crate::meter::Policy;
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
    if let Some(e) = config.envoy() {
        root.insert("envoy".into(), crate::envoy::render::section(e));
    }
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
        ResourceKind::Bucket(b) => meter_fields(b, &mut m),
        ResourceKind::Window(w) => meter_fields(w, &mut m),
        ResourceKind::Queue(q) => meter_fields(q, &mut m),
        ResourceKind::Lease(l) => super::lease::lease_fields(l, &mut m),
    }
    Value::Object(m)
}

/// `soft_limit` and `ban`, where set.
fn policy_fields(p: Policy, m: &mut Map<String, Value>) {
    if let Some(s) = p.soft_limit {
        m.insert("soft_limit".into(), format!("{}%", s.as_percent()).into());
    }
    if let Some(b) = p.ban {
        m.insert("ban".into(), format_span(b.duration()).into());
    }
}

/// The kind's own fields of a bucket, window or queue, where set.
trait Render {
    fn render(&self, m: &mut Map<String, Value>);
}

impl Render for BucketFields {
    fn render(&self, m: &mut Map<String, Value>) {
        if let Some(b) = self.burst {
            m.insert("burst".into(), b.into());
        }
        if let Some(c) = self.count {
            m.insert("count".into(), c.into());
        }
        if let Some(p) = self.period {
            m.insert("period".into(), format_span(p).into());
        }
    }
}

impl Render for WindowFields {
    fn render(&self, m: &mut Map<String, Value>) {
        if let Some(a) = self.algorithm {
            m.insert("algorithm".into(), a.name().into());
        }
        if let Some(l) = self.limit {
            m.insert("limit".into(), l.into());
        }
        if let Some(w) = self.window {
            m.insert("window".into(), format_span(w).into());
        }
    }
}

impl Render for QueueFields {
    fn render(&self, m: &mut Map<String, Value>) {
        if let Some(r) = self.rate {
            m.insert("rate".into(), r.into());
        }
        if let Some(p) = self.period {
            m.insert("period".into(), format_span(p).into());
        }
        if let Some(s) = self.size {
            m.insert("size".into(), s.into());
        }
    }
}

fn spec_fields<F: MeterFields + Render>(spec: &MeterSpec<F>, m: &mut Map<String, Value>) {
    spec.fields.render(m);
    policy_fields(spec.policy, m);
}

fn meter_fields<F: MeterFields + Render>(r: &MeterResource<F>, m: &mut Map<String, Value>) {
    spec_fields(r.spec(), m);
    if !r.domains().is_empty() {
        let ds = r
            .domains()
            .iter()
            .map(|(d, o)| {
                let mut om = Map::new();
                spec_fields(o.spec(), &mut om);
                (d.clone(), Value::Object(om))
            })
            .collect();
        m.insert("domains".into(), Value::Object(ds));
    }
}

fn rate_fields(r: &RateResource, m: &mut Map<String, Value>) {
    if let Some(h) = r.hard_limit {
        m.insert("hard_limit".into(), h.into());
    }
    if let Some(g) = r.global_limit {
        m.insert("global_limit".into(), g.into());
    }
    m.insert("tiers".into(), tiers_value(&r.tiers));
    policy_fields(r.policy, m);
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
            policy_fields(o.policy, &mut om);
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
    if c.queue_limit != crate::copy::DEFAULT_QUEUE_LIMIT {
        m.insert("queue_limit".into(), c.queue_limit.into());
    }
    if c.wait_mode == crate::copy::WaitMode::SharedResult {
        m.insert("wait_mode".into(), "shared_result".into());
    }
}

pub(super) fn to_yaml(v: &Value) -> String {
    // Serializing a JSON value cannot fail: every key is a string.
    serde_saphyr::to_string(v).unwrap_or_else(|e| format!("# could not render: {e}\n"))
}
