//! `/v1/namespaces…`: the switches of SPEC §4 per namespace.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use charon_core::config::{Config, parse_namespace};
use serde::Deserialize;
use serde_json::json;

use super::extract::{IfMatch, JsonBody, UrlParams};
use super::{Target, precondition, versioned};
use crate::AppState;
use crate::auth::{Reader, Writer};
use crate::error::ApiError;
use crate::store::Entity;
use crate::wire::{DeleteCommit, NamespaceBody, NamespaceCommit, NamespaceList, Problem};

#[derive(Debug, Deserialize)]
pub(super) struct NamespaceParam {
    namespace: String,
}

fn missing(ns: &str) -> ApiError {
    ApiError::not_found(format!("no settings for namespace {ns:?}"))
}

pub(super) async fn list(_: Reader, State(state): State<AppState>) -> Result<Response, ApiError> {
    let mut tx = state.db().read().await?;
    let version = tx.meta().await?.version;
    let namespaces = tx
        .namespaces()
        .await?
        .into_iter()
        .map(|(n, s)| (n, NamespaceBody::from(s.settings)))
        .collect();
    Ok(versioned(
        StatusCode::OK,
        version,
        &NamespaceList {
            version,
            namespaces,
        },
    ))
}

pub(super) async fn get(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NamespaceParam>,
) -> Result<Response, ApiError> {
    let mut tx = state.db().read().await?;
    let version = tx.meta().await?.version;
    let ns = tx
        .namespace(&p.namespace)
        .await?
        .ok_or_else(|| missing(&p.namespace))?;
    Ok(versioned(
        StatusCode::OK,
        version,
        &NamespaceBody::from(ns.settings),
    ))
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
    precondition(
        &mut tx,
        if_match.as_ref(),
        Target::Entity(
            Entity::Namespace,
            &p.namespace,
            current.map(|c| c.updated_version),
        ),
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
    let status = if current.is_none() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(versioned(
        status,
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
    precondition(
        &mut tx,
        if_match.as_ref(),
        Target::Entity(
            Entity::Namespace,
            &p.namespace,
            Some(current.updated_version),
        ),
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
        StatusCode::OK,
        committed.version,
        &DeleteCommit {
            version: committed.version,
            changed: committed.changed,
        },
    ))
}
