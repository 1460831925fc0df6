//! `kind: lease` in the configuration (SPEC §12): a capacity shared among
//! clients as leases, instead of asked for per request. Read and rendered
//! here; the rules are [`crate::lease`]'s.

use serde_json::{Map, Value};

use crate::fields::{Issues, Path, number, one_of, required};
use crate::lease::{Algorithm, LeaseParams, Quantity};
use crate::time::format_span;

/// The fields of a lease resource, as the configuration file writes them.
pub(super) const LEASE_FIELDS: &[&str] = &[
    "name",
    "kind",
    "capacity",
    "algorithm",
    "lease_length",
    "refresh_interval",
    "safe_capacity",
    "learning_mode",
];

/// A resource of `kind: lease`, validated: what a lease server shares and
/// how. There are no domain overrides: a lease is per client, and clients
/// are not domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseResource {
    params: LeaseParams,
}

impl LeaseResource {
    /// A lease resource with these parameters.
    pub fn new(params: LeaseParams) -> Self {
        Self { params }
    }

    /// The parameters every lease decision takes.
    pub fn params(&self) -> &LeaseParams {
        &self.params
    }
}

/// A capacity as written: a JSON number (fractions allowed, to the
/// millionth, as in the paper's tables).
fn quantity(v: &Value, field: &str, path: &Path, issues: &mut Issues) -> Option<Quantity> {
    let path = &path.key(field);
    let n = number(v, path, issues)?;
    match Quantity::parse(field, n) {
        Ok(q) => Some(q),
        Err(e) => {
            issues.push(path, e.to_string());
            None
        }
    }
}

/// Reads a lease resource's fields at `path`: `capacity`, `algorithm`,
/// `lease_length` and `refresh_interval` are required; `safe_capacity`
/// (else computed, see [`LeaseParams::safe_capacity`]) and
/// `learning_mode` (else one lease length; `0s` turns it off) are not.
pub(super) fn lease_at(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
    span: fn(&Value, &Path, &mut Issues) -> Option<crate::Millis>,
) -> Option<LeaseResource> {
    let before = issues.len();
    let capacity =
        required(map, "capacity", path, issues).and_then(|v| quantity(v, "capacity", path, issues));
    let algorithm = required(map, "algorithm", path, issues).and_then(|v| {
        let name = one_of(v, Algorithm::NAMES, &path.key("algorithm"), issues)?;
        Some(match name {
            "none" => Algorithm::None,
            "static" => Algorithm::Static,
            "proportional_share" => Algorithm::ProportionalShare,
            _ => Algorithm::FairShare,
        })
    });
    let lease_length = required(map, "lease_length", path, issues)
        .and_then(|v| span(v, &path.key("lease_length"), issues));
    let refresh_interval = required(map, "refresh_interval", path, issues)
        .and_then(|v| span(v, &path.key("refresh_interval"), issues));
    let optional = |key: &str| map.get(key).filter(|v| !v.is_null());
    let safe_capacity =
        optional("safe_capacity").and_then(|v| quantity(v, "safe_capacity", path, issues));
    let learning_mode =
        optional("learning_mode").and_then(|v| span(v, &path.key("learning_mode"), issues));
    if issues.len() != before {
        return None;
    }
    let params = LeaseParams::new(capacity?, algorithm?, lease_length?, refresh_interval?)
        .and_then(|p| match learning_mode {
            Some(span) => p.with_learning_mode(span),
            None => Ok(p),
        });
    match params {
        Ok(p) => Some(LeaseResource::new(match safe_capacity {
            Some(s) => p.with_safe_capacity(s),
            None => p,
        })),
        Err(e) => {
            let written = map.get(e.field).map_or_else(String::new, |v| match v {
                Value::String(s) => format!("{s:?} "),
                other => format!("{other} "),
            });
            issues.push(&path.key(e.field), format!("{written}{}", e.message));
            None
        }
    }
}

/// The fields of a lease resource in the SPEC §12 layout, every one
/// written out (learning mode too, so what applies is visible).
pub(super) fn lease_fields(r: &LeaseResource, m: &mut Map<String, Value>) {
    let p = r.params();
    let number = |q: Quantity| serde_json::to_value(q).unwrap_or(Value::Null);
    m.insert("capacity".into(), number(p.capacity()));
    m.insert("algorithm".into(), p.algorithm().name().into());
    m.insert("lease_length".into(), format_span(p.lease_length()).into());
    m.insert(
        "refresh_interval".into(),
        format_span(p.refresh_interval()).into(),
    );
    if let Some(s) = p.configured_safe_capacity() {
        m.insert("safe_capacity".into(), number(s));
    }
    m.insert(
        "learning_mode".into(),
        format_span(p.learning_mode()).into(),
    );
}
