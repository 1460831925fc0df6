//! The rate-like kinds' own fields (bucket, window, queue) read from a
//! resource's value, with their overrides, each problem with its path.

use serde_json::{Map, Value};

use super::{overrides, policy_at};
use crate::config::{
    BucketFields, MeterFields, MeterResource, MeterSpec, QueueFields, WindowFields,
};
use crate::fields::{Issues, Path, field_message, one_of, optional_count, required, span};
use crate::time::Millis;
use crate::window::Algorithm;

/// An optional span field (`period`, `window`); its bounds are checked by
/// the kind's `Params::new`.
fn optional_span(
    map: &Map<String, Value>,
    key: &str,
    path: &Path,
    issues: &mut Issues,
) -> Option<Millis> {
    match map.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => span(v, &path.key(key), issues),
    }
}

pub(super) fn bucket_fields(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
) -> BucketFields {
    BucketFields {
        burst: optional_count(map, "burst", path, issues),
        count: optional_count(map, "count", path, issues),
        period: optional_span(map, "period", path, issues),
    }
}

pub(super) fn window_fields(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
) -> WindowFields {
    let algorithm = match map.get("algorithm") {
        None | Some(Value::Null) => None,
        Some(v) => one_of(v, Algorithm::NAMES, &path.key("algorithm"), issues)
            .and_then(Algorithm::from_name),
    };
    WindowFields {
        algorithm,
        limit: optional_count(map, "limit", path, issues),
        window: optional_span(map, "window", path, issues),
    }
}

pub(super) fn queue_fields(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
) -> QueueFields {
    QueueFields {
        rate: optional_count(map, "rate", path, issues),
        period: optional_span(map, "period", path, issues),
        size: optional_count(map, "size", path, issues),
    }
}

/// A bucket, window or queue resource: the kind's fields (all required),
/// `soft_limit`, `ban` and overrides naming any of them. Every exactness
/// bound is checked by the kind's `Params::new`, its error prefixed with
/// the path of the field (or of the override whose combination with the
/// resource's fields fails).
pub(super) fn meter_at<F: MeterFields>(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
    override_fields: &[&str],
    read: fn(&Map<String, Value>, &Path, &mut Issues) -> F,
) -> Option<MeterResource<F>> {
    let before = issues.len();
    for name in F::NAMES {
        required(map, name, path, issues);
    }
    let fields = read(map, path, issues);
    // Fields that did not parse cannot be checked against each other; a
    // bad soft limit or ban does not keep the others from being checked.
    let mut unread = issues.len() - before;
    let spec = MeterSpec {
        fields,
        policy: policy_at(map, path, issues),
    };
    let domains = overrides(map, path, issues, override_fields, None, |om, p, issues| {
        let at = issues.len();
        let fields = read(om, p, issues);
        unread += issues.len() - at;
        Some(MeterSpec {
            fields,
            policy: policy_at(om, p, issues),
        })
    });
    if unread > 0 {
        return None;
    }
    let parsed = issues.len() == before;
    match MeterResource::new(spec, domains) {
        Ok(r) => parsed.then_some(r),
        Err(errors) => {
            for (domain, e) in errors {
                let (at, written) = match &domain {
                    None => (path.clone(), Some(map)),
                    Some(d) => (
                        path.key("domains").key(d),
                        map.get("domains")
                            .and_then(|ds| ds.get(d))
                            .and_then(Value::as_object),
                    ),
                };
                match written.and_then(|w| w.get(e.field)) {
                    Some(v) => issues.push(&at.key(e.field), field_message(Some(v), &e)),
                    None => issues.push(&at, field_message(None, &e)),
                }
            }
            None
        }
    }
}
