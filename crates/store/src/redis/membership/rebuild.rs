//! Rebuilding this member's contributions from its sessions' hold sets
//! after Redis lost its data (a new generation of the copy log).

use std::collections::BTreeMap;
use std::time::Instant;

use charon_core::copy::Hold;

use super::RESET_BATCH;
use super::renewal::Renewed;
use crate::StoreError;
use crate::redis::RedisStore;
use crate::redis::copies::same_generation;
use crate::redis::keys::{self, CopyKind};
use crate::redis::reply::Reply;

impl RedisStore {
    /// After Redis lost its data: sets this member's contribution to every
    /// resource to exactly what its sessions hold (and what they held
    /// before is gone from Redis), with copy operations paused meanwhile.
    /// Resources where this member contributed in the new generation before
    /// it noticed are found by a scan and set too.
    pub(super) async fn rebuild(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let source = self.hold_source();
        if source.is_none() {
            tracing::warn!(
                "no hold sets attached to the Redis store: rebuilding as if this server held nothing"
            );
        }
        let snapshot = match &source {
            Some(s) => Some(s.snapshot().await),
            None => None,
        };
        let holds = snapshot.as_ref().map_or(&[][..], |s| s.holds());
        let (generation, epoch) = {
            let s = self.lock();
            (s.generation.clone(), s.epoch)
        };
        // Operations in doubt from before the loss: the rebuild replaces
        // whatever they did.
        self.lock_in_doubt()
            .retain(|op| op.generation == generation);

        let mut by_tag: BTreeMap<String, Vec<(&Hold, u64)>> = BTreeMap::new();
        for (hold, n) in holds {
            by_tag
                .entry(keys::escape(&hold.resource).into_owned())
                .or_default()
                .push((hold, *n));
        }
        let pattern = self.keys.contribution_scan_pattern(&self.member);
        for key in self.scan(&pattern, false).await? {
            if let Some((tag, CopyKind::Contribution(m))) = self.keys.parse(&key)
                && m == self.member
            {
                by_tag.entry(tag.to_owned()).or_default();
            }
        }

        let mut copies = 0u64;
        for (i, (tag, hs)) in by_tag.iter().enumerate() {
            if i > 0 && i % RESET_BATCH == 0 {
                match self.renew().await? {
                    Renewed::Ok | Renewed::Revived => {}
                    _ => {
                        return Err(StoreError::Unavailable(
                            "the copy log changed generation again during the rebuild".into(),
                        ));
                    }
                }
            }
            let k = self.keys.copies_of_tag(tag, &self.member);
            let mut args = vec![self.clock_arg()];
            for (hold, n) in hs {
                args.push(n.to_string());
                args.push(hold.domain.clone());
                args.push(hold.groups.len().to_string());
                args.extend(hold.groups.iter().cloned());
            }
            let mut add = redis::cmd("SADD");
            add.arg(self.keys.key_set(&self.member)).arg(tag);
            let mut check = redis::cmd("GET");
            check.arg(self.keys.generation());
            let (pre, v) = self
                .conn
                .eval_after(&self.scripts.rebuild, &k.all(), &args, &[add, check])
                .await?;
            if !same_generation(pre.last(), &generation) {
                return Err(StoreError::Unavailable(
                    "Redis lost its data again during the rebuild".into(),
                ));
            }
            let mut r = Reply::new(self.scripts.rebuild.name, v)?;
            match r.text()?.as_str() {
                "ok" => {
                    let _before = r.count()?;
                    copies += r.count()?;
                    let negative = r.count()?;
                    if negative > 0 {
                        tracing::error!(
                            resource_tag = %tag,
                            fields = negative,
                            "counts were below this server's contribution while rebuilding; set to zero"
                        );
                    }
                }
                "fenced" => {
                    return Err(self.resign(
                        "other servers considered this server dead and removed its contributions"
                            .into(),
                    ));
                }
                other => {
                    return Err(crate::redis::reply::bad(
                        "rebuild",
                        &format!("unknown status {other:?}"),
                    ));
                }
            }
            self.key_set_added(tag, epoch);
        }
        let open = self.poll_gate(true).await?;
        self.lock().rebuild_pending = false;
        let resources = by_tag.len();
        drop(by_tag);
        drop(snapshot);
        tracing::warn!(
            resources,
            copies,
            took = ?started.elapsed(),
            reserves_open = open,
            "rebuilt this server's part of the copy counts from its sessions' holds"
        );
        Ok(())
    }
}
