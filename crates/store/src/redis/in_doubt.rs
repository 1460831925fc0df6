//! Copy operations in doubt: those whose reply was lost, so that they may
//! or may not have run. Each is recorded ([`InDoubt`]) and settled later
//! by undoing it through its operation record ([`Undo`]).

use std::sync::{MutexGuard, PoisonError};

use super::RedisStore;
use super::reply::{Reply, bad};
use crate::StoreError;

/// A copy operation that may or may not have run.
#[derive(Debug, Clone)]
pub(super) struct InDoubt {
    pub(super) resource: String,
    pub(super) record: String,
    /// The generation it was sent in: after Redis lost its data, the
    /// rebuild replaces whatever it did, so it is not undone.
    pub(super) generation: String,
}

impl RedisStore {
    pub(super) fn lock_in_doubt(&self) -> MutexGuard<'_, Vec<InDoubt>> {
        self.in_doubt.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Copy operations whose reply was lost and that are not undone yet.
    pub fn operations_in_doubt(&self) -> usize {
        self.lock_in_doubt().len()
    }

    /// Undoes the copy operations whose reply was lost (each had been
    /// reported as failed). Those that cannot be settled now stay for the
    /// next round.
    pub(super) async fn settle_in_doubt(&self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut *self.lock_in_doubt());
        let mut left = Vec::new();
        let mut failure = None;
        for op in pending {
            if failure.is_some() {
                left.push(op);
                continue;
            }
            if op.generation != self.lock().generation {
                // Redis lost its data since: the rebuild replaced it.
                continue;
            }
            match self.undo(&op).await {
                Ok(Undo::Settled) => {}
                Ok(Undo::Fenced) => {
                    // Every operation left is moot: a resigned member's
                    // contributions are removed as a dead member's.
                    return Err(self.resign(
                        "other servers considered this server dead and removed its contributions"
                            .into(),
                    ));
                }
                Err(e) => {
                    // Kept, with every operation after it: an undo that
                    // failed (or whose reply could not be read) is tried
                    // again, never forgotten (a forgotten one leaks copies).
                    left.push(op);
                    failure = Some(e);
                }
            }
        }
        self.lock_in_doubt().extend(left);
        failure.map_or(Ok(()), Err)
    }

    /// Runs `undo.lua` for one operation in doubt. Running it again is
    /// harmless: an undo whose confirmation was lost (no replica during a
    /// failover) finds its own `undone` mark and answers just `undone`.
    pub(super) async fn undo(&self, op: &InDoubt) -> Result<Undo, StoreError> {
        let k = self.keys.copies(&op.resource, &self.member);
        let [counts, contribution, staging, expiry] = k.all();
        let keys = [counts, contribution, staging, expiry, op.record.as_str()];
        let args = [self.clock_arg(), self.record_ttl.as_millis().to_string()];
        // Replicated like the operation itself: an undo lost in a
        // failover would leave the copies counted (it is retried).
        let (_, v) = self
            .conn
            .eval_replicated(&self.scripts.undo, &keys, &args, &[])
            .await?;
        let mut r = Reply::new(self.scripts.undo.name, v)?;
        match r.text()?.as_str() {
            "undone" => {
                // The kind is there only on the run that reversed it.
                if let Ok(kind) = r.text() {
                    tracing::warn!(
                        resource = %op.resource,
                        operation = %kind,
                        "undid a copy operation whose reply was lost"
                    );
                }
                Ok(Undo::Settled)
            }
            "cancelled" => Ok(Undo::Settled),
            "fenced" => Ok(Undo::Fenced),
            other => Err(bad(
                self.scripts.undo.name,
                &format!("unknown status {other:?}"),
            )),
        }
    }
}

/// What undoing one operation in doubt came to.
pub(super) enum Undo {
    /// Reversed now, reversed before, or cancelled before it ran.
    Settled,
    /// Other servers fenced this one: it must resign.
    Fenced,
}
