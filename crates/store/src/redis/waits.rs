//! Reserves that may wait for copies on Redis (SPEC §14). The queue of
//! waiters lives beside the resource's counts, in its slot, and is served
//! by the same scripts that change the counts (`lua/wait.lua`, a port of
//! `charon_core::copy::wait`): arrival order is the order of arrival at
//! Redis, across every server. A waiter's answer waits in Redis until its
//! server takes it (`wait_op.lua`); its server hears of it by pub/sub
//! (`wakeups.rs`) or by polling.

use std::sync::PoisonError;

use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::{CopyCounts, GroupHolds, ReserveReply};
use charon_core::request::Amount;
use charon_core::{MAX_COUNT, UNBOUNDED};

use super::RedisStore;
use super::args::{enforce_arg, limit_arg, optional_limit_arg};
use super::keys;
use super::reply::{Reply, bad};
use crate::{Reserved, StoreError, Ticket, WaitOptions};

impl RedisStore {
    /// `reserve.lua`: the plain reserve when nobody waits, else the
    /// arrival in the queue (see [`crate::Store::reserve_or_wait`]).
    pub(super) async fn arrive(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
        wait: WaitOptions,
    ) -> Result<Reserved, StoreError> {
        let mut args = Vec::with_capacity(9 + 2 * limits.groups.len());
        args.push(domain.to_owned());
        args.push(amount.copies().to_string());
        args.push(amount.min_copies().to_string());
        args.push(enforce_arg(enforcement));
        args.push(limit_arg(limits.domain_limit));
        args.push(optional_limit_arg(limits.global_limit));
        args.push(wait.wait_ms.to_string());
        args.push(wait.queue_limit.to_string());
        args.push(self.clock.expiry_slack().to_string());
        for g in &limits.groups {
            args.push(g.name.clone());
            args.push(limit_arg(g.limit));
        }
        let tag = keys::escape(resource);
        // Indexed for queue_lengths(), before the script: a queue is never
        // missing from the index.
        let mut before = Vec::new();
        if wait.wait_ms > 0 {
            let mut index = redis::cmd("ZADD");
            index
                .arg(self.keys.queue_index())
                .arg(wall_clock_ms())
                .arg(tag.as_ref());
            before.push(index);
        }
        let mut r = self
            .copy_op(&self.scripts.reserve, resource, args, before, true, true)
            .await?
            .ok_or_else(|| bad("reserve", "none"))?;
        match r.text()?.as_str() {
            "wait" => {
                let id = r.count()?;
                self.wakeups.register(&tag, id);
                Ok(Reserved::Waiting(Ticket {
                    resource: resource.to_owned(),
                    id,
                }))
            }
            "now" => {
                let granted = r.count()?;
                let domain_holds = r.count()?;
                let global_holds = r.count()?;
                let queue_full = r.flag()?;
                let waited = r.int()?;
                let groups = (0..limits.groups.len())
                    .map(|_| r.count())
                    .collect::<Result<Vec<_>, _>>()?;
                let after = CopyCounts {
                    domain: domain_holds,
                    global: global_holds,
                    groups,
                };
                let mut reply = ReserveReply::new(granted, limits, &after, enforcement);
                reply.queue_full = queue_full;
                reply.waited_ms = u64::try_from(waited).ok();
                Ok(Reserved::Now(reply))
            }
            other => Err(bad("reserve", &format!("unknown answer {other:?}"))),
        }
    }

    /// Takes a waiter out of its queue; if Redis cannot be reached (or its
    /// answer was lost), the waiter is abandoned: the store takes it out
    /// later by itself, giving back copies handed to it meanwhile, so that
    /// a waiter nobody follows up never keeps copies.
    pub(super) async fn leave_or_abandon(
        &self,
        t: &Ticket,
    ) -> Result<Option<ReserveReply>, StoreError> {
        let answer = self.wait_op("leave", &t.resource, t.id).await;
        self.wakeups.forget(&keys::escape(&t.resource), t.id);
        if let Err(StoreError::Unavailable(_)) = &answer {
            self.abandoned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(t.clone());
        }
        answer
    }

    /// Takes the abandoned waiters out of their queues (maintenance); those
    /// Redis could not be asked about stay for the next round.
    pub(super) async fn settle_abandoned(&self) -> Result<(), StoreError> {
        let pending = std::mem::take(
            &mut *self
                .abandoned
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut failure = None;
        let mut left = Vec::new();
        for t in pending {
            if failure.is_some() {
                left.push(t);
                continue;
            }
            if let Err(e) = self.wait_op("abandon", &t.resource, t.id).await {
                left.push(t);
                failure = Some(e);
            }
        }
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(left);
        failure.map_or(Ok(()), Err)
    }

    /// Waiters abandoned and not taken out of their queues yet.
    pub fn waiters_abandoned(&self) -> usize {
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// `wait_op.lua`: `op` is `outcome`, `leave`, `abandon` or `tick`
    /// (`ticket` 0).
    /// A waiter that Redis no longer knows of (its keys expired, or Redis
    /// lost its data) is a server error for `outcome`.
    pub(super) async fn wait_op(
        &self,
        op: &str,
        resource: &str,
        ticket: u64,
    ) -> Result<Option<ReserveReply>, StoreError> {
        let args = vec![op.to_owned(), ticket.to_string()];
        let Some(mut r) = self
            .copy_op(
                &self.scripts.wait_op,
                resource,
                args,
                Vec::new(),
                false,
                false,
            )
            .await?
        else {
            return Ok(None);
        };
        let tag = keys::escape(resource);
        match r.text()?.as_str() {
            "lost" => {
                self.wakeups.forget(&tag, ticket);
                Err(StoreError::Unavailable(format!(
                    "the waiter {ticket} of {resource:?} is no longer in Redis (its keys \
                     expired or Redis lost its data)"
                )))
            }
            "answer" => {
                self.wakeups.forget(&tag, ticket);
                answer(&mut r).map(Some)
            }
            other => Err(bad("wait_op", &format!("unknown answer {other:?}"))),
        }
    }

    /// Callers waiting, by resource: the queues of the index. A resource
    /// leaves the index once nobody joined its queue for longer than any
    /// wait lasts (by the servers' wall clocks, which need only agree
    /// within an hour): then its queue is empty for sure, and no join can
    /// race the removal.
    pub(super) async fn waiting_by_resource(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let index = self.keys.queue_index();
        let stale = wall_clock_ms().saturating_sub(INDEX_KEEP_MS);
        self.conn
            .query::<()>(
                redis::cmd("ZREMRANGEBYSCORE")
                    .arg(&index)
                    .arg("-inf")
                    .arg(format!("({stale}")),
            )
            .await?;
        let tags: Vec<String> = self
            .conn
            .query(redis::cmd("ZRANGE").arg(&index).arg(0).arg(-1))
            .await?;
        let mut out = Vec::new();
        for tag in tags {
            let n: u64 = self
                .conn
                .query(redis::cmd("ZCARD").arg(self.keys.queue_of_tag(&tag)))
                .await?;
            if n > 0 {
                out.push((keys::unescape(&tag), n));
            }
        }
        out.sort();
        Ok(out)
    }
}

/// How long a resource stays in the index of queues after its last join:
/// twice the longest wait (`wait_ms` is at most an hour).
const INDEX_KEEP_MS: u64 = 2 * 3_600_000;

/// This host's wall clock in ms since the Unix epoch (for the index of
/// queues only: decisions use the store's decision clock).
fn wall_clock_ms() -> u64 {
    static WALL: std::sync::LazyLock<crate::SystemClock> =
        std::sync::LazyLock::new(crate::SystemClock::new);
    charon_core::Clock::now(&*WALL)
}

/// A limit as the scripts hand it back (`-1`: unbounded).
fn limit(text: &str) -> Result<u64, StoreError> {
    match text {
        "-1" => Ok(UNBOUNDED),
        t => t
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_COUNT)
            .ok_or_else(|| bad("wait_op", &format!("bad limit {t:?}"))),
    }
}

/// A waiter's answer (see `answer_reply` in `wait.lua`): waiters are
/// always decided with the limits enforced.
fn answer(r: &mut Reply) -> Result<ReserveReply, StoreError> {
    let granted = r.count()?;
    let domain_limit = limit(&r.text()?)?;
    let global_limit = match r.text()?.as_str() {
        "" => None,
        t => Some(limit(t)?),
    };
    let domain_holds = r.count()?;
    let global_holds = r.count()?;
    let queue_full = r.flag()?;
    let result_ready = r.flag()?;
    let waited = r.int()?;
    let mut groups = Vec::with_capacity(r.remaining() / 3);
    while r.remaining() >= 3 {
        groups.push(GroupHolds {
            name: r.text()?,
            limit: limit(&r.text()?)?,
            holds: r.count()?,
        });
    }
    Ok(ReserveReply {
        granted,
        domain_limit,
        global_limit,
        domain_holds,
        global_holds,
        groups,
        ignored: false,
        queue_full,
        result_ready,
        waited_ms: u64::try_from(waited).ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_turn_back_into_resources() {
        for r in ["page", "a{b}c", "100%", "%7B", "%25{"] {
            assert_eq!(keys::unescape(&keys::escape(r)), r, "{r}");
        }
        assert_eq!(limit("-1").ok(), Some(UNBOUNDED));
        assert_eq!(limit("5").ok(), Some(5));
        assert!(limit("x").is_err());
    }
}
