//! `/v1/namespaces…`: the switches of SPEC §4 per namespace.

use std::collections::BTreeMap;

use axum::response::Response;
use charon_core::config::{Config, parse_namespace};
use serde::Deserialize;
use serde_json::json;

use super::extract::{JsonBody, UrlParams};
use super::schema::NamespaceSettings;
use super::{Editor, Snapshot, Target, deleted, versioned, written};
use crate::auth::Reader;
use crate::error::ApiError;
use crate::store::{Entity, Meta, ReadTx, StoredNamespace};
use crate::wire::{ConfigIssue, DeleteCommit, NamespaceBody, NamespaceCommit, NamespaceList};

#[derive(Debug, Deserialize)]
pub(super) struct NamespaceParam {
    namespace: String,
}

/// The namespace `ns`, which must exist (404).
async fn existing(tx: &mut ReadTx, ns: &str) -> Result<StoredNamespace, ApiError> {
    tx.namespace(ns)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no settings for namespace {ns:?}")))
}

/// Every namespace's settings, as answered.
pub(super) async fn all(tx: &mut ReadTx) -> Result<BTreeMap<String, NamespaceBody>, ApiError> {
    let stored = tx.namespaces().await?;
    Ok(stored
        .into_iter()
        .map(|(n, s)| (n, s.settings.into()))
        .collect())
}

/// What a write to the namespace `ns` checks `If-Match` against
/// (`updated`: the version that last changed it, if it exists).
fn target(ns: &str, updated: Option<u64>) -> Target<'_> {
    Target::Entity(Entity::Namespace, ns, updated)
}

/// Every namespace with settings.
#[utoipa::path(get, path = "/v1/namespaces", operation_id = "listNamespaces", tag = "namespaces",
    responses((status = 200, description = "OK", body = NamespaceList)))]
pub(super) async fn list(
    _: Reader,
    Snapshot(mut tx, Meta { version, .. }): Snapshot,
) -> Result<Response, ApiError> {
    let namespaces = all(&mut tx).await?;
    Ok(versioned(
        version,
        &NamespaceList {
            version,
            namespaces,
        },
    ))
}

/// The settings of one namespace.
#[utoipa::path(get, path = "/v1/namespaces/{namespace}", operation_id = "getNamespace",
    tag = "namespaces",
    responses((status = 200, description = "OK", body = NamespaceBody), (status = 404)))]
pub(super) async fn get(
    _: Reader,
    UrlParams(p): UrlParams<NamespaceParam>,
    Snapshot(mut tx, Meta { version, .. }): Snapshot,
) -> Result<Response, ApiError> {
    let ns = existing(&mut tx, &p.namespace).await?;
    Ok(versioned(version, &NamespaceBody::from(ns.settings)))
}

/// Create or replace the settings of a namespace.
#[utoipa::path(put, path = "/v1/namespaces/{namespace}", operation_id = "putNamespace",
    tag = "namespaces", request_body = NamespaceSettings,
    responses(
        (status = 200, description = "Replaced, or unchanged.", body = NamespaceCommit),
        (status = 201)))]
pub(super) async fn put(
    editor: Editor,
    UrlParams(p): UrlParams<NamespaceParam>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    // The name is checked by core as a configuration file's namespace key
    // would be; its problems are the URL parameter's.
    let mut problems: Vec<ConfigIssue> =
        match Config::from_value(&json!({ "namespaces": { &p.namespace: {} } })) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .map(|i| ConfigIssue {
                        path: "namespace".to_owned(),
                        message: i.message,
                    })
                    .collect()
            }
        };
    let settings = match parse_namespace(&body) {
        Ok(s) => Some(s),
        Err(e) => {
            problems.extend(e.0);
            None
        }
    };
    let Some(settings) = settings.filter(|_| problems.is_empty()) else {
        return Err(ApiError::invalid(problems));
    };
    let mut tx = editor.begin().await?;
    let current = tx.namespace(&p.namespace).await?;
    let updated = current.map(|c| c.updated_version);
    editor.check(&mut tx, target(&p.namespace, updated)).await?;
    if current.map(|c| c.settings) != Some(settings) {
        tx.put_namespace(&p.namespace, settings).await?;
    }
    let committed = tx.commit().await?;
    if committed.changed {
        tracing::info!(
            namespace = p.namespace,
            version = committed.version,
            "namespace stored"
        );
    }
    Ok(written(
        current.is_none(),
        committed.version,
        &NamespaceCommit {
            version: committed.version,
            changed: committed.changed,
            namespace: p.namespace,
            settings: settings.into(),
        },
    ))
}

/// Remove the settings of a namespace.
#[utoipa::path(delete, path = "/v1/namespaces/{namespace}", operation_id = "deleteNamespace",
    tag = "namespaces",
    responses((status = 200, description = "Removed.", body = DeleteCommit), (status = 404)))]
pub(super) async fn delete(
    editor: Editor,
    UrlParams(p): UrlParams<NamespaceParam>,
) -> Result<Response, ApiError> {
    let mut tx = editor.begin().await?;
    let current = existing(&mut tx, &p.namespace).await?;
    let updated = Some(current.updated_version);
    editor.check(&mut tx, target(&p.namespace, updated)).await?;
    tx.delete_namespace(&p.namespace).await?;
    let committed = tx.commit().await?;
    tracing::info!(
        namespace = p.namespace,
        version = committed.version,
        "namespace deleted"
    );
    Ok(deleted(committed))
}
