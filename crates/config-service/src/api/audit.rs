//! `/v1/audit`: who committed what, when (issue 16). Newest first, paged
//! with `before` (a version) and `limit`; one entry with the whole
//! configuration it left, which `charon config rollback` imports again.

use std::time::{Duration, UNIX_EPOCH};

use axum::response::Response;
use serde::Deserialize;

use super::extract::{QueryParams, UrlParams};
use super::schema::{AuditLimit, Version};
use super::{Snapshot, versioned};
use crate::auth::Reader;
use crate::error::ApiError;
use crate::store;
use crate::wire::{AuditEntry, AuditLog};

/// Entries per page when `limit` is not given.
const DEFAULT_LIMIT: u64 = 50;
/// The most entries one page holds.
pub(crate) const MAX_LIMIT: u64 = 1000;

#[derive(Debug, Deserialize)]
pub(super) struct AuditQuery {
    /// Only entries of versions below this one (the previous page's
    /// `next_before`).
    before: Option<u64>,
    /// How many entries, 1 to [`MAX_LIMIT`].
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct VersionParam {
    version: u64,
}

fn entry(e: store::AuditEntry) -> AuditEntry {
    let time = UNIX_EPOCH + Duration::from_millis(e.unix_ms);
    AuditEntry {
        version: e.version,
        time: humantime::format_rfc3339_millis(time).to_string(),
        token: e.token,
        change: e.diff,
        config: e.config,
    }
}

/// The audit trail: one entry per commit (version, time, token name and the
/// diff of the normalized YAML), newest first.
#[utoipa::path(get, path = "/v1/audit", operation_id = "audit", tag = "audit",
    params(
        ("before" = inline(Option<Version>), Query,
            description = "Only commits of versions below this one: the previous page's \
                `next_before`. Absent: from the newest."),
        ("limit" = inline(Option<AuditLimit>), Query,
            description = "How many entries (default 50).")),
    responses((status = 200, description = "OK", body = AuditLog)))]
pub(super) async fn list(
    _: Reader,
    QueryParams(q): QueryParams<AuditQuery>,
    Snapshot(mut tx, meta): Snapshot,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid_at(
            "limit",
            format!("limit must be 1 to {MAX_LIMIT}"),
        ));
    }
    let entries: Vec<AuditEntry> = tx
        .audit(q.before, limit)
        .await?
        .into_iter()
        .map(entry)
        .collect();
    let full = u64::try_from(entries.len()).is_ok_and(|n| n == limit);
    let next_before = entries
        .last()
        .filter(|e| full && e.version > 1)
        .map(|e| e.version);
    Ok(versioned(
        meta.version,
        &AuditLog {
            version: meta.version,
            entries,
            next_before,
        },
    ))
}

/// One commit of the audit trail, with the whole configuration it left
/// (normalized YAML).
#[utoipa::path(get, path = "/v1/audit/{version}", operation_id = "auditEntry", tag = "audit",
    params(("version" = inline(Version), Path, description = "The version the commit made.")),
    responses((status = 200, description = "OK", body = AuditEntry),
        (status = 404, description = "No commit of this version is in the audit trail (never \
            made, or made before the audit trail existed).",
            body = crate::wire::ErrorBody)))]
pub(super) async fn get(
    _: Reader,
    UrlParams(p): UrlParams<VersionParam>,
    Snapshot(mut tx, meta): Snapshot,
) -> Result<Response, ApiError> {
    let found = tx.audit_entry(p.version).await?.ok_or_else(|| {
        ApiError::not_found(format!(
            "version {} is not in the audit trail (the configuration is at version {})",
            p.version, meta.version
        ))
    })?;
    Ok(versioned(meta.version, &entry(found)))
}
