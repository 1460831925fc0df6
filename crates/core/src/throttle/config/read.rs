//! The readers of the `throttle:` section's fields, one a function, each
//! problem with its path.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    CHARON_FIELDS, CLIENT_FIELDS, ClientKey, ClientLimit, Criticality, Degraded, Discipline,
    FIELDS, Global, GlobalLease, LEASE_FIELDS, MAX_CLASSES, MAX_CLIENT_LIMITS, MAX_COST_US,
    MAX_UNITS, MAX_WAIT, Reject, ThrottleConfig,
};
use crate::Millis;
use crate::fields::{
    Issues, Path, count, describe, each, list, object, one_of, required, string, too_many,
};
use crate::time::parse_span;

pub(super) fn read(v: &Value, path: &Path, issues: &mut Issues) -> Option<ThrottleConfig> {
    let m = object(v, path, issues, "a throttle section", FIELDS)?;
    let discipline = required(m, "discipline", path, issues)
        .and_then(|d| one_of(d, &["qps", "cost"], &path.key("discipline"), issues))
        .map(|d| match d {
            "qps" => Discipline::Qps,
            _ => Discipline::Cost,
        });
    let rate = bounded(m, "rate", path, issues, 1);
    let queue = bounded(m, "queue", path, issues, 0);
    let max_wait = match m.get("max_wait") {
        None | Some(Value::Null) => Some(2_000),
        Some(v) => wait(v, &path.key("max_wait"), issues),
    };
    let default_criticality = match m.get("default_criticality") {
        None | Some(Value::Null) => Some(Criticality::Critical),
        Some(v) => criticality(v, &path.key("default_criticality"), issues),
    };
    let default_cost_us = match m.get("default_cost") {
        None | Some(Value::Null) => Some(5_000),
        Some(v) => cost(v, &path.key("default_cost"), issues),
    };
    let classes = match m.get("classes") {
        None | Some(Value::Null) => Some(BTreeMap::new()),
        Some(v) => classes(v, &path.key("classes"), issues),
    };
    let reject = match m.get("reject") {
        None | Some(Value::Null) => Some(Reject::Status(429)),
        Some(v) => reject(v, &path.key("reject"), issues),
    };
    let clients = match m.get("clients") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(v) => {
            let p = path.key("clients");
            list(v, &p, issues)
                .filter(|items| {
                    !too_many(items.len(), MAX_CLIENT_LIMITS, "client limits", &p, issues)
                })
                .and_then(|items| each(items, &p, issues, client))
        }
    };
    let charon = match m.get("charon") {
        None | Some(Value::Null) => Some(None),
        Some(v) => global(v, &path.key("charon"), issues).map(Some),
    };
    let (clients, charon) = (clients?, charon?);
    if charon.is_none() {
        for (i, c) in clients.iter().enumerate() {
            if c.global.is_some() {
                issues.push(
                    &path.key("clients").index(i).key("global"),
                    "a global limit needs `throttle.charon.server`, the Charon server to ask",
                );
            }
        }
    }
    Some(ThrottleConfig {
        discipline: discipline?,
        rate: rate?,
        queue: queue?,
        max_wait: max_wait?,
        default_criticality: default_criticality?,
        default_cost_us: default_cost_us?,
        classes: classes?,
        reject: reject?,
        clients,
        charon,
    })
}

fn bounded(
    m: &Map<String, Value>,
    key: &str,
    path: &Path,
    issues: &mut Issues,
    min: u64,
) -> Option<u64> {
    let p = path.key(key);
    let n = count(required(m, key, path, issues)?, &p, issues)?;
    if n < min || n > MAX_UNITS {
        issues.push(&p, format!("{n} is out of range ({min} to {MAX_UNITS})"));
        return None;
    }
    Some(n)
}

fn wait(v: &Value, path: &Path, issues: &mut Issues) -> Option<Millis> {
    let ms = match v {
        Value::String(s) => parse_span(s).map_err(|e| issues.push(path, e)).ok()?,
        other => {
            issues.push(
                path,
                format!(
                    "expected a duration such as \"2s\", found {}",
                    describe(other)
                ),
            );
            return None;
        }
    };
    if ms > MAX_WAIT {
        issues.push(path, format!("{ms} ms is longer than an hour"));
        return None;
    }
    Some(ms)
}

fn criticality(v: &Value, path: &Path, issues: &mut Issues) -> Option<Criticality> {
    one_of(v, &["CRITICAL", "NOT_CRITICAL"], path, issues).and_then(Criticality::parse)
}

/// A cost such as `5ms`, `250us` or `1.5ms`, in whole CPU-microseconds
/// (1 µs to an hour).
pub fn cost(v: &Value, path: &Path, issues: &mut Issues) -> Option<u64> {
    let Value::String(s) = v else {
        issues.push(
            path,
            format!(
                "expected a CPU time such as \"5ms\" or \"250us\", found {}",
                describe(v)
            ),
        );
        return None;
    };
    match parse_cost(s) {
        Some(us) if (1..=MAX_COST_US).contains(&us) => Some(us),
        _ => {
            issues.push(
                path,
                format!(
                    "{s:?} is not a CPU time of whole microseconds from 1us to 1h \
                     (write it like \"5ms\", \"1.5ms\" or \"250us\")"
                ),
            );
            None
        }
    }
}

/// Whole microseconds of `1.5ms` as well as of humantime's `1ms 500us`;
/// `None` for anything else (a fraction of a microsecond included).
pub fn parse_cost(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms")
        && let Some((whole, frac)) = ms.trim().split_once('.')
    {
        // Decimal milliseconds, exactly: at most three digits after the
        // point.
        if whole.is_empty() || frac.is_empty() || frac.len() > 3 {
            return None;
        }
        if !(whole.bytes().all(|b| b.is_ascii_digit()) && frac.bytes().all(|b| b.is_ascii_digit()))
        {
            return None;
        }
        let whole: u64 = whole.parse().ok()?;
        let frac: u64 = format!("{frac:0<3}").parse().ok()?;
        return whole.checked_mul(1000)?.checked_add(frac);
    }
    let d = humantime::parse_duration(s).ok()?;
    if d.subsec_nanos() % 1_000 != 0 {
        return None;
    }
    u64::try_from(d.as_micros()).ok()
}

fn classes(v: &Value, path: &Path, issues: &mut Issues) -> Option<BTreeMap<String, u64>> {
    let Value::Object(m) = v else {
        issues.push(
            path,
            format!(
                "expected a mapping of classes to costs (\"POST /render\": 40ms), found {}",
                describe(v)
            ),
        );
        return None;
    };
    if too_many(m.len(), MAX_CLASSES, "classes", path, issues) {
        return None;
    }
    let before = issues.len();
    let out: BTreeMap<String, u64> = m
        .iter()
        .filter_map(|(k, c)| cost(c, &path.key(k), issues).map(|c| (k.clone(), c)))
        .collect();
    (issues.len() == before).then_some(out)
}

fn reject(v: &Value, path: &Path, issues: &mut Issues) -> Option<Reject> {
    let m = object(v, path, issues, "a rejection", &["status", "redirect"])?;
    match (m.get("status"), m.get("redirect")) {
        (Some(s), None) => {
            let p = path.key("status");
            match count(s, &p, issues)? {
                n @ (429 | 503) => Some(Reject::Status(u16::try_from(n).ok()?)),
                n => {
                    issues.push(&p, format!("{n} is not 429 or 503"));
                    None
                }
            }
        }
        (None, Some(u)) => {
            let p = path.key("redirect");
            let url = string(u, &p, issues)?;
            if !(url.starts_with("http://") || url.starts_with("https://") || url.starts_with('/'))
                || url.chars().any(char::is_control)
            {
                issues.push(
                    &p,
                    format!("{url:?} is not an http(s) URL or an absolute path"),
                );
                return None;
            }
            Some(Reject::Redirect(url))
        }
        _ => {
            issues.push(
                path,
                "expected exactly one of `status` (429 or 503) or `redirect` (a URL)",
            );
            None
        }
    }
}

fn client(v: &Value, path: &Path, issues: &mut Issues) -> Option<ClientLimit> {
    let m = object(v, path, issues, "a client limit", CLIENT_FIELDS)?;
    let kind = required(m, "key", path, issues).and_then(|k| {
        one_of(
            k,
            &["all", "ip", "header", "cookie", "region"],
            &path.key("key"),
            issues,
        )
    });
    let name = match m.get("name") {
        None | Some(Value::Null) => None,
        Some(v) => string(v, &path.key("name"), issues),
    };
    let key = match kind? {
        "all" => ClientKey::All,
        "ip" => {
            let (ipv4, ipv6) = mask(m.get("mask"), &path.key("mask"), issues)?;
            let forwarded = crate::fields::boolean(m, "forwarded", path, issues);
            ClientKey::Ip {
                ipv4,
                ipv6,
                forwarded,
            }
        }
        k => {
            let Some(name) = name.clone().filter(|n| !n.is_empty()) else {
                issues.push(
                    &path.key("name"),
                    format!(
                        "key {k} needs the `name` of its {}",
                        if k == "cookie" { "cookie" } else { "header" }
                    ),
                );
                return None;
            };
            if k != "cookie" && http_header_name(&name).is_none() {
                issues.push(&path.key("name"), format!("{name:?} is not a header name"));
                return None;
            }
            match k {
                "header" => ClientKey::Header(name.to_ascii_lowercase()),
                "region" => ClientKey::Region(name.to_ascii_lowercase()),
                _ => ClientKey::Cookie(name),
            }
        }
    };
    if !matches!(
        key,
        ClientKey::Header(_) | ClientKey::Cookie(_) | ClientKey::Region(_)
    ) && name.is_some()
    {
        issues.push(
            &path.key("name"),
            "only header, cookie and region keys have a name",
        );
    }
    if !matches!(key, ClientKey::Ip { .. }) {
        for field in ["mask", "forwarded"] {
            if m.contains_key(field) {
                issues.push(&path.key(field), "only an ip key has this");
            }
        }
    }
    let resource = opt_string(m, "resource", path, issues);
    let global = opt_string(m, "global", path, issues);
    if resource.is_none() && global.is_none() && issues.is_empty() {
        issues.push(
            path,
            "a client limit names a `resource`, a `global` resource, or both",
        );
        return None;
    }
    Some(ClientLimit {
        key,
        resource,
        global,
    })
}

fn opt_string(
    m: &Map<String, Value>,
    key: &str,
    path: &Path,
    issues: &mut Issues,
) -> Option<String> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => string(v, &path.key(key), issues),
    }
}

/// A lowercase token of RFC 9110 (a header name), or `None`.
fn http_header_name(name: &str) -> Option<()> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    ok.then_some(())
}

fn mask(v: Option<&Value>, path: &Path, issues: &mut Issues) -> Option<(u8, u8)> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Some((32, 128));
    };
    let m = object(v, path, issues, "a mask", &["ipv4", "ipv6"])?;
    let mut bits = |key: &str, max: u64, default: u8| -> Option<u8> {
        match m.get(key) {
            None | Some(Value::Null) => Some(default),
            Some(v) => {
                let n = count(v, &path.key(key), issues)?;
                if n > max {
                    issues.push(&path.key(key), format!("{n} is more than {max} bits"));
                    return None;
                }
                u8::try_from(n).ok()
            }
        }
    };
    let ipv4 = bits("ipv4", 32, 32);
    let ipv6 = bits("ipv6", 128, 128);
    Some((ipv4?, ipv6?))
}

fn global(v: &Value, path: &Path, issues: &mut Issues) -> Option<Global> {
    let m = object(
        v,
        path,
        issues,
        "the Charon server of global limits",
        CHARON_FIELDS,
    )?;
    let server =
        required(m, "server", path, issues).and_then(|s| string(s, &path.key("server"), issues));
    let server = server.filter(|s| {
        let ok = s.starts_with("http://") || s.starts_with("https://");
        if !ok {
            issues.push(
                &path.key("server"),
                format!("{s:?} is not an http:// or https:// URL"),
            );
        }
        ok
    });
    let degraded = match m.get("degraded") {
        None | Some(Value::Null) => Some(Degraded::Optimistic),
        Some(v) => one_of(
            v,
            &["optimistic", "pessimistic", "safe"],
            &path.key("degraded"),
            issues,
        )
        .map(|d| match d {
            "optimistic" => Degraded::Optimistic,
            "pessimistic" => Degraded::Pessimistic,
            _ => Degraded::Safe,
        }),
    };
    let lease = match m.get("lease") {
        None | Some(Value::Null) => Some(None),
        Some(v) => {
            let p = path.key("lease");
            let l = object(v, &p, issues, "a lease", LEASE_FIELDS);
            l.and_then(|l| {
                let resource = required(l, "resource", &p, issues)
                    .and_then(|r| string(r, &p.key("resource"), issues));
                let wants = required(l, "wants", &p, issues)
                    .and_then(|w| crate::fields::number(w, &p.key("wants"), issues))
                    .filter(|w| {
                        let ok = w.is_finite() && *w > 0.0;
                        if !ok {
                            issues.push(&p.key("wants"), "must be more than 0");
                        }
                        ok
                    });
                Some(Some(GlobalLease {
                    resource: resource?,
                    wants: wants?,
                }))
            })
        }
    };
    Some(Global {
        server: server?,
        degraded: degraded?,
        lease: lease?,
    })
}
