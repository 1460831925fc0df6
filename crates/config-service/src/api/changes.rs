//! `GET /v1/changes?since=V`: what limiting servers poll.

use axum::response::Response;
use serde::Deserialize;

use super::extract::QueryParams;
use super::schema::Version;
use super::{Snapshot, versioned};
use crate::auth::Reader;
use crate::error::ApiError;
use crate::wire::Changes;

#[derive(Debug, Deserialize)]
pub(super) struct ChangesQuery {
    /// The version the client's view is at (0: it has none).
    #[serde(default)]
    since: u64,
    /// The epoch the client's view came from.
    epoch: Option<String>,
}

/// What changed after version `since`, or a full snapshot.
#[utoipa::path(get, path = "/v1/changes", operation_id = "changes", tag = "sync",
    params(
        ("since" = inline(Option<Version>), Query,
            description = "The version of the client's view; 0 or absent: a snapshot."),
        ("epoch" = Option<String>, Query,
            description = "The epoch of the client's view; another epoch gets a snapshot.")),
    responses((status = 200, description = "OK", body = Changes)))]
pub(super) async fn changes(
    _: Reader,
    QueryParams(q): QueryParams<ChangesQuery>,
    Snapshot(mut tx, meta): Snapshot,
) -> Result<Response, ApiError> {
    let other_epoch = q.epoch.as_deref().is_some_and(|e| e != meta.epoch);
    let snapshot =
        q.since == 0 || q.since < meta.history_floor || q.since > meta.version || other_epoch;
    let mut changes = Changes {
        epoch: meta.epoch,
        version: meta.version,
        since: q.since,
        snapshot,
        resources: Vec::new(),
        deleted_resources: Vec::new(),
        namespaces: Default::default(),
        deleted_namespaces: Vec::new(),
        envoy: None,
        envoy_removed: false,
    };
    if snapshot {
        changes.resources = tx
            .resources()
            .await?
            .into_values()
            .map(|r| r.document)
            .collect();
        changes.namespaces = super::namespaces::all(&mut tx).await?;
        changes.envoy = tx.envoy().await?;
    } else if q.since < meta.version {
        if tx.envoy_changed(q.since).await? {
            changes.envoy = tx.envoy().await?;
            changes.envoy_removed = changes.envoy.is_none();
        }
        for (name, doc) in tx.changed_resources(q.since).await? {
            match doc {
                Some(doc) => changes.resources.push(doc),
                None => changes.deleted_resources.push(name),
            }
        }
        for (name, settings) in tx.changed_namespaces(q.since).await? {
            match settings {
                Some(s) => {
                    changes.namespaces.insert(name, s.into());
                }
                None => changes.deleted_namespaces.push(name),
            }
        }
    }
    Ok(versioned(meta.version, &changes))
}
