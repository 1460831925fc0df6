//! `GET /v1/changes?since=V`: what limiting servers poll.

use axum::response::Response;
use serde::Deserialize;

use super::extract::QueryParams;
use super::{Snapshot, versioned};
use crate::auth::Reader;
use crate::error::ApiError;
use crate::wire::{Changes, NamespaceBody};

#[derive(Debug, Deserialize)]
pub(super) struct ChangesQuery {
    /// The version the client's view is at (0: it has none).
    #[serde(default)]
    since: u64,
    /// The epoch the client's view came from.
    epoch: Option<String>,
}

/// A delta since `since` when the kept history covers it; otherwise (0, a
/// version older than the history, newer than the service, or another
/// epoch) the whole configuration as a snapshot.
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
    };
    if snapshot {
        changes.resources = tx
            .resources()
            .await?
            .into_values()
            .map(|r| r.document)
            .collect();
        changes.namespaces = tx
            .namespaces()
            .await?
            .into_iter()
            .map(|(n, s)| (n, NamespaceBody::from(s.settings)))
            .collect();
    } else if q.since < meta.version {
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
