//! `/v1/resources…`: resources, their per-domain overrides, their groups
//! and group membership. Every write edits the resource's JSON document
//! and has charon-core validate and normalize the whole resource before
//! anything is stored.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use charon_core::config::namespace_of;
use charon_core::request::check_name;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::extract::{IfMatch, JsonBody, QueryParams, UrlParams};
use super::{Target, precondition, versioned};
use crate::AppState;
use crate::auth::{Reader, Writer};
use crate::edit::{self, Normalized, normalize_resource, remap, with_name};
use crate::error::ApiError;
use crate::store::Entity;
use crate::wire::{DeleteCommit, ResourceCommit, ResourceList};

#[derive(Debug, Deserialize)]
pub(super) struct NameParam {
    name: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct DomainParams {
    name: String,
    domain: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct GroupParams {
    name: String,
    group: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct MemberParams {
    name: String,
    group: String,
    domain: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    namespace: Option<String>,
}

/// `GET /v1/resources/{name}/domains`.
#[derive(Debug, Serialize)]
struct OverrideList {
    version: u64,
    domains: Map<String, Value>,
}

/// `GET /v1/resources/{name}/groups`.
#[derive(Debug, Serialize)]
struct GroupList {
    version: u64,
    groups: Vec<Value>,
}

/// What a write does to the stored resource.
enum Edit {
    /// Store this document (already validated and normalized). `created`:
    /// the target of the request (the resource, override or group) did
    /// not exist before.
    Put {
        normalized: Normalized,
        created: bool,
    },
    /// Delete the resource.
    Delete,
}

fn missing(name: &str) -> ApiError {
    ApiError::not_found(format!("no resource {name:?}"))
}

/// One commit to one resource: takes the write lock, applies `change` to
/// the resource's current document (validating it), checks `If-Match`
/// against the resource, and stores the result if it differs.
async fn edit(
    state: &AppState,
    name: &str,
    if_match: Option<IfMatch>,
    change: impl FnOnce(Option<&Value>) -> Result<Edit, ApiError>,
) -> Result<Response, ApiError> {
    let mut tx = state.db().write().await?;
    let current = tx.resource(name).await?;
    let updated = current.as_ref().map(|r| r.updated_version);
    let current = current.map(|r| r.document);
    // What is wrong with the request itself (400, 404, 422) is answered
    // before the precondition: a bad request stays bad at any version.
    let edit = change(current.as_ref())?;
    precondition(
        &mut tx,
        if_match.as_ref(),
        Target::Entity(Entity::Resource, name, updated),
    )
    .await?;
    match edit {
        Edit::Put {
            normalized,
            created,
        } => {
            let differs = current.as_ref() != Some(&normalized.document);
            if differs {
                tx.put_resource(name, normalized.kind, &normalized.document)
                    .await?;
            }
            let committed = tx.commit().await?;
            if committed.changed {
                tracing::info!(
                    resource = name,
                    version = committed.version,
                    "resource stored"
                );
            }
            let status = if created && committed.changed {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(versioned(
                status,
                committed.version,
                &ResourceCommit {
                    version: committed.version,
                    changed: committed.changed,
                    resource: normalized.document,
                    adjustments: normalized.adjustments,
                },
            ))
        }
        Edit::Delete => {
            if !tx.delete_resource(name).await? {
                return Err(missing(name));
            }
            let committed = tx.commit().await?;
            tracing::info!(
                resource = name,
                version = committed.version,
                "resource deleted"
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
    }
}

/// Reads one resource's document and the version it was read at.
async fn read_resource(state: &AppState, name: &str) -> Result<(u64, Value), ApiError> {
    let mut tx = state.db().read().await?;
    let version = tx.meta().await?.version;
    let resource = tx.resource(name).await?.ok_or_else(|| missing(name))?;
    Ok((version, resource.document))
}

fn require_copy(doc: &Value, name: &str) -> Result<(), ApiError> {
    if doc.get("kind").and_then(Value::as_str) == Some("copy") {
        Ok(())
    } else {
        Err(ApiError::wrong_kind(format!(
            "resource {name:?} is rate-limited; groups belong to copy-limited resources"
        )))
    }
}

/// Validates an edited document; core's problems re-pathed under `prefix`.
fn validate(doc: &Value, prefix: &str, whole: &str) -> Result<Normalized, ApiError> {
    normalize_resource(doc).map_err(|e| ApiError::invalid(remap(e, prefix, whole)))
}

fn check_domain(domain: &str) -> Result<(), ApiError> {
    check_name("domain", domain).map_err(|e| ApiError::invalid_at("domain", e.to_string()))
}

// ---- resources ----

pub(super) async fn list(
    _: Reader,
    State(state): State<AppState>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let mut tx = state.db().read().await?;
    let version = tx.meta().await?.version;
    let resources = tx
        .resources()
        .await?
        .into_iter()
        .filter(|(name, _)| {
            q.namespace
                .as_deref()
                .is_none_or(|ns| namespace_of(name) == ns)
        })
        .map(|(_, r)| r.document)
        .collect();
    Ok(versioned(
        StatusCode::OK,
        version,
        &ResourceList { version, resources },
    ))
}

pub(super) async fn get(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NameParam>,
) -> Result<Response, ApiError> {
    let (version, doc) = read_resource(&state, &p.name).await?;
    Ok(versioned(StatusCode::OK, version, &doc))
}

/// `POST /v1/resources`: creates a resource named by its body; 409 if it
/// exists.
pub(super) async fn create(
    _: Writer,
    State(state): State<AppState>,
    if_match: Option<IfMatch>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let normalized = normalize_resource(&body).map_err(ApiError::config)?;
    let name = normalized.document["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    edit(&state, &name, if_match, |current| {
        if current.is_some() {
            return Err(ApiError::already_exists(format!(
                "resource {name:?} exists; PUT /v1/resources/{{name}} replaces it"
            )));
        }
        Ok(Edit::Put {
            normalized,
            created: true,
        })
    })
    .await
}

/// `PUT /v1/resources/{name}`: creates or replaces a resource.
pub(super) async fn put(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NameParam>,
    if_match: Option<IfMatch>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let body = with_name(body, &p.name, "resource").map_err(|e| ApiError::invalid(vec![e]))?;
    let normalized = normalize_resource(&body).map_err(ApiError::config)?;
    edit(&state, &p.name, if_match, |current| {
        Ok(Edit::Put {
            normalized,
            created: current.is_none(),
        })
    })
    .await
}

pub(super) async fn delete(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NameParam>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    edit(&state, &p.name, if_match, |current| {
        current.ok_or_else(|| missing(&p.name))?;
        Ok(Edit::Delete)
    })
    .await
}

// ---- per-domain overrides ----

pub(super) async fn list_overrides(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NameParam>,
) -> Result<Response, ApiError> {
    let (version, doc) = read_resource(&state, &p.name).await?;
    let domains = doc
        .get("domains")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Ok(versioned(
        StatusCode::OK,
        version,
        &OverrideList { version, domains },
    ))
}

pub(super) async fn get_override(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<DomainParams>,
) -> Result<Response, ApiError> {
    let (version, doc) = read_resource(&state, &p.name).await?;
    let o = edit::get_override(&doc, &p.domain).ok_or_else(|| {
        ApiError::not_found(format!(
            "resource {:?} has no override for domain {:?}",
            p.name, p.domain
        ))
    })?;
    Ok(versioned(StatusCode::OK, version, o))
}

/// `PUT …/domains/{domain}`: the body is the override (rate: `hard_limit`
/// and/or `tiers`; copy: `domain_limit`), problems relative to it.
pub(super) async fn put_override(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<DomainParams>,
    if_match: Option<IfMatch>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    check_domain(&p.domain)?;
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        let created = edit::get_override(doc, &p.domain).is_none();
        let (doc, prefix) = edit::set_override(doc, &p.domain, body);
        Ok(Edit::Put {
            normalized: validate(&doc, &prefix, "")?,
            created,
        })
    })
    .await
}

pub(super) async fn delete_override(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<DomainParams>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        let doc = edit::remove_override(doc, &p.domain).ok_or_else(|| {
            ApiError::not_found(format!(
                "resource {:?} has no override for domain {:?}",
                p.name, p.domain
            ))
        })?;
        Ok(Edit::Put {
            normalized: validate(&doc, "", "")?,
            created: false,
        })
    })
    .await
}

// ---- groups and membership (copy-limited resources) ----

fn no_group(name: &str, group: &str) -> ApiError {
    ApiError::not_found(format!("resource {name:?} has no group {group:?}"))
}

pub(super) async fn list_groups(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<NameParam>,
) -> Result<Response, ApiError> {
    let (version, doc) = read_resource(&state, &p.name).await?;
    require_copy(&doc, &p.name)?;
    Ok(versioned(
        StatusCode::OK,
        version,
        &GroupList {
            version,
            groups: edit::groups(&doc),
        },
    ))
}

pub(super) async fn get_group(
    _: Reader,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<GroupParams>,
) -> Result<Response, ApiError> {
    let (version, doc) = read_resource(&state, &p.name).await?;
    require_copy(&doc, &p.name)?;
    let i = edit::group_index(&doc, &p.group).ok_or_else(|| no_group(&p.name, &p.group))?;
    Ok(versioned(StatusCode::OK, version, &edit::groups(&doc)[i]))
}

/// `PUT …/groups/{group}`: body `{limit, domains}` (a `name`, if sent,
/// must be the group's); replaces the group in place or appends it.
pub(super) async fn put_group(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<GroupParams>,
    if_match: Option<IfMatch>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let body = with_name(body, &p.group, "group").map_err(|e| ApiError::invalid(vec![e]))?;
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        require_copy(doc, &p.name)?;
        let created = edit::group_index(doc, &p.group).is_none();
        let (doc, prefix) = edit::set_group(doc, &p.group, body);
        Ok(Edit::Put {
            normalized: validate(&doc, &prefix, "")?,
            created,
        })
    })
    .await
}

pub(super) async fn delete_group(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<GroupParams>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        require_copy(doc, &p.name)?;
        let doc = edit::remove_group(doc, &p.group).ok_or_else(|| no_group(&p.name, &p.group))?;
        Ok(Edit::Put {
            normalized: validate(&doc, "", "")?,
            created: false,
        })
    })
    .await
}

/// `PUT …/groups/{group}/domains/{domain}`: adds a member (no body).
pub(super) async fn add_member(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<MemberParams>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    check_domain(&p.domain)?;
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        require_copy(doc, &p.name)?;
        let i = edit::group_index(doc, &p.group).ok_or_else(|| no_group(&p.name, &p.group))?;
        Ok(match edit::add_member(doc, i, &p.domain) {
            Some((doc, path)) => Edit::Put {
                normalized: validate(&doc, &path, "domain")?,
                created: true,
            },
            // Already a member: nothing to commit.
            None => Edit::Put {
                normalized: validate(doc, "", "")?,
                created: false,
            },
        })
    })
    .await
}

pub(super) async fn remove_member(
    _: Writer,
    State(state): State<AppState>,
    UrlParams(p): UrlParams<MemberParams>,
    if_match: Option<IfMatch>,
) -> Result<Response, ApiError> {
    edit(&state, &p.name, if_match, |current| {
        let doc = current.ok_or_else(|| missing(&p.name))?;
        require_copy(doc, &p.name)?;
        let i = edit::group_index(doc, &p.group).ok_or_else(|| no_group(&p.name, &p.group))?;
        let doc = edit::remove_member(doc, i, &p.domain).ok_or_else(|| {
            ApiError::not_found(format!(
                "domain {:?} is not a member of group {:?} of resource {:?}",
                p.domain, p.group, p.name
            ))
        })?;
        Ok(Edit::Put {
            normalized: validate(&doc, "", "")?,
            created: false,
        })
    })
    .await
}
