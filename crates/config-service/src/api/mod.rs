//! The HTTP JSON API: one module per family of endpoints, the router that
//! joins them, and what they share (ETags, the `If-Match` check).
//!
//! Resource names contain `/`; in a URL they are one percent-encoded path
//! segment (`/v1/resources/api%2Fsearch`). Domain, group and namespace
//! names in URLs are encoded the same way.

mod audit;
mod changes;
mod config;
mod doc;
pub(crate) mod extract;
mod namespaces;
mod resources;
pub(crate) use charon_config_wire::schema;

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use serde::Serialize;

use crate::AppState;
use crate::auth::Writer;
use crate::error::ApiError;
use crate::store::{Committed, Entity, Meta, ReadTx, WriteTx};
use crate::wire::DeleteCommit;
use extract::IfMatch;
use resources::{Group, Override, Part};

/// The audit trail's name for a commit made without a named token (none
/// is: every write needs a token; kept for safety).
pub(crate) const UNNAMED: &str = "unknown";

/// The largest request body accepted (a whole configuration on import).
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The configuration API as an axum router, ready to serve or to mount in
/// another router (`Router::merge`; `/openapi.json` documents the paths at
/// the root). It sets no router-wide fallback, so merging it never
/// conflicts. It owns `/openapi.json` and `/v1/…`: routes of the host
/// under `/v1/` with a literal first segment (`/v1/simulate`) still win,
/// and any other unknown path under `/v1/` answers a JSON 404 (with a hint
/// when a resource name was not percent-encoded). [`crate::serve`] adds a
/// JSON 404 for everything else.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/openapi.json", get(openapi))
        .route(
            "/v1/resources",
            get(resources::list).post(resources::create),
        )
        .route(
            "/v1/resources/{name}",
            get(resources::get)
                .put(resources::put)
                .delete(resources::delete),
        )
        .merge(part_routes::<Override>())
        .merge(part_routes::<Group>())
        .route(
            "/v1/resources/{name}/groups/{group}/domains/{domain}",
            put(resources::add_member).delete(resources::remove_member),
        )
        .route("/v1/namespaces", get(namespaces::list))
        .route(
            "/v1/namespaces/{namespace}",
            get(namespaces::get)
                .put(namespaces::put)
                .delete(namespaces::delete),
        )
        .route("/v1/config", get(config::export).put(config::import))
        .route("/v1/changes", get(changes::changes))
        .route("/v1/audit", get(audit::list))
        .route("/v1/audit/{version}", get(audit::get))
        .route("/v1/{*rest}", any(not_found))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// The routes of the parts `P` of a resource: all of them (`GET`), one
/// (`GET`, `PUT`, `DELETE`).
fn part_routes<P: Part + 'static>() -> Router<AppState> {
    Router::new()
        .route(P::ALL_PATH, get(resources::list_parts::<P>))
        .route(
            P::ONE_PATH,
            get(resources::get_part::<P>)
                .put(resources::put_part::<P>)
                .delete(resources::delete_part::<P>),
        )
}

/// The OpenAPI document, generated once.
static DOCUMENT: LazyLock<String> = LazyLock::new(doc::json);

/// The OpenAPI document as JSON text (see [`crate::openapi_json`]).
pub(crate) fn openapi_json() -> &'static str {
    &DOCUMENT
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "meta",
    security(()),
    responses((status = 200, description = "The OpenAPI document.", body = Object)))]
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

pub(crate) async fn not_found(uri: Uri) -> ApiError {
    let hint = if uri.path().starts_with("/v1/resources/") {
        " (a resource name contains '/': send it percent-encoded as one path segment, \
         e.g. /v1/resources/api%2Fsearch)"
    } else {
        ""
    };
    ApiError::not_found(format!("no such endpoint: {}{hint}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Starts a read: the transaction and the version (and epoch) it reads.
async fn snapshot(state: &AppState) -> Result<(ReadTx, Meta), ApiError> {
    let mut tx = state.db().read().await?;
    let meta = tx.meta().await?;
    Ok((tx, meta))
}

/// A read as an extractor: the transaction and the version it reads.
/// Handlers take it after [`crate::auth::Reader`] and the URL's
/// extractors, so the database is opened for well-formed, allowed
/// requests only.
struct Snapshot(ReadTx, Meta);

impl FromRequestParts<AppState> for Snapshot {
    type Rejection = ApiError;

    async fn from_request_parts(_: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let (tx, meta) = snapshot(state).await?;
        Ok(Snapshot(tx, meta))
    }
}

/// A write, as an extractor: the request may write (checked before
/// anything else is looked at, so an anonymous client learns nothing about
/// the request) and the version it is based on (`If-Match`).
struct Editor {
    state: AppState,
    if_match: Option<IfMatch>,
    /// The name of the write token, for the audit trail.
    token: Arc<str>,
}

impl FromRequestParts<AppState> for Editor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let crate::auth::Allowed(token) = Writer::from_request_parts(parts, state).await?;
        Ok(Editor {
            state: state.clone(),
            if_match: IfMatch::from_headers(&parts.headers)?,
            token: token.unwrap_or_else(|| Arc::from(UNNAMED)),
        })
    }
}

impl Editor {
    /// Starts the commit: takes the write lock.
    async fn begin(&self) -> Result<WriteTx, ApiError> {
        Ok(self.state.db().write(&self.token).await?)
    }

    /// Checks `If-Match` against `target`, inside the commit.
    async fn check(&self, tx: &mut WriteTx, target: Target<'_>) -> Result<(), ApiError> {
        precondition(tx, self.if_match.as_ref(), target).await
    }
}

/// The `ETag` of everything read at (or written as) `version`.
fn etag(version: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// A JSON answer (200) carrying the version in `ETag`.
fn versioned<T: Serialize>(version: u64, body: &T) -> Response {
    let mut response = axum::Json(body).into_response();
    response.headers_mut().insert(header::ETAG, etag(version));
    response
}

/// The answer to a write: 201 when it created its target, 200 otherwise,
/// with the version in `ETag`.
fn written<T: Serialize>(created: bool, version: u64, body: &T) -> Response {
    let mut response = versioned(version, body);
    if created {
        *response.status_mut() = StatusCode::CREATED;
    }
    response
}

/// The answer to a delete: what it committed, the version in `ETag`.
fn deleted(committed: Committed) -> Response {
    let Committed { version, changed } = committed;
    versioned(version, &DeleteCommit { version, changed })
}

/// What an `If-Match` is checked against.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    /// The whole configuration: any commit after the version conflicts.
    Whole,
    /// One entity (a resource with its overrides and groups, or a
    /// namespace), with the version that last changed it if it exists.
    Entity(Entity, &'a str, Option<u64>),
}

/// Checks `If-Match` inside the write transaction (after the write lock
/// is taken, so no other commit can slip in between).
///
/// A version V matches when the target has not changed after V: two
/// operators editing different resources do not conflict, two editing the
/// same one do. For the whole configuration any later commit conflicts.
async fn precondition(
    tx: &mut WriteTx,
    if_match: Option<&IfMatch>,
    target: Target<'_>,
) -> Result<(), ApiError> {
    let current = tx.base;
    let what = match target {
        Target::Whole => "the configuration".to_owned(),
        Target::Entity(Entity::Resource, name, _) => format!("resource {name:?}"),
        Target::Entity(Entity::Namespace, name, _) => format!("namespace {name:?}"),
        Target::Entity(Entity::Envoy, _, _) => "the envoy: section".to_owned(),
    };
    let versions = match if_match {
        None => return Ok(()),
        Some(IfMatch::Exists) => match target {
            Target::Entity(_, _, None) => {
                return Err(ApiError::version_conflict(
                    format!("If-Match: * but {what} does not exist"),
                    current,
                ));
            }
            _ => return Ok(()),
        },
        Some(IfMatch::Versions(v)) => v,
    };
    for &v in versions {
        if v > current {
            continue;
        }
        let unchanged = match target {
            Target::Whole => v == current,
            Target::Entity(_, _, Some(updated)) => updated <= v,
            Target::Entity(entity, name, None) => {
                v >= tx.history_floor() && !tx.changed_after(entity, name, v).await?
            }
        };
        if unchanged {
            return Ok(());
        }
    }
    let based_on = versions
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Err(ApiError::version_conflict(
        format!(
            "{what} changed after version {based_on} (the configuration is at version {current}); \
             read it again and reapply your change"
        ),
        current,
    ))
}
