//! `/v1/namespaces…`: the switches of SPEC §4 per namespace.

use axum::extract::State;
use axum::response::Response;
use charon_core::config::{Config, parse_namespace};
use serde::Deserialize;
use serde_json::json;

use super::extract::{IfMatch, JsonBody, UrlParams};
use super::{Snapshot, Target, precondition, versioned, written};
use crate::AppState;
use crate::auth::{Reader, Writer};
use crate::error::ApiError;
use crate::store::{Entity, Meta, WriteTx};
use crate::wire::{DeleteCommit, NamespaceBody, NamespaceCommit, NamespaceList, Problem};

#[derive(Debug, Deserialize)]
pub(super) struct NamespaceParam {
    namespace: String,
}

fn missing(ns: &str) -> ApiError {
    ApiError::not_found(format!("no settings for namespace {ns:?}"))
}

/// Checks `If-Match` against the namespace (`updated`: the version that
/// last changed it, if it exists).
async fn unchanged_since(
    tx: &mut WriteTx,
    if_match: Option<IfMatch>,
    namespace: &str,
    updated: Option<u64>,
) -> Result<(), ApiError> {
    let target = Target::Entity(Entity::Namespace, namespace, updated);
    precondition(tx, if_match.as_ref(), target).await
}

pub(super) async fn list(
    _: Reader,
    Snapshot(mut tx, Meta { version, .. }): Snapshot,
) -> Result<Response, ApiError> {
    let namespaces = tx
        .namespaces()
        .await?
        .into_iter()
        .map(|(n, s)| (n, NamespaceBody::from(s.settings)))
        .collect();
    Ok(versioned(
        version,
        &NamespaceList {
            version,
            namespaces,
        },
    ))
}

pub(super) async fn get(
    _: Reader,
    UrlParams(p): UrlParams<NamespaceParam>,
    Snapshot(mut tx, Meta { version, .. }): Snapshot,
) -> Result<Response, ApiError> {
    let ns = tx
        .namespace(&p.namespace)
        .await?
        .ok_or_else(|| missing(&p.namespace))?;
    Ok(versioned(version, &NamespaceBody::from(ns.settings)))
}

/// `PUT /v1/namespaces/{namespace}`: body `{allow_unconfigured,
/// ignore_configured}` (each defaults to false).
pub(super) async fn put(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NamespaceParam>,
    if_match: Option<IfMatch>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    // The name is checked by core as a configuration file's namespace key
    // would be; its problems are the URL parameter's.
    let mut problems: Vec<Problem> =
        match Config::from_value(&json!({ "namespaces": { &p.namespace: {} } })) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .map(|i| Problem {
                        path: "namespace".to_owned(),
                        message: i.message,
                    })
                    .collect()
            }
        };
    let settings = match parse_namespace(&body) {
        Ok(s) => Some(s),
        Err(e) => {
            problems.extend(e.0.into_iter().map(|i| Problem {
                path: i.path,
                message: i.message,
            }));
            None
        }
    };
    let Some(settings) = settings.filter(|_| problems.is_empty()) else {
        return Err(ApiError::invalid(problems));
    };
    let mut tx = state.db().write().await?;
    let current = tx.namespace(&p.namespace).await?;
    unchanged_since(
        &mut tx,
        if_match,
        &p.namespace,
        current.map(|c| c.updated_version),
    )
    .await?;
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

pub(super) async fn delete(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NamespaceParam>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    let mut tx = state.db().write().await?;
    let current = tx
        .namespace(&p.namespace)
        .await?
        .ok_or_else(|| missing(&p.namespace))?;
    unchanged_since(
        &mut tx,
        if_match,
        &p.namespace,
        Some(current.updated_version),
    )
    .await?;
    tx.delete_namespace(&p.namespace).await?;
    let committed = tx.commit().await?;
    tracing::info!(
        namespace = p.namespace,
        version = committed.version,
        "namespace deleted"
    );
    Ok(versioned(
        committed.version,
        &DeleteCommit {
            version: committed.version,
            changed: committed.changed,
        },
    ))
}
