//! A copy-limited resource read from its value: its limits, overrides
//! and groups, each problem with its path.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::overrides;
use crate::config::{CopyResource, Group, MAX_GROUP_MEMBERS, MAX_GROUPS};
use crate::fields::{
    Issues, Path, count, list, name, object, one_of, optional_count, required, too_many,
};

pub(super) fn copy_at(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
) -> Option<CopyResource> {
    let before = issues.len();
    let domain_limit = required(map, "domain_limit", path, issues)
        .and_then(|v| count(v, &path.key("domain_limit"), issues));
    let global_limit = optional_count(map, "global_limit", path, issues);
    let queue_limit = optional_count(map, "queue_limit", path, issues);
    if let Some(q) = queue_limit.filter(|&q| q > crate::copy::MAX_QUEUE_LIMIT) {
        issues.push(
            &path.key("queue_limit"),
            format!(
                "{q} is more than the {} waiters a resource may have",
                crate::copy::MAX_QUEUE_LIMIT
            ),
        );
    }
    let wait_mode = match map.get("wait_mode") {
        None | Some(Value::Null) => Some(crate::copy::WaitMode::default()),
        Some(v) => one_of(
            v,
            &["exclusive", "shared_result"],
            &path.key("wait_mode"),
            issues,
        )
        .map(|m| {
            if m == "shared_result" {
                crate::copy::WaitMode::SharedResult
            } else {
                crate::copy::WaitMode::Exclusive
            }
        }),
    };
    let domains = overrides(
        map,
        path,
        issues,
        &["domain_limit"],
        None,
        |om, p, issues| {
            required(om, "domain_limit", p, issues)
                .and_then(|v| count(v, &p.key("domain_limit"), issues))
        },
    );
    let mut groups = Vec::new();
    if let Some(v) = map.get("groups").filter(|v| !v.is_null()) {
        let gpath = path.key("groups");
        let members = |g: &Value| {
            g.get("domains")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        };
        if let Some(items) = list(v, &gpath, issues)
            && !too_many(items.len(), MAX_GROUPS, "groups", &gpath, issues)
            && !too_many(
                items.iter().map(members).sum(),
                MAX_GROUP_MEMBERS,
                "domains in groups",
                &gpath,
                issues,
            )
        {
            let mut seen = BTreeMap::new();
            for (i, g) in items.iter().enumerate() {
                let p = gpath.index(i);
                if let Some(group) = group_at(g, &p, issues) {
                    if let Some(first) = seen.insert(group.name.clone(), i) {
                        issues.push(
                            &p.key("name"),
                            format!(
                                "duplicate group {:?} (first at groups[{first}])",
                                group.name
                            ),
                        );
                    }
                    groups.push(group);
                }
            }
        }
    }
    (issues.len() == before).then(|| {
        let mut r = CopyResource::new(
            domain_limit.unwrap_or_default(),
            global_limit,
            domains,
            groups,
        );
        r.queue_limit = queue_limit.unwrap_or(crate::copy::DEFAULT_QUEUE_LIMIT);
        r.wait_mode = wait_mode.unwrap_or_default();
        r
    })
}

fn group_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Group> {
    let map = object(v, path, issues, "a group", &["name", "limit", "domains"])?;
    let name = required(map, "name", path, issues)
        .and_then(|v| name(v, &path.key("name"), issues, "group name"));
    let limit =
        required(map, "limit", path, issues).and_then(|v| count(v, &path.key("limit"), issues));
    let mut domains = Vec::new();
    let mut seen = BTreeSet::new();
    if let Some(v) = map.get("domains").filter(|v| !v.is_null()) {
        let dpath = path.key("domains");
        for (i, d) in list(v, &dpath, issues)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if let Some(d) = self::name(d, &dpath.index(i), issues, "domain") {
                if seen.insert(d.clone()) {
                    domains.push(d);
                } else {
                    issues.push(&dpath.index(i), format!("duplicate domain {d:?}"));
                }
            }
        }
    }
    Some(Group {
        name: name?,
        limit: limit?,
        domains,
    })
}
