//! What the audit trail records of a commit: the whole configuration as
//! normalized YAML (the form `GET /v1/config?format=yaml` exports and
//! rollback imports) and a unified diff of it, before → after.

use std::collections::BTreeMap;

use charon_core::config::Config;
use serde_json::{Map, Value, json};

use crate::store::{StoredNamespace, StoredResource};

/// Lines of context around each change in a recorded diff.
const CONTEXT: usize = 3;

/// Builds the configuration from what is stored (validated again: what
/// was stored was valid, so a failure means the database was edited by
/// hand).
pub(crate) fn build(
    resources: BTreeMap<String, StoredResource>,
    namespaces: &BTreeMap<String, StoredNamespace>,
    envoy: Option<Value>,
) -> Result<Config, charon_core::config::ConfigErrors> {
    let nss: Map<String, Value> = namespaces
        .iter()
        .map(|(n, s)| {
            (
                n.clone(),
                json!({
                    "allow_unconfigured": s.settings.allow_unconfigured,
                    "ignore_configured": s.settings.ignore_configured,
                }),
            )
        })
        .collect();
    let docs: Vec<Value> = resources.into_values().map(|r| r.document).collect();
    let mut doc = json!({ "namespaces": nss, "resources": docs });
    if let Some(e) = envoy {
        doc["envoy"] = e;
    }
    Config::from_value(&doc).map(|(config, _)| config)
}

/// A unified diff from `before` to `after` (`a/config.yaml` → `b/…`, with
/// hunk headers), empty when they are equal.
pub(crate) fn unified(before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(CONTEXT)
        .header("a/config.yaml", "b/config.yaml")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_are_unified() {
        let d = unified("a: 1\nb: 2\n", "a: 1\nb: 3\n");
        assert!(
            d.starts_with("--- a/config.yaml\n+++ b/config.yaml\n@@"),
            "{d}"
        );
        assert!(d.contains("\n-b: 2\n+b: 3\n"), "{d}");
        assert_eq!(unified("x\n", "x\n"), "");
    }
}
