//! `/v1/resources…`: resources, their per-domain overrides, their groups
//! and group membership. Every write edits the resource's JSON document
//! and has charon-core validate and normalize the whole resource before
//! anything is stored.

use axum::response::Response;
use charon_core::config::namespace_of;
use charon_core::request::check_name;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::extract::{JsonBody, QueryParams, UrlParams};
use super::schema;
use super::{Editor, Snapshot, Target, deleted, versioned, written};
use crate::auth::Reader;
use crate::edit::{self, Normalized, normalize_resource, remap, with_name};
use crate::error::ApiError;
use crate::store::{Entity, Meta};
use crate::wire::{DeleteCommit, ResourceCommit, ResourceList};

#[derive(Debug, Deserialize)]
pub(super) struct NameParam {
    name: String,
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
pub(super) struct OverrideList {
    version: u64,
    domains: Map<String, Value>,
}

/// `GET /v1/resources/{name}/groups`.
#[derive(Debug, Serialize)]
pub(super) struct GroupList {
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

impl Edit {
    /// Stores `doc` once it validates, core's problems re-pathed under
    /// `prefix` (where the request's body went in the document).
    fn put(doc: &Value, prefix: &str, created: bool) -> Result<Self, ApiError> {
        Ok(Edit::Put {
            normalized: validate(doc, prefix, "")?,
            created,
        })
    }

    /// Stores `doc` once it validates; nothing was created.
    fn replace(doc: &Value) -> Result<Self, ApiError> {
        Self::put(doc, "", false)
    }
}

impl Editor {
    /// One commit to one resource: takes the write lock, applies `change`
    /// to the resource's current document (validating it), checks
    /// `If-Match` against the resource, and stores the result if it
    /// differs.
    async fn commit(
        self,
        name: &str,
        change: impl FnOnce(Option<&Value>) -> Result<Edit, ApiError>,
    ) -> Result<Response, ApiError> {
        edit(&self, name, change).await
    }

    /// [`Editor::commit`] to a resource that must exist.
    async fn existing(
        self,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Edit, ApiError>,
    ) -> Result<Response, ApiError> {
        self.commit(name, |current| {
            change(current.ok_or_else(|| missing(name))?)
        })
        .await
    }

    /// [`Editor::existing`] to a resource that may have parts `P`.
    async fn part<P: Part>(
        self,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Edit, ApiError>,
    ) -> Result<Response, ApiError> {
        if P::COPY_ONLY {
            self.copy(name, change).await
        } else {
            self.existing(name, change).await
        }
    }

    /// [`Editor::existing`] to a copy-limited resource.
    async fn copy(
        self,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Edit, ApiError>,
    ) -> Result<Response, ApiError> {
        self.existing(name, |doc| {
            require_copy(doc, name)?;
            change(doc)
        })
        .await
    }

    /// [`Editor::copy`] of a group that must exist (`change` gets its
    /// index).
    async fn group(
        self,
        name: &str,
        group: &str,
        change: impl FnOnce(&Value, usize) -> Result<Edit, ApiError>,
    ) -> Result<Response, ApiError> {
        self.copy(name, |doc| {
            let i = edit::group_index(doc, group).ok_or_else(|| Group::missing(name, group))?;
            change(doc, i)
        })
        .await
    }
}

/// One commit to one resource: takes the write lock, applies `change` to
/// the resource's current document (validating it), checks `If-Match`
/// against the resource, and stores the result if it differs.
async fn edit(
    editor: &Editor,
    name: &str,
    change: impl FnOnce(Option<&Value>) -> Result<Edit, ApiError>,
) -> Result<Response, ApiError> {
    let mut tx = editor.begin().await?;
    let current = tx.resource(name).await?;
    let updated = current.as_ref().map(|r| r.updated_version);
    let current = current.map(|r| r.document);
    // What is wrong with the request itself (400, 404, 422) is answered
    // before the precondition: a bad request stays bad at any version.
    let edit = change(current.as_ref())?;
    let target = Target::Entity(Entity::Resource, name, updated);
    editor.check(&mut tx, target).await?;
    match edit {
        Edit::Put {
            normalized,
            created,
        } => {
            let differs = current.as_ref() != Some(&normalized.document);
            if differs {
                tx.put_resource(name, normalized.kind, &normalized.document)
                    .await?;
                super::config::check_envoy(&mut tx).await?;
            }
            let committed = tx.commit().await?;
            if committed.changed {
                tracing::info!(
                    resource = name,
                    version = committed.version,
                    "resource stored"
                );
            }
            Ok(written(
                created && committed.changed,
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
            super::config::check_envoy(&mut tx).await?;
            let committed = tx.commit().await?;
            tracing::info!(
                resource = name,
                version = committed.version,
                "resource deleted"
            );
            Ok(deleted(committed))
        }
    }
}

impl Snapshot {
    /// One resource's document and the version it was read at.
    async fn resource(self, name: &str) -> Result<(u64, Value), ApiError> {
        let Snapshot(mut tx, meta) = self;
        let resource = tx.resource(name).await?.ok_or_else(|| missing(name))?;
        Ok((meta.version, resource.document))
    }
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

/// All resources, normalized, sorted by name.
#[utoipa::path(get, path = "/v1/resources", operation_id = "listResources", tag = "resources",
    params(
        ("namespace" = Option<String>, Query, description = "Only resources of this namespace.")),
    responses((status = 200, description = "OK", body = ResourceList)))]
pub(super) async fn list(
    _: Reader,
    QueryParams(q): QueryParams<ListQuery>,
    Snapshot(mut tx, Meta { version, .. }): Snapshot,
) -> Result<Response, ApiError> {
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
    Ok(versioned(version, &ResourceList { version, resources }))
}

/// One resource, normalized.
#[utoipa::path(get, path = "/v1/resources/{name}", operation_id = "getResource", tag = "resources",
    responses((status = 200, description = "OK", body = schema::Resource), (status = 404)))]
pub(super) async fn get(
    _: Reader,
    UrlParams(p): UrlParams<NameParam>,
    snapshot: Snapshot,
) -> Result<Response, ApiError> {
    let (version, doc) = snapshot.resource(&p.name).await?;
    Ok(versioned(version, &doc))
}

/// Create a resource named by its body; 409 if it exists.
#[utoipa::path(post, path = "/v1/resources", operation_id = "createResource", tag = "resources",
    request_body = schema::NewResource,
    responses((status = 201, description = "Created.", body = ResourceCommit), (status = 409)))]
pub(super) async fn create(editor: Editor, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let normalized = normalize_resource(&body).map_err(ApiError::config)?;
    let name = normalized.document["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    editor
        .commit(&name, |current| {
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

/// Create or replace a resource (validated and normalized first).
#[utoipa::path(put, path = "/v1/resources/{name}", operation_id = "putResource", tag = "resources",
    request_body = schema::Resource,
    responses(
        (status = 200, description = "Replaced, or unchanged.", body = ResourceCommit),
        (status = 201)))]
pub(super) async fn put(
    editor: Editor,
    UrlParams(p): UrlParams<NameParam>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let body = with_name(body, &p.name, "resource").map_err(|e| ApiError::invalid(vec![e]))?;
    let normalized = normalize_resource(&body).map_err(ApiError::config)?;
    editor
        .commit(&p.name, |current| {
            Ok(Edit::Put {
                normalized,
                created: current.is_none(),
            })
        })
        .await
}

/// Delete a resource.
#[utoipa::path(delete, path = "/v1/resources/{name}", operation_id = "deleteResource",
    tag = "resources",
    responses((status = 200, description = "Deleted.", body = DeleteCommit), (status = 404)))]
pub(super) async fn delete(
    editor: Editor,
    UrlParams(p): UrlParams<NameParam>,
) -> Result<Response, ApiError> {
    editor.existing(&p.name, |_| Ok(Edit::Delete)).await
}

// ---- per-domain overrides ----

// ---- groups and membership (copy-limited resources) ----

// ---- one override or one group: a part of a resource ----

/// A named part of a resource that the API reads and writes on its own:
/// the override of one domain (`…/domains/{domain}`) or one group of a
/// copy-limited resource (`…/groups/{group}`).
pub(super) trait Part {
    /// Where all of them are (`{name}`: the resource).
    const ALL_PATH: &str;
    /// Where one is (`{name}`, then the part's key).
    const ONE_PATH: &str;
    /// Only copy-limited resources have it (422 for a rate-limited one).
    const COPY_ONLY: bool;
    /// What a `GET` of all of them answers.
    type List: Serialize;
    /// All of them in `doc`, read at `version`.
    fn list(version: u64, doc: &Value) -> Self::List;
    /// The part named `key` in `doc`.
    fn get(doc: &Value, key: &str) -> Option<Value>;
    /// What a PUT body becomes once checked against the URL.
    fn accept(key: &str, body: Value) -> Result<Value, ApiError>;
    /// `doc` with the part set to `body`, and where the body went in it.
    fn set(doc: &Value, key: &str, body: Value) -> (Value, String);
    /// `doc` without the part, `None` when there was none.
    fn remove(doc: &Value, key: &str) -> Option<Value>;
    /// What the part is, before its key, in a 404 (`group`).
    const NOUN: &str;

    /// The 404 for a part that is not there.
    fn missing(name: &str, key: &str) -> ApiError {
        ApiError::not_found(format!("resource {name:?} has no {} {key:?}", Self::NOUN))
    }
}

/// `…/domains/{domain}`: the body is the override (rate: `hard_limit`
/// and/or `tiers`; copy: `domain_limit`), problems relative to it.
pub(super) struct Override;

impl Part for Override {
    const ALL_PATH: &str = "/v1/resources/{name}/domains";
    const ONE_PATH: &str = "/v1/resources/{name}/domains/{domain}";
    const COPY_ONLY: bool = false;
    type List = OverrideList;

    fn list(version: u64, doc: &Value) -> OverrideList {
        let domains = doc
            .get("domains")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        OverrideList { version, domains }
    }

    fn get(doc: &Value, domain: &str) -> Option<Value> {
        edit::get_override(doc, domain).cloned()
    }

    fn accept(domain: &str, body: Value) -> Result<Value, ApiError> {
        check_domain(domain)?;
        Ok(body)
    }

    fn set(doc: &Value, domain: &str, body: Value) -> (Value, String) {
        edit::set_override(doc, domain, body)
    }

    fn remove(doc: &Value, domain: &str) -> Option<Value> {
        edit::remove_override(doc, domain)
    }

    const NOUN: &str = "override for domain";
}

/// `…/groups/{group}`: the body is `{limit, domains}` (a `name`, if sent,
/// must be the group's); a PUT replaces the group in place or appends it.
pub(super) struct Group;

impl Part for Group {
    const ALL_PATH: &str = "/v1/resources/{name}/groups";
    const ONE_PATH: &str = "/v1/resources/{name}/groups/{group}";
    const COPY_ONLY: bool = true;
    type List = GroupList;

    fn list(version: u64, doc: &Value) -> GroupList {
        GroupList {
            version,
            groups: edit::groups(doc),
        }
    }

    fn get(doc: &Value, group: &str) -> Option<Value> {
        let i = edit::group_index(doc, group)?;
        edit::groups(doc).into_iter().nth(i)
    }

    fn accept(group: &str, body: Value) -> Result<Value, ApiError> {
        with_name(body, group, "group").map_err(|e| ApiError::invalid(vec![e]))
    }

    fn set(doc: &Value, group: &str, body: Value) -> (Value, String) {
        edit::set_group(doc, group, body)
    }

    fn remove(doc: &Value, group: &str) -> Option<Value> {
        edit::remove_group(doc, group)
    }

    const NOUN: &str = "group";
}

impl Snapshot {
    /// [`Snapshot::resource`] that may have parts `P`.
    async fn resource_with<P: Part>(self, name: &str) -> Result<(u64, Value), ApiError> {
        let (version, doc) = self.resource(name).await?;
        if P::COPY_ONLY {
            require_copy(&doc, name)?;
        }
        Ok((version, doc))
    }
}

/// `GET` of every part of a resource.
pub(super) async fn list_parts<P: Part>(
    _: Reader,
    UrlParams(p): UrlParams<NameParam>,
    snapshot: Snapshot,
) -> Result<Response, ApiError> {
    let (version, doc) = snapshot.resource_with::<P>(&p.name).await?;
    Ok(versioned(version, &P::list(version, &doc)))
}

/// `GET` of one part (path: the resource's name, the part's key).
pub(super) async fn get_part<P: Part>(
    _: Reader,
    UrlParams((name, key)): UrlParams<(String, String)>,
    snapshot: Snapshot,
) -> Result<Response, ApiError> {
    let (version, doc) = snapshot.resource_with::<P>(&name).await?;
    let part = P::get(&doc, &key).ok_or_else(|| P::missing(&name, &key))?;
    Ok(versioned(version, &part))
}

/// `PUT` of one part: created or replaced.
pub(super) async fn put_part<P: Part>(
    editor: Editor,
    UrlParams((name, key)): UrlParams<(String, String)>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let body = P::accept(&key, body)?;
    editor
        .part::<P>(&name, |doc| {
            let created = P::get(doc, &key).is_none();
            let (doc, prefix) = P::set(doc, &key, body);
            Edit::put(&doc, &prefix, created)
        })
        .await
}

/// `DELETE` of one part.
pub(super) async fn delete_part<P: Part>(
    editor: Editor,
    UrlParams((name, key)): UrlParams<(String, String)>,
) -> Result<Response, ApiError> {
    editor
        .part::<P>(&name, |doc| {
            let doc = P::remove(doc, &key).ok_or_else(|| P::missing(&name, &key))?;
            Edit::replace(&doc)
        })
        .await
}

/// Add a domain to a group (no body; unchanged if it is a member).
#[utoipa::path(put, path = "/v1/resources/{name}/groups/{group}/domains/{domain}",
    operation_id = "addMember", tag = "groups",
    responses(
        (status = 200, description = "Unchanged: already a member.", body = ResourceCommit),
        (status = 201),
        (status = 404), (status = 422)))]
pub(super) async fn add_member(
    editor: Editor,
    UrlParams(p): UrlParams<MemberParams>,
) -> Result<Response, ApiError> {
    check_domain(&p.domain)?;
    editor
        .group(&p.name, &p.group, |doc, i| {
            match edit::add_member(doc, i, &p.domain) {
                Some((doc, path)) => Ok(Edit::Put {
                    normalized: validate(&doc, &path, "domain")?,
                    created: true,
                }),
                // Already a member: nothing to commit.
                None => Edit::replace(doc),
            }
        })
        .await
}

/// Remove a domain from a group.
#[utoipa::path(delete, path = "/v1/resources/{name}/groups/{group}/domains/{domain}",
    operation_id = "removeMember", tag = "groups",
    responses((status = 200, description = "Removed.", body = ResourceCommit), (status = 404),
        (status = 422)))]
pub(super) async fn remove_member(
    editor: Editor,
    UrlParams(p): UrlParams<MemberParams>,
) -> Result<Response, ApiError> {
    editor
        .group(&p.name, &p.group, |doc, i| {
            let doc = edit::remove_member(doc, i, &p.domain).ok_or_else(|| {
                ApiError::not_found(format!(
                    "domain {:?} is not a member of group {:?} of resource {:?}",
                    p.domain, p.group, p.name
                ))
            })?;
            Edit::replace(&doc)
        })
        .await
}
