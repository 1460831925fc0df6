//! The JSON bodies of the API that are more than a configuration document,
//! shared by the server, the HTTP client, the feed and the CLI so that both
//! ends agree by construction. Their `ToSchema` derives (feature `openapi`)
//! make the service's OpenAPI document, so it describes these very types;
//! `docs/config-service.md` describes the same shapes.
//!
//! Problems and adjustments are core's own [`ConfigIssue`] and
//! [`Adjustment`]: the service reports what core found, in core's words.

use std::collections::BTreeMap;

#[cfg(feature = "openapi")]
use crate::schema;
pub use charon_core::config::{Adjustment, ConfigIssue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// A stable code: `invalid`, `unauthorized`, `forbidden`, `not_found`,
    /// `already_exists`, `wrong_kind`, `version_conflict`,
    /// `unsupported_media_type`, `payload_too_large`, `method_not_allowed`,
    /// `unavailable`, `internal`.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::ErrorCode))]
    pub error: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Every problem found (validation errors), possibly empty.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true, value_type = Vec<schema::Problem>))]
    pub problems: Vec<ConfigIssue>,
    /// On `version_conflict`: the version the service is at now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub current_version: Option<u64>,
}

/// What a write to one resource (or a part of it) answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResourceCommit {
    /// The version the configuration is at after this request: the new
    /// version if something changed, the current one otherwise.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    /// False when the request asked for what was already there (no commit).
    pub changed: bool,
    /// The whole resource as stored, normalized.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Resource))]
    pub resource: Value,
    /// What normalization changed in what was sent.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<schema::Adjustment>))]
    pub adjustments: Vec<Adjustment>,
}

/// What a write to a namespace answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceCommit {
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    pub changed: bool,
    pub namespace: String,
    pub settings: NamespaceBody,
}

/// What a delete answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeleteCommit {
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    pub changed: bool,
}

/// The switches of one namespace, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = NamespaceState))]
pub struct NamespaceBody {
    pub allow_unconfigured: bool,
    pub ignore_configured: bool,
}

impl From<charon_core::config::NamespaceSettings> for NamespaceBody {
    fn from(s: charon_core::config::NamespaceSettings) -> Self {
        Self {
            allow_unconfigured: s.allow_unconfigured,
            ignore_configured: s.ignore_configured,
        }
    }
}

impl From<NamespaceBody> for charon_core::config::NamespaceSettings {
    fn from(s: NamespaceBody) -> Self {
        Self {
            allow_unconfigured: s.allow_unconfigured,
            ignore_configured: s.ignore_configured,
        }
    }
}

// Document-only (described, never built: the export is core's own
// rendering), kept with the wire types rather than in `schema` because it
// holds `NamespaceBody`: the document-only types never name a wire type.
/// The whole configuration as exported.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[allow(dead_code, missing_debug_implementations)]
pub struct ExportedConfig {
    #[serde(default)]
    namespaces: BTreeMap<String, NamespaceBody>,
    resources: Vec<schema::Resource>,
    /// Present when the configuration has an `envoy:` section.
    envoy: Option<schema::EnvoySection>,
}

/// `GET /v1/resources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResourceList {
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<schema::Resource>))]
    pub resources: Vec<Value>,
}

/// `GET /v1/namespaces`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceList {
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    pub namespaces: BTreeMap<String, NamespaceBody>,
}

/// `GET /v1/changes?since=V`: what changed after version V, or everything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Changes {
    /// The random id of the database behind the service; a client that
    /// synced with another epoch must start over from a snapshot.
    pub epoch: String,
    /// The version this answer brings the client to.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    /// The `since` that was asked for.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub since: u64,
    /// True: `resources` and `namespaces` are the whole configuration and
    /// replace the client's view (asked for 0, history no longer kept,
    /// another epoch, or a version the service never had). False: they are
    /// upserts on top of the view at `since`.
    pub snapshot: bool,
    /// Resources created or changed (the whole normalized document).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<schema::Resource>))]
    pub resources: Vec<Value>,
    /// Names of resources deleted (never on a snapshot).
    pub deleted_resources: Vec<String>,
    /// Namespaces created or changed.
    pub namespaces: BTreeMap<String, NamespaceBody>,
    /// Names of namespaces deleted (never on a snapshot).
    pub deleted_namespaces: Vec<String>,
    /// The `envoy:` section (normalized) when it changed, or on
    /// a snapshot when the configuration has one; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<schema::EnvoySection>))]
    pub envoy: Option<Value>,
    /// True when the `envoy:` section was removed (never on a snapshot:
    /// there, no `envoy` means none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub envoy_removed: bool,
}

/// One entry of the difference between the stored configuration and an
/// imported one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DiffEntry {
    /// `resource`, `namespace` or `envoy` (the whole section).
    #[cfg_attr(feature = "openapi", schema(value_type = schema::DiffKind))]
    pub kind: String,
    pub name: String,
    /// `add`, `change` or `remove`.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::DiffOp))]
    pub op: String,
    /// The stored document (null on `add`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true, value_type = Option<Object>))]
    pub before: Option<Value>,
    /// The imported document, normalized (null on `remove`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true, value_type = Option<Object>))]
    pub after: Option<Value>,
}

/// `PUT /v1/config`: the difference and, unless a dry run, its commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportOutcome {
    pub dry_run: bool,
    /// Whether the configuration was (or, on a dry run, would be) changed.
    pub changed: bool,
    /// The version the difference was computed against; send it as
    /// `If-Match` to apply exactly this difference.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub base_version: u64,
    /// The version after this request (`base_version` on a dry run or when
    /// nothing changed).
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    pub diff: Vec<DiffEntry>,
    /// What normalization changed in the imported document, with paths in it.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<schema::Adjustment>))]
    pub adjustments: Vec<Adjustment>,
}

/// One commit in the audit trail (`GET /v1/audit`, `GET /v1/audit/{version}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// The version the commit made.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    /// When it was committed: RFC 3339, UTC, milliseconds
    /// (`2026-11-26T12:00:00.123Z`).
    pub time: String,
    /// The name of the token that made it (never the secret).
    pub token: String,
    /// A unified diff of the whole configuration as normalized YAML, before
    /// → after (`--- a/config.yaml`, `+++ b/config.yaml`, hunks).
    pub change: String,
    /// The whole configuration after the commit, normalized YAML (only from
    /// `GET /v1/audit/{version}`): what a rollback to it imports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// `GET /v1/audit`: a page of the audit trail, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditLog {
    /// The configuration version now.
    #[cfg_attr(feature = "openapi", schema(value_type = schema::Version))]
    pub version: u64,
    /// Commits, newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` to get the next (older) page; absent when this page
    /// holds the oldest entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<schema::Version>))]
    pub next_before: Option<u64>,
}
