//! The configuration assembled from the stored rows: what the audit trail
//! records of each commit (as normalized YAML), what `GET /v1/config`
//! exports and what a commit checks before it is written.

use std::collections::BTreeMap;

use charon_core::config::Config;
use serde_json::{Map, Value, json};

use super::{StoredNamespace, StoredResource};

/// Builds the configuration from what is stored (validated again: what
/// was stored was valid, so a failure means the database was edited by
/// hand).
pub(crate) fn assemble(
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
