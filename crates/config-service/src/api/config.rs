//! `/v1/config`: the whole configuration in the SPEC §6 layout. Export as
//! JSON or YAML; import (replace everything) as one commit, with the
//! difference computed here and a dry run that only shows it.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use charon_core::config::{Config, NamespaceSettings};
use serde::Deserialize;
use serde_json::Value;

use super::extract::{IfMatch, QueryParams, RawBody};
use super::schema::{ConfigDocument, ExportFormat};
use super::{Target, etag, precondition, snapshot, versioned};
use crate::AppState;
use crate::auth::{Access, Reader, Role};
use crate::error::ApiError;
use crate::store::{self, ConfigDbError, ENVOY, Meta, StoredNamespace, StoredResource, WriteTx};
use crate::wire::{DiffEntry, ExportedConfig, ImportOutcome, NamespaceBody};

#[derive(Debug, Deserialize)]
pub(super) struct ExportQuery {
    /// `json` (default) or `yaml`.
    format: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ImportQuery {
    /// Only compute and return the difference.
    #[serde(default)]
    dry_run: bool,
}

/// Media types read as YAML (JSON is YAML too, but is parsed as JSON when
/// it says so, for exact error messages).
const YAML_TYPES: &[&str] = &[
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
    "text/x-yaml",
    "text/plain",
];

fn wants_yaml(q: &ExportQuery, headers: &HeaderMap) -> Result<bool, ApiError> {
    match q.format.as_deref() {
        Some("yaml") => Ok(true),
        Some("json") => Ok(false),
        Some(other) => Err(ApiError::invalid_at(
            "format",
            format!("unknown format {other:?}; expected json or yaml"),
        )),
        None => {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            Ok(accept.contains("yaml") && !accept.contains("application/json"))
        }
    }
}

/// Builds the configuration from what is stored (validated again: what
/// was stored was valid, so a failure here means the database was edited
/// by hand).
fn assemble(
    resources: BTreeMap<String, StoredResource>,
    namespaces: &BTreeMap<String, StoredNamespace>,
    envoy: Option<Value>,
) -> Result<Config, ApiError> {
    store::assemble(resources, namespaces, envoy)
        .map_err(|e| ApiError::from(ConfigDbError::Corrupt(e.to_string())))
}

/// Checks, inside a write, that the stored `envoy:` section still holds
/// with the resources as this write leaves them (a node may name a
/// resource that was deleted, renamed, or made copy-limited). The problems
/// keep their paths in the section (`envoy.domains[0].descriptors[1].resource`),
/// so the client sees which node stands in the way.
pub(super) async fn check_envoy(tx: &mut WriteTx) -> Result<(), ApiError> {
    let Some(envoy) = tx.envoy().await? else {
        return Ok(());
    };
    let resources = tx.resources().await?;
    let namespaces = tx.namespaces().await?;
    store::assemble(resources, &namespaces, Some(envoy))
        .map(|_| ())
        .map_err(ApiError::config)
}

/// The whole configuration (SPEC §6), as JSON or, with `format=yaml` or
/// `Accept: application/yaml`, YAML.
#[utoipa::path(get, path = "/v1/config", operation_id = "exportConfig", tag = "config",
    params(("format" = inline(Option<ExportFormat>), Query)),
    responses((status = 200, description = "The configuration.", content(
        (ExportedConfig = "application/json"), (ExportedConfig = "application/yaml")))))]
pub(super) async fn export(
    _: Reader,
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(q): QueryParams<ExportQuery>,
) -> Result<Response, ApiError> {
    let yaml = wants_yaml(&q, &headers)?;
    let (mut tx, Meta { version, .. }) = snapshot(&state).await?;
    let resources = tx.resources().await?;
    let namespaces = tx.namespaces().await?;
    let envoy = tx.envoy().await?;
    let config = assemble(resources, &namespaces, envoy)?;
    if yaml {
        let mut response = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/yaml")],
            config.to_yaml(),
        )
            .into_response();
        response.headers_mut().insert(header::ETAG, etag(version));
        Ok(response)
    } else {
        Ok(versioned(version, &config.to_value()))
    }
}

/// Parses an imported document with charon-core: every problem, with its
/// path in the document.
fn parse_import(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Config, Vec<charon_core::config::Adjustment>), ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::invalid_at("", "the body is not UTF-8 text"))?;
    if text.trim().is_empty() {
        return Err(ApiError::invalid_at(
            "",
            "the body is empty; to remove every resource, import `resources: []`",
        ));
    }
    let essence = headers
        .get(header::CONTENT_TYPE)
        .map(|v| {
            v.to_str()
                .map(|s| {
                    s.split(';')
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_ascii_lowercase()
                })
                .map_err(|_| ApiError::unsupported_media_type("unreadable Content-Type"))
        })
        .transpose()?;
    let parsed = match essence.as_deref() {
        Some("application/json") => {
            let value: Value = serde_json::from_str(text).map_err(|e| {
                ApiError::invalid_at("", format!("the body is not valid JSON: {e}"))
            })?;
            Config::from_value(&value)
        }
        None => Config::from_yaml(text),
        Some(t) if YAML_TYPES.contains(&t) => Config::from_yaml(text),
        Some(t) => {
            return Err(ApiError::unsupported_media_type(format!(
                "cannot import {t}; send application/yaml or application/json"
            )));
        }
    };
    parsed.map_err(ApiError::config)
}

/// What the imported configuration holds, by name.
struct Wanted {
    resources: BTreeMap<String, Value>,
    namespaces: BTreeMap<String, NamespaceSettings>,
    /// The `envoy:` section's normalized document; `None`: no section.
    envoy: Option<Value>,
}

impl Wanted {
    fn of(config: &Config) -> Self {
        let mut resources = BTreeMap::new();
        let mut envoy = None;
        if let Value::Object(mut root) = config.to_value() {
            if let Some(Value::Array(docs)) = root.remove("resources") {
                for doc in docs {
                    let name = doc["name"].as_str().unwrap_or_default().to_owned();
                    resources.insert(name, doc);
                }
            }
            envoy = root.remove("envoy");
        }
        Self {
            resources,
            namespaces: config.namespaces().clone(),
            envoy,
        }
    }
}

fn entry(kind: &str, name: &str, before: Option<Value>, after: Option<Value>) -> DiffEntry {
    let op = match (&before, &after) {
        (None, _) => "add",
        (_, None) => "remove",
        _ => "change",
    };
    DiffEntry {
        kind: kind.to_owned(),
        name: name.to_owned(),
        op: op.to_owned(),
        before,
        after,
    }
}

fn settings_value(s: NamespaceSettings) -> Value {
    serde_json::to_value(NamespaceBody::from(s)).unwrap_or(Value::Null)
}

/// The difference from what is stored to what is wanted: namespaces, then
/// resources, each by name, then the `envoy:` section (one entry, kind
/// and name `envoy`).
fn diff(
    resources: &BTreeMap<String, StoredResource>,
    namespaces: &BTreeMap<String, StoredNamespace>,
    envoy: Option<&Value>,
    wanted: &Wanted,
) -> Vec<DiffEntry> {
    let mut out = Vec::new();
    let names: BTreeSet<&String> = namespaces.keys().chain(wanted.namespaces.keys()).collect();
    for name in names {
        let before = namespaces.get(name).map(|s| s.settings);
        let after = wanted.namespaces.get(name).copied();
        if before != after {
            out.push(entry(
                "namespace",
                name,
                before.map(settings_value),
                after.map(settings_value),
            ));
        }
    }
    let names: BTreeSet<&String> = resources.keys().chain(wanted.resources.keys()).collect();
    for name in names {
        let before = resources.get(name).map(|r| &r.document);
        let after = wanted.resources.get(name);
        if before != after {
            out.push(entry("resource", name, before.cloned(), after.cloned()));
        }
    }
    if envoy != wanted.envoy.as_ref() {
        out.push(entry(ENVOY, ENVOY, envoy.cloned(), wanted.envoy.clone()));
    }
    out
}

/// Replace the whole configuration as one commit; `dry_run=true` only computes
/// the difference (and needs only read access).
#[utoipa::path(put, path = "/v1/config", operation_id = "importConfig", tag = "config",
    description = "A write needs a write token; a dry run is a read. The difference is computed \
        on the server, by resource and namespace name. With `If-Match` set to the \
        `base_version` of a dry run, exactly the difference shown is applied, or 412.",
    params(("dry_run" = Option<bool>, Query)),
    request_body(content((ConfigDocument = "application/yaml"),
        (ConfigDocument = "application/json"))),
    security(("bearerAuth" = []), ()),
    responses((status = 200, description = "The difference, applied unless a dry run.",
        body = ImportOutcome)))]
pub(super) async fn import(
    access: Access,
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(q): QueryParams<ImportQuery>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    // A dry run changes nothing: reading is enough.
    access.require(if q.dry_run { Role::Read } else { Role::Write })?;
    let if_match = IfMatch::from_headers(&headers)?;
    let (config, adjustments) = parse_import(&headers, &body)?;
    let wanted = Wanted::of(&config);

    if q.dry_run {
        let (mut tx, Meta { version, .. }) = snapshot(&state).await?;
        if let Some(IfMatch::Versions(vs)) = &if_match
            && !vs.contains(&version)
        {
            return Err(ApiError::version_conflict(
                format!("the configuration is at version {version}"),
                version,
            ));
        }
        let resources = tx.resources().await?;
        let namespaces = tx.namespaces().await?;
        let envoy = tx.envoy().await?;
        let diff = diff(&resources, &namespaces, envoy.as_ref(), &wanted);
        let outcome = ImportOutcome {
            dry_run: true,
            changed: !diff.is_empty(),
            base_version: version,
            version,
            diff,
            adjustments,
        };
        return Ok(versioned(version, &outcome));
    }

    let token = access.token_name();
    let mut tx = state
        .db()
        .write(token.as_deref().unwrap_or(super::UNNAMED))
        .await?;
    precondition(&mut tx, if_match.as_ref(), Target::Whole).await?;
    let base = tx.base;
    let resources = tx.resources().await?;
    let namespaces = tx.namespaces().await?;
    let envoy = tx.envoy().await?;
    let diff = diff(&resources, &namespaces, envoy.as_ref(), &wanted);
    for e in &diff {
        match (e.kind.as_str(), &e.after) {
            (ENVOY, after) => {
                tx.set_envoy(after.as_ref()).await?;
            }
            ("namespace", Some(_)) => {
                let settings = wanted.namespaces.get(&e.name).copied();
                tx.put_namespace(&e.name, settings.unwrap_or_default())
                    .await?;
            }
            ("namespace", None) => {
                tx.delete_namespace(&e.name).await?;
            }
            (_, Some(doc)) => {
                let kind = doc["kind"].as_str().unwrap_or("rate");
                tx.put_resource(&e.name, kind, doc).await?;
            }
            (_, None) => {
                tx.delete_resource(&e.name).await?;
            }
        }
    }
    let committed = tx.commit().await?;
    if committed.changed {
        tracing::info!(
            version = committed.version,
            changes = diff.len(),
            "configuration imported"
        );
    }
    let outcome = ImportOutcome {
        dry_run: false,
        changed: committed.changed,
        base_version: base,
        version: committed.version,
        diff,
        adjustments,
    };
    Ok(versioned(committed.version, &outcome))
}
