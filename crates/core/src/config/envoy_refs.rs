//! The `envoy:` section held to the resources (see
//! [`Config::with_envoy`](super::Config::with_envoy)): each node's or limit's action names a
//! configured rate-like resource, or derives a name no resource has.

use std::collections::HashMap;

use super::{Resource, ResourceKind};
use crate::envoy::{Action, Node};
use crate::fields::{ConfigIssue, Path};

/// Checks what a descriptor node refers to (see [`Config::with_envoy`](super::Config::with_envoy)),
/// and its children's; the tree's depth is bounded by the parser.
pub(super) fn check_node(
    node: &Node,
    path: &Path,
    resources: &[Resource],
    index: &HashMap<String, usize>,
    issues: &mut Vec<ConfigIssue>,
) {
    if let Some(a) = node.action() {
        check_action(a, node.id(), path, resources, index, issues);
    }
    let children = path.key("descriptors");
    for (j, c) in node.descriptors().iter().enumerate() {
        check_node(c, &children.index(j), resources, index, issues);
    }
}

/// Checks the action of a node or limit whose derived name is `id`: a
/// configured resource must exist and be rate-like; an inline limit's
/// derived name must be a valid resource name no configured resource has.
pub(super) fn check_action(
    action: &Action,
    id: &str,
    path: &Path,
    resources: &[Resource],
    index: &HashMap<String, usize>,
    issues: &mut Vec<ConfigIssue>,
) {
    let mut push = |at: Path, message: String| {
        issues.push(ConfigIssue {
            path: at.as_str().to_owned(),
            message,
        });
    };
    match action {
        Action::Resource(name) => match index.get(name).map(|&i| &resources[i].kind) {
            None => push(
                path.key("resource"),
                format!("unknown resource {name:?} (name a resource of this configuration)"),
            ),
            Some(kind @ (ResourceKind::Copy(_) | ResourceKind::Lease(_))) => push(
                path.key("resource"),
                format!(
                    "resource {name:?} is {}; an Envoy descriptor needs a rate-like \
                     one (rate, bucket, window or queue)",
                    if kind.name() == "copy" {
                        "copy-limited"
                    } else {
                        "a capacity lease"
                    }
                ),
            ),
            Some(_) => {}
        },
        Action::RateLimit(_) => {
            if let Err(e) = crate::request::check_name("resource", id) {
                push(
                    path.key("rate_limit"),
                    format!(
                        "its resource name, derived from the domain, keys and values on its \
                         path, cannot be used: {e}"
                    ),
                );
            } else if let Some(&i) = index.get(id) {
                push(
                    path.key("rate_limit"),
                    format!(
                        "its resource name {id:?} is also the name of resources[{i}]; the two \
                         would share counts, so rename that resource"
                    ),
                );
            }
        }
        Action::Unlimited => {}
    }
}
