//! From a parsed document (YAML or JSON, as a `serde_json::Value`) to the
//! typed model, collecting every problem with its field path instead of
//! stopping at the first. Unknown fields are errors: a misspelt `limt`
//! silently ignored is a limit that silently does not apply.

mod copy;
mod meter;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    ConfigErrors, EMPTY_CONFIGURATION, KINDS, MAX_DOMAIN_OVERRIDES, MAX_NAMESPACES, MAX_RESOURCES,
    MAX_TIERS, MAX_TIERS_PER_RESOURCE, NamespaceSettings, RateOverride, RateResource, Resource,
    ResourceKind, Tier,
};
use crate::envoy::Envoy;
use crate::fields::{
    Issues, Path, boolean, count, describe, each, field_message, list, name, object, one_of,
    optional_count, required, span, too_many, unknown_field,
};
use crate::meter::{Ban, Policy, SoftLimit};
use crate::request::check_name;
use copy::copy_at;
use meter::{bucket_fields, meter_at, queue_fields, window_fields};

const RATE_FIELDS: &[&str] = &[
    "name",
    "kind",
    "hard_limit",
    "global_limit",
    "tiers",
    "soft_limit",
    "ban",
    "domains",
];
const RATE_OVERRIDE_FIELDS: &[&str] = &["hard_limit", "tiers", "soft_limit", "ban"];
const BUCKET_FIELDS: &[&str] = &[
    "name",
    "kind",
    "burst",
    "count",
    "period",
    "soft_limit",
    "ban",
    "domains",
];
const BUCKET_OVERRIDE_FIELDS: &[&str] = &["burst", "count", "period", "soft_limit", "ban"];
const WINDOW_FIELDS: &[&str] = &[
    "name",
    "kind",
    "algorithm",
    "limit",
    "window",
    "soft_limit",
    "ban",
    "domains",
];
const WINDOW_OVERRIDE_FIELDS: &[&str] = &["algorithm", "limit", "window", "soft_limit", "ban"];
const QUEUE_FIELDS: &[&str] = &[
    "name",
    "kind",
    "rate",
    "period",
    "size",
    "soft_limit",
    "ban",
    "domains",
];
const QUEUE_OVERRIDE_FIELDS: &[&str] = &["rate", "period", "size", "soft_limit", "ban"];
/// The fields of a resource of each kind, in the order of [`KINDS`].
const KIND_FIELDS: [&[&str]; 6] = [
    RATE_FIELDS,
    COPY_FIELDS,
    BUCKET_FIELDS,
    WINDOW_FIELDS,
    QUEUE_FIELDS,
    super::lease::LEASE_FIELDS,
];
/// The fields a resource of `kind` may name (`None` for an unknown
/// kind): the one list that the OpenAPI schema of the configuration API
/// is checked against, so that a new field cannot be left out of it.
pub fn resource_fields(kind: &str) -> Option<&'static [&'static str]> {
    KINDS
        .iter()
        .position(|k| *k == kind)
        .map(|i| KIND_FIELDS[i])
}

const COPY_FIELDS: &[&str] = &[
    "name",
    "kind",
    "domain_limit",
    "global_limit",
    "domains",
    "groups",
    "queue_limit",
    "wait_mode",
];
const TIER_FIELDS: &[&str] = &["limit", "window", "active", "cooldown", "skippable"];
const NAMESPACE_FIELDS: &[&str] = &["allow_unconfigured", "ignore_configured"];

/// What a configuration document holds, parsed: namespaces, resources and
/// the `envoy:` section (`None` when absent or null).
pub(super) type Parsed = (
    BTreeMap<String, NamespaceSettings>,
    Vec<Resource>,
    Option<Envoy>,
);

/// Parses a whole configuration document.
pub(super) fn parse_config(v: &Value) -> Result<Parsed, ConfigErrors> {
    let mut issues = Issues::default();
    let root = Path::default();
    let mut namespaces = BTreeMap::new();
    let mut resources = Vec::new();
    let mut envoy = None;
    // No bytes, only whitespace or only comments: a truncated file or an
    // export that failed, never a wish for no limits. So are keys with
    // nothing after them (`resources:` and no more, a file cut after its
    // first line): they say no more than an empty file, and applying them
    // would drop every limit.
    let only_empty_keys = v
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.values().all(Value::is_null));
    if v.is_null() || only_empty_keys {
        issues.push(&root, EMPTY_CONFIGURATION);
        return Err(ConfigErrors(issues.into_vec()));
    }
    if let Some(map) = object(
        v,
        &root,
        &mut issues,
        "a configuration",
        &["namespaces", "resources", "envoy"],
    ) {
        match map.get("namespaces") {
            None | Some(Value::Null) => {}
            Some(Value::Object(nss))
                if too_many(
                    nss.len(),
                    MAX_NAMESPACES,
                    "namespaces",
                    &root.key("namespaces"),
                    &mut issues,
                ) => {}
            Some(Value::Object(nss)) => {
                let path = root.key("namespaces");
                for (ns, settings) in nss {
                    let p = path.key(ns);
                    if let Err(e) = check_namespace_name(ns) {
                        issues.push(&p, e);
                    }
                    if let Some(s) = namespace_at(settings, &p, &mut issues) {
                        namespaces.insert(ns.clone(), s);
                    }
                }
            }
            Some(other) => issues.push(
                &root.key("namespaces"),
                format!(
                    "expected a mapping of namespace names, found {}",
                    describe(other)
                ),
            ),
        }
        if let Some(rs) = map.get("resources").filter(|v| !v.is_null()) {
            let path = root.key("resources");
            if let Some(items) = list(rs, &path, &mut issues)
                && !too_many(items.len(), MAX_RESOURCES, "resources", &path, &mut issues)
            {
                for (i, item) in items.iter().enumerate() {
                    if let Some(r) = resource_at(item, &path.index(i), &mut issues) {
                        resources.push(r);
                    }
                }
            }
        }
        if let Some(e) = map.get("envoy").filter(|v| !v.is_null()) {
            envoy = crate::envoy::parse::section(e, &root.key("envoy"), &mut issues);
        }
    }
    issues.finish((namespaces, resources, envoy))
}

fn check_namespace_name(ns: &str) -> Result<(), String> {
    check_name("namespace", ns).map_err(|e| e.to_string())?;
    if ns.contains('/') {
        return Err("a namespace name cannot contain '/'".to_owned());
    }
    Ok(())
}

/// Parses the settings of one namespace (the config API's namespace body).
pub fn parse_namespace(v: &Value) -> Result<NamespaceSettings, ConfigErrors> {
    let mut issues = Issues::default();
    let settings = namespace_at(v, &Path::default(), &mut issues);
    issues.finish(settings.unwrap_or_default())
}

fn namespace_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<NamespaceSettings> {
    let map = object(v, path, issues, "namespace settings", NAMESPACE_FIELDS)?;
    Some(NamespaceSettings {
        allow_unconfigured: boolean(map, "allow_unconfigured", path, issues),
        ignore_configured: boolean(map, "ignore_configured", path, issues),
    })
}

/// Parses one resource (the config API's resource body). Normalization is
/// applied when the resource becomes part of a [`super::Config`].
pub fn parse_resource(v: &Value) -> Result<Resource, ConfigErrors> {
    let mut issues = Issues::default();
    let r = resource_at(v, &Path::default(), &mut issues);
    match r {
        Some(r) => issues.finish(r),
        None => Err(ConfigErrors(issues.into_vec())),
    }
}

/// Parses an `envoy:` section on its own (what the configuration API
/// stores and its feed hands to servers), paths starting at `envoy`.
/// References to resources are checked when it joins a configuration
/// ([`super::Config::with_envoy`]).
pub fn parse_envoy(v: &Value) -> Result<Envoy, ConfigErrors> {
    let mut issues = Issues::default();
    match crate::envoy::parse::section(v, &Path::root().key("envoy"), &mut issues) {
        Some(e) => issues.finish(e),
        None => Err(ConfigErrors(issues.into_vec())),
    }
}

fn resource_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Resource> {
    let Value::Object(map) = v else {
        issues.push(
            path,
            format!("expected a resource (a mapping), found {}", describe(v)),
        );
        return None;
    };
    let kind = match map.get("kind") {
        None | Some(Value::Null) => {
            issues.push(
                &path.key("kind"),
                "is required (rate, copy, bucket, window, queue or lease)",
            );
            None
        }
        Some(k) => one_of(k, KINDS, &path.key("kind"), issues),
    };
    if let Some(kind) = kind {
        let allowed = KINDS
            .iter()
            .position(|&k| k == kind)
            .map_or(RATE_FIELDS, |i| KIND_FIELDS[i]);
        for key in map.keys() {
            if allowed.contains(&key.as_str()) {
                continue;
            }
            let elsewhere = KIND_FIELDS.iter().any(|f| f.contains(&key.as_str()));
            let message = if elsewhere {
                format!(
                    "not a field of a {kind} resource (expected one of: {})",
                    allowed.join(", ")
                )
            } else {
                unknown_field(allowed)
            };
            issues.push(&path.key(key), message);
        }
    }
    let name = required(map, "name", path, issues).and_then(|v| {
        let n = name(v, &path.key("name"), issues, "name")?;
        if n.starts_with('/') {
            issues.push(
                &path.key("name"),
                "the namespace (the text before the first '/') must not be empty",
            );
            return None;
        }
        Some(n)
    });
    let kind = match kind? {
        "rate" => ResourceKind::Rate(rate_at(map, path, issues)?),
        "bucket" => ResourceKind::Bucket(meter_at(
            map,
            path,
            issues,
            BUCKET_OVERRIDE_FIELDS,
            bucket_fields,
        )?),
        "window" => ResourceKind::Window(meter_at(
            map,
            path,
            issues,
            WINDOW_OVERRIDE_FIELDS,
            window_fields,
        )?),
        "queue" => ResourceKind::Queue(meter_at(
            map,
            path,
            issues,
            QUEUE_OVERRIDE_FIELDS,
            queue_fields,
        )?),
        "lease" => ResourceKind::Lease(super::lease::lease_at(map, path, issues, span)?),
        _ => ResourceKind::Copy(copy_at(map, path, issues)?),
    };
    Some(Resource { name: name?, kind })
}

fn rate_at(map: &Map<String, Value>, path: &Path, issues: &mut Issues) -> Option<RateResource> {
    let before = issues.len();
    let hard_limit = optional_count(map, "hard_limit", path, issues);
    let global_limit = optional_count(map, "global_limit", path, issues);
    let tiers =
        required(map, "tiers", path, issues).and_then(|v| tiers_at(v, &path.key("tiers"), issues));
    let policy = policy_at(map, path, issues);
    let listed = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, Vec::len);
    let domains = overrides(
        map,
        path,
        issues,
        RATE_OVERRIDE_FIELDS,
        Some(listed(map.get("tiers"))),
        |om, p, issues| {
            Some(RateOverride {
                hard_limit: optional_count(om, "hard_limit", p, issues),
                tiers: om
                    .get("tiers")
                    .filter(|v| !v.is_null())
                    .and_then(|v| tiers_at(v, &p.key("tiers"), issues)),
                policy: policy_at(om, p, issues),
            })
        },
    );
    (issues.len() == before).then(|| RateResource {
        hard_limit,
        global_limit,
        tiers: tiers.unwrap_or_default(),
        policy,
        domains,
    })
}

/// Parses `soft_limit: "N%"`: a whole percentage above 0 % and at most
/// 100 % (SPEC §10). What the message says is the same for the file, the
/// config API and any other reader.
pub fn parse_soft_limit(text: &str) -> Result<SoftLimit, String> {
    let Some(digits) = text.trim().strip_suffix('%') else {
        return Err(format!(
            "{text:?} is not a percentage (write it like \"80%\")"
        ));
    };
    let digits = digits.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{text:?} must be a whole percentage above 0% and at most 100%"
        ));
    }
    // More digits than fit a u64 are far above 100 %.
    let percent = digits.parse::<u64>().unwrap_or(u64::MAX);
    SoftLimit::percent(percent).map_err(|_| format!("{text:?} must be above 0% and at most 100%"))
}

/// `soft_limit` and `ban` of a resource or an override (SPEC §10).
fn policy_at(map: &Map<String, Value>, path: &Path, issues: &mut Issues) -> Policy {
    let soft_limit = match map.get("soft_limit") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match parse_soft_limit(s) {
            Ok(l) => Some(l),
            Err(e) => {
                issues.push(&path.key("soft_limit"), e);
                None
            }
        },
        Some(other) => {
            issues.push(
                &path.key("soft_limit"),
                format!(
                    "expected a percentage such as \"80%\", found {}",
                    describe(other)
                ),
            );
            None
        }
    };
    let ban = match map.get("ban") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let p = path.key("ban");
            span(v, &p, issues).and_then(|ms| match Ban::new(ms) {
                Ok(b) => Some(b),
                Err(e) => {
                    issues.push(&p, field_message(Some(v), &e));
                    None
                }
            })
        }
    };
    Policy { soft_limit, ban }
}

/// The domain overrides at `map.domains`, each a mapping of `fields` read
/// by `read`, keyed by a valid domain name. With `tiers`, the resource's
/// own tier count: the tiers of the resource and its overrides together
/// are bounded.
fn overrides<T>(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
    fields: &[&str],
    tiers: Option<usize>,
    mut read: impl FnMut(&Map<String, Value>, &Path, &mut Issues) -> Option<T>,
) -> BTreeMap<String, T> {
    let mut domains = BTreeMap::new();
    let Some(v) = map.get("domains").filter(|v| !v.is_null()) else {
        return domains;
    };
    let dpath = path.key("domains");
    let Value::Object(ds) = v else {
        issues.push(
            &dpath,
            format!(
                "expected a mapping of domain names to overrides, found {}",
                describe(v)
            ),
        );
        return domains;
    };
    let listed = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, Vec::len);
    if too_many(
        ds.len(),
        MAX_DOMAIN_OVERRIDES,
        "domain overrides",
        &dpath,
        issues,
    ) || tiers.is_some_and(|own| {
        too_many(
            own + ds.values().map(|o| listed(o.get("tiers"))).sum::<usize>(),
            MAX_TIERS_PER_RESOURCE,
            "tiers in the resource and its overrides",
            &dpath,
            issues,
        )
    }) {
        return domains;
    }
    for (domain, o) in ds {
        let p = dpath.key(domain);
        if let Err(e) = check_name("domain", domain) {
            issues.push(&p, e.to_string());
        }
        if let Some(om) = object(o, &p, issues, "a domain override", fields)
            && let Some(over) = read(om, &p, issues)
        {
            domains.insert(domain.clone(), over);
        }
    }
    domains
}

fn tiers_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Vec<Tier>> {
    let items = list(v, path, issues)?;
    if too_many(items.len(), MAX_TIERS, "tiers", path, issues) {
        return None;
    }
    each(items, path, issues, tier_at)
}

fn tier_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Tier> {
    let map = object(v, path, issues, "a tier", TIER_FIELDS)?;
    let limit =
        required(map, "limit", path, issues).and_then(|v| count(v, &path.key("limit"), issues));
    let window = required(map, "window", path, issues).and_then(|v| {
        let w = span(v, &path.key("window"), issues)?;
        if w == 0 {
            issues.push(&path.key("window"), "must be at least 1ms");
            return None;
        }
        Some(w)
    });
    let active = match map.get("active") {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if matches!(s.trim(), "infinite" | "inf" | "forever") => Some(None),
        Some(v) => span(v, &path.key("active"), issues).map(Some),
    };
    let cooldown = match map.get("cooldown") {
        None | Some(Value::Null) => Some(0),
        Some(v) => span(v, &path.key("cooldown"), issues),
    };
    let skippable = boolean(map, "skippable", path, issues);
    Some(Tier {
        limit: limit?,
        window: window?,
        active: active?,
        cooldown: cooldown?,
        skippable,
    })
}
