//! Cleaning up after dead members: fencing a member whose liveness stayed
//! lapsed and removing its contributions, in the housekeeping loop.

use std::collections::BTreeSet;

use super::{DEAD_SERVERS_REMOVED, mark_ttl, millis};
use crate::StoreError;
use crate::redis::RedisStore;
use crate::redis::reply::Reply;

/// What an attempt to fence a member found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    Fenced,
    Live,
    Suspect,
    Gone,
}

impl RedisStore {
    /// Cleans up after dead members and expires staged transfers, every
    /// third of the ttl, while this member is in good standing. Errors
    /// wait for the next round.
    pub(super) async fn housekeeping_loop(&self) {
        let mut every = tokio::time::interval(self.ttl / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if self.resigned().is_some() {
                return;
            }
            if self.check_member(false).is_err() {
                continue;
            }
            if let Err(e) = self.settle_in_doubt().await {
                tracing::warn!(error = %e, "undoing copy operations in doubt failed; will retry");
            }
            if let Err(e) = self.settle_abandoned().await {
                tracing::warn!(error = %e, "taking abandoned waiters out failed; will retry");
            }
            if let Err(e) = self.clean_dead_members().await {
                tracing::warn!(error = %e, "cleaning up after dead servers failed; will retry");
            }
            if let Err(e) = self.expire_staging().await {
                tracing::warn!(error = %e, "expiring staged transfers failed; will retry");
            }
        }
    }

    /// Fences every registered member whose liveness stayed lapsed, and
    /// removes the contributions of every fenced member. Returns how many
    /// members were cleaned up.
    pub(in crate::redis) async fn clean_dead_members(&self) -> Result<usize, StoreError> {
        let registered: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.registry()))
            .await?;
        let dead: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.dead()))
            .await?;
        let mut fenced: BTreeSet<String> = dead.into_iter().filter(|m| *m != self.member).collect();
        for m in registered.iter().filter(|m| **m != self.member) {
            if self.fence(m, false).await? == Fence::Fenced && fenced.insert(m.clone()) {
                tracing::warn!(
                    member = %m,
                    "fenced a server whose liveness stayed lapsed; removing its contributions"
                );
            }
        }
        for m in &fenced {
            self.check_member(false)?;
            self.clean_member(m).await?;
            metrics::counter!(DEAD_SERVERS_REMOVED).increment(1);
        }
        Ok(fenced.len())
    }

    /// Fences `member` if its liveness stayed lapsed for the suspicion
    /// grace (at once with `now`, for this member leaving).
    pub(super) async fn fence(&self, member: &str, now: bool) -> Result<Fence, StoreError> {
        let v = self
            .conn
            .eval(
                &self.scripts.fence,
                &[
                    &self.keys.registry(),
                    &self.keys.dead(),
                    &self.keys.live(member),
                    &self.keys.suspect(member),
                    &self.keys.tick(),
                ],
                &[
                    member.to_owned(),
                    millis(self.suspicion_grace()),
                    if now { "1" } else { "0" }.to_owned(),
                    millis(self.ttl / 2),
                    millis(mark_ttl(self.ttl)),
                ],
                &[],
            )
            .await?;
        let outcome = Reply::new(self.scripts.fence.name, v)?.text()?;
        match outcome.as_str() {
            "fenced" => Ok(Fence::Fenced),
            "live" => Ok(Fence::Live),
            "suspect" => Ok(Fence::Suspect),
            "gone" => Ok(Fence::Gone),
            other => Err(crate::redis::reply::bad(
                "fence",
                &format!("unknown outcome {other:?}"),
            )),
        }
    }

    /// Removes a dead member's contributions, resource by resource, then
    /// its registration.
    pub(super) async fn clean_member(&self, member: &str) -> Result<(), StoreError> {
        let tags: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.key_set(member)))
            .await?;
        let mark = millis(mark_ttl(self.ttl));
        let mut copies = 0u64;
        let mut waiters = 0u64;
        for tag in &tags {
            let k = self.keys.copies_of_tag(tag, member);
            let v = self
                .conn
                .eval(
                    &self.scripts.cleanup,
                    &[&k.counts, &k.contribution],
                    &[mark.clone(), self.clock_arg()],
                    &[],
                )
                .await?;
            let mut r = Reply::new(self.scripts.cleanup.name, v)?;
            copies += r.count()?;
            let negative = r.count()?;
            waiters += r.count()?;
            if negative > 0 {
                tracing::error!(
                    member,
                    resource_tag = %tag,
                    fields = negative,
                    "counts were below a dead server's contribution; set to zero"
                );
            }
        }
        let v = self
            .conn
            .eval(
                &self.scripts.forget,
                &[&self.keys.dead(), &self.keys.key_set(member)],
                &[member.to_owned(), tags.len().to_string()],
                &[],
            )
            .await?;
        let forgotten = matches!(v, redis::Value::Int(1));
        tracing::warn!(
            member,
            resources = tags.len(),
            copies,
            waiters,
            forgotten,
            "removed the contributions (and waiters) of a dead server"
        );
        Ok(())
    }
}
