//! The copy journal's write path: [`RedisStore::copy_op`] runs a copy
//! script with the generation check, the key-set bookkeeping and the
//! operation record that lets a lost reply be undone; and the reading of
//! copy counts ([`CopyLog`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use charon_core::bound::{self, Kept};

use super::RedisStore;
use super::in_doubt::InDoubt;
use super::reply::{Reply, bad};
use super::{keys, scripts};
use crate::StoreError;

/// Copy counts of one resource as Redis holds them (for inspection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyLog {
    /// Copies held in all.
    pub global: u64,
    /// Copies held per domain.
    pub domains: BTreeMap<String, u64>,
    /// Copies held per group.
    pub groups: BTreeMap<String, u64>,
}

impl RedisStore {
    /// The copy counts of `resource` and this server's contribution to
    /// them, read atomically.
    pub async fn copy_log(&self, resource: &str) -> Result<(CopyLog, CopyLog), StoreError> {
        let k = self.keys.copies(resource, &self.member);
        let v = self
            .conn
            .eval(
                &self.scripts.counts,
                &[&k.counts, &k.contribution],
                &[],
                &[],
            )
            .await
            .inspect_err(|e| self.on_error(e))?;
        let mut r = Reply::new(self.scripts.counts.name, v)?;
        let counts = copy_log(r.nested()?)?;
        let mine = copy_log(r.nested()?)?;
        Ok((counts, mine))
    }

    /// Runs a copy script: `args` follow the test clock and the record
    /// ttl. Adds the resource to this member's key set first when the
    /// operation `contributes`. `None` when the script found nothing to act
    /// on (an unknown transfer). An operation whose reply is lost is
    /// remembered, to be undone (it was reported as failed).
    ///
    /// The generation marker is read in the same pipeline, just before the
    /// script: if Redis lost its data since this member last looked, the
    /// operation ran on the new, incomplete counts, so it is reported as a
    /// server error and left for the rebuild to overwrite.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn copy_op(
        &self,
        script: &scripts::Script,
        resource: &str,
        args: Vec<String>,
        before: Vec<redis::Cmd>,
        contributes: bool,
        reserves: bool,
    ) -> Result<Option<Reply>, StoreError> {
        self.check_member(reserves)?;
        let generation = self.lock().generation.clone();
        let tag = keys::escape(resource);
        let k = self.keys.copies(resource, &self.member);
        let record = self.keys.op_record(
            resource,
            &self.member,
            self.ops.fetch_add(1, Ordering::Relaxed),
        );
        let (mut first, epoch) = if contributes {
            self.key_set_add(&tag)
        } else {
            (Vec::new(), 0)
        };
        let adds_key = !first.is_empty();
        first.extend(before);
        let mut check = redis::cmd("GET");
        check.arg(self.keys.generation());
        first.push(check);
        let mut all_args = Vec::with_capacity(args.len() + 2);
        all_args.push(self.clock_arg());
        all_args.push(self.record_ttl.as_millis().to_string());
        all_args.extend(args);
        let [counts, contribution, staging, expiry] = k.all();
        let keys = [counts, contribution, staging, expiry, record.as_str()];
        // In a cluster, nothing is acknowledged before a replica has it: a
        // failover must not lose a copy grant (docs/redis.md, "Failover").
        // Unconfirmed, it is in doubt and undone like a lost reply.
        let (pre, v) = match self
            .conn
            .eval_replicated(script, &keys, &all_args, &first)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                self.on_error(&e);
                if matches!(e, StoreError::Unavailable(_)) {
                    self.lock_in_doubt().push(InDoubt {
                        resource: resource.to_owned(),
                        record,
                        generation,
                    });
                }
                return Err(e);
            }
        };
        if !same_generation(pre.last(), &generation) {
            self.generation_lost();
            return Err(StoreError::Unavailable(format!(
                "Redis lost its data: {} of {resource:?} was not counted; copy counts are being rebuilt",
                script.name
            )));
        }
        if adds_key {
            self.key_set_added(&tag, epoch);
        }
        let mut r = Reply::new(script.name, v)?;
        let status = r.text()?;
        match status.as_str() {
            "ok" => Ok(Some(r)),
            "none" => Ok(None),
            "fenced" => Err(self.resign(
                "other servers considered this server dead and removed its contributions".into(),
            )),
            "cancelled" => {
                // The record exists: an undo cancelled the operation, or a
                // client library that sent it again after a lost reply (the
                // cluster client retries) finds its own first run. Settling
                // it reverses that run, or does nothing for a cancellation.
                self.lock_in_doubt().push(InDoubt {
                    resource: resource.to_owned(),
                    record,
                    generation,
                });
                Err(StoreError::Unavailable(format!(
                    "{} of {resource:?} was cancelled as in doubt",
                    script.name
                )))
            }
            "short" | "bad" => {
                let field = r.text()?;
                let have = r.count()?;
                let whose = if status == "short" {
                    "this server's contribution"
                } else {
                    "the count"
                };
                Err(StoreError::BadData(format!(
                    "{resource:?}: {whose} is {have} for {}; refusing to let a count go negative",
                    describe_field(&field),
                )))
            }
            "over" => {
                let field = r.text()?;
                let held = r.count()?;
                let n = r.count()?;
                let count = kept_copies(&field)
                    .ok_or_else(|| bad(script.name, &format!("unknown count {field:?}")))?;
                Err(StoreError::Refused(bound::refusal(count, held, n)))
            }
            other => Err(bad(script.name, &format!("unknown status {other:?}"))),
        }
    }
}

/// On a Redis Cluster, operation records live at least this long: an
/// operation in doubt at a master's death is undone on the promoted
/// replica, which serves only after the failover (the cluster's node
/// timeout, 15 s by default, plus the election). A record that expired
/// first would make the undo a mere cancellation and leak the copies.
pub(super) const CLUSTER_RECORD_TTL: Duration = Duration::from_secs(60);

/// How long the record of a copy operation lives: long enough for every
/// retry of the operation and for its undo (see "Lost replies" in
/// docs/redis.md).
pub(super) fn record_ttl(liveness_ttl: Duration, op_timeout: Duration, cluster: bool) -> Duration {
    let ttl = (liveness_ttl * 2).max(op_timeout * 10);
    if cluster {
        ttl.max(CLUSTER_RECORD_TTL)
    } else {
        ttl
    }
}

/// Whether the reply to `GET <generation>` is `generation`.
pub(super) fn same_generation(reply: Option<&redis::Value>, generation: &str) -> bool {
    match reply {
        Some(redis::Value::BulkString(b)) => b.as_slice() == generation.as_bytes(),
        Some(redis::Value::SimpleString(s)) => s == generation,
        _ => false,
    }
}

pub(super) fn describe_field(field: &str) -> String {
    if field == "g" {
        "the resource".to_owned()
    } else if let Some(d) = field.strip_prefix("d:") {
        format!("domain {d:?}")
    } else if let Some(g) = field.strip_prefix("G:") {
        format!("group {g:?}")
    } else {
        format!("field {field:?}")
    }
}

/// The count a copy script's field is, as `charon_core::bound` names it.
pub(super) fn kept_copies(field: &str) -> Option<Kept<'_>> {
    if field == "g" {
        Some(Kept::ResourceCopies)
    } else if let Some(d) = field.strip_prefix("d:") {
        Some(Kept::DomainCopies(d))
    } else {
        field.strip_prefix("G:").map(Kept::GroupCopies)
    }
}

pub(super) fn copy_log(mut r: Reply) -> Result<CopyLog, StoreError> {
    let mut log = CopyLog::default();
    while r.remaining() >= 2 {
        let field = r.text()?;
        if field == "!" {
            r.text()?;
            continue;
        }
        let n = r.count()?;
        if field == "g" {
            log.global = n;
        } else if let Some(d) = field.strip_prefix("d:") {
            log.domains.insert(d.to_owned(), n);
        } else if let Some(g) = field.strip_prefix("G:") {
            log.groups.insert(g.to_owned(), n);
        }
    }
    Ok(log)
}
