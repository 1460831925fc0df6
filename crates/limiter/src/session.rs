//! A client session: the hold set of paper §4.2, kept by the server that
//! the session is bound to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged, WaitMode};
use charon_core::request::{Amount, check_name, positive_count, transfer_ttl};
use charon_core::{ClientError, Millis};

use charon_store::{Reserved, Ticket, WaitOptions};

use crate::holds::{HoldSet, lock};
use crate::{LimitError, Limiter};

/// One session of SPEC §3. Every hold belongs to the session that made or
/// seized it; [`Session::end`] releases them all.
///
/// The hold set lives in the limiter's registry, so that a store that lost
/// its copy counts can rebuild them from every session's holds; each copy
/// operation changes the store and the hold set as one step with respect to
/// such a rebuild.
#[derive(Debug)]
pub struct Session {
    limiter: Arc<Limiter>,
    id: u64,
    holds: HoldSet,
    /// Reserves of this session waiting for copies, with their domains.
    waiting: Vec<(Ticket, String)>,
}

/// The longest a reserve may wait for copies: one hour. A longer wait is
/// a client error (the caller should rather give up and come back).
pub const MAX_WAIT_MS: Millis = 3_600_000;

impl Drop for Session {
    fn drop(&mut self) {
        self.limiter.holds.unregister(self.id);
    }
}

impl Session {
    pub(crate) fn new(limiter: Arc<Limiter>) -> Self {
        let (id, holds) = limiter.holds.register();
        Self {
            limiter,
            id,
            holds,
            waiting: Vec::new(),
        }
    }

    /// `reserve(resource, domain, copies, min_copies)`: on a grant, the
    /// copies become this session's hold under the domain's current groups.
    pub async fn reserve(
        &mut self,
        resource: &str,
        domain: &str,
        amount: Amount,
    ) -> Result<ReserveReply, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        let config = self.limiter.config();
        let (copy, enforcement) = config.copy(resource, "reserve")?;
        let limits = copy.limits_for(domain);
        let _op = self.limiter.holds.operation().await;
        let reply = self
            .limiter
            .store
            .reserve(resource, domain, &limits, amount, enforcement)
            .await?;
        self.record(resource, domain, &reply);
        Ok(reply)
    }

    /// On a grant, the copies become this session's hold under the
    /// domain's groups as the reply names them.
    fn record(&self, resource: &str, domain: &str, reply: &ReserveReply) {
        if reply.granted > 0 {
            let hold = Hold {
                resource: resource.to_owned(),
                domain: domain.to_owned(),
                groups: reply.group_set(),
            };
            *lock(&self.holds).entry(hold).or_default() += reply.granted;
        }
    }

    /// A reserve that may wait up to `wait_ms` for copies (SPEC §14):
    /// answered at once, or waiting under a ticket that
    /// [`Session::poll_wait`] follows up (the way a simulation on a virtual
    /// clock drives it; [`Session::reserve_waiting`] waits in real time).
    pub async fn join(
        &mut self,
        resource: &str,
        domain: &str,
        amount: Amount,
        wait_ms: Millis,
    ) -> Result<Reserved, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        if wait_ms > MAX_WAIT_MS {
            return Err(ClientError::invalid(format!(
                "wait_ms must be at most {MAX_WAIT_MS} (one hour)"
            ))
            .into());
        }
        let config = self.limiter.config();
        let (copy, enforcement) = config.copy(resource, "reserve")?;
        let limits = copy.limits_for(domain);
        let wait = WaitOptions {
            wait_ms,
            queue_limit: copy.queue_limit,
        };
        let _op = self.limiter.holds.operation().await;
        let reserved = self
            .limiter
            .store
            .reserve_or_wait(resource, domain, &limits, amount, enforcement, wait)
            .await?;
        match &reserved {
            Reserved::Now(reply) => self.record(resource, domain, reply),
            Reserved::Waiting(t) => self.waiting.push((t.clone(), domain.to_owned())),
        }
        Ok(reserved)
    }

    /// The answer to this session's waiting reserve `ticket` if the store
    /// has decided (a grant becomes this session's hold); `None` while it
    /// waits.
    pub async fn poll_wait(&mut self, ticket: &Ticket) -> Result<Option<ReserveReply>, LimitError> {
        let _op = self.limiter.holds.operation().await;
        let answer = self.limiter.store.wait_outcome(ticket).await?;
        if let Some(reply) = &answer {
            self.settle(ticket, reply);
        }
        Ok(answer)
    }

    /// Takes this session's waiting reserve `ticket` out of its queue; a
    /// grant it had already got becomes this session's hold (released with
    /// the rest when the session ends).
    pub async fn leave_wait(&mut self, ticket: &Ticket) -> Result<(), LimitError> {
        let _op = self.limiter.holds.operation().await;
        let answer = self.limiter.store.leave_queue(ticket).await?;
        match answer {
            Some(reply) => self.settle(ticket, &reply),
            None => self.waiting.retain(|(t, _)| t != ticket),
        }
        Ok(())
    }

    /// Records the answer of `ticket` and forgets that it waits.
    fn settle(&mut self, ticket: &Ticket, reply: &ReserveReply) {
        if let Some(i) = self.waiting.iter().position(|(t, _)| t == ticket) {
            let (t, domain) = self.waiting.swap_remove(i);
            self.record(&t.resource, &domain, reply);
        }
    }

    /// A reserve that waits in real time up to `wait_ms` for copies
    /// (SPEC §14). `None` if `gone` finished first (the caller left): the
    /// reserve has then left the queue, and anything granted meanwhile is
    /// this session's hold.
    pub async fn reserve_waiting(
        &mut self,
        resource: &str,
        domain: &str,
        amount: Amount,
        wait_ms: Millis,
        gone: impl Future<Output = ()>,
    ) -> Result<Option<ReserveReply>, LimitError> {
        let ticket = match self.join(resource, domain, amount, wait_ms).await? {
            Reserved::Now(reply) => return Ok(Some(reply)),
            Reserved::Waiting(t) => t,
        };
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut gone = std::pin::pin!(gone);
        loop {
            match self.poll_wait(&ticket).await {
                Ok(Some(reply)) => return Ok(Some(reply)),
                Ok(None) => {}
                Err(e) => {
                    // Best effort: a waiter nobody follows up must not be
                    // handed copies; the session's end tries again.
                    let _ = self.leave_wait(&ticket).await;
                    return Err(e);
                }
            }
            // Past the deadline the store rejects by its own clock's
            // millisecond: look again shortly.
            let nap = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let store = self.limiter.store.clone();
            tokio::select! {
                () = &mut gone => {
                    self.leave_wait(&ticket).await?;
                    return Ok(None);
                }
                () = store.woken(&ticket, nap) => {}
            }
        }
    }

    /// This session's reserves still waiting.
    pub fn waiting(&self) -> impl Iterator<Item = &Ticket> {
        self.waiting.iter().map(|(t, _)| t)
    }

    /// `release(resource, domain, copies, groups)`: gives back copies this
    /// session holds under exactly that group set.
    pub async fn release(&mut self, hold: &Hold, copies: u64) -> Result<CopyStatus, LimitError> {
        self.release_ready(hold, copies, false).await
    }

    /// [`Session::release`]; with `result_ready` on a resource of
    /// `wait_mode: shared_result`, every waiter of the hold's (resource,
    /// domain) is answered with no copy and `result_ready` (SPEC §14).
    pub async fn release_ready(
        &mut self,
        hold: &Hold,
        copies: u64,
        result_ready: bool,
    ) -> Result<CopyStatus, LimitError> {
        let copies = positive_count("copies", copies)?;
        self.check_held(hold, copies)?;
        let shared = result_ready
            && self
                .limiter
                .config()
                .copy(&hold.resource, "release")
                .is_ok_and(|(c, _)| c.wait_mode == WaitMode::SharedResult);
        let _op = self.limiter.holds.operation().await;
        let status = self
            .limiter
            .store
            .release_ready(hold, copies, shared)
            .await?;
        self.forget(hold, copies);
        Ok(status)
    }

    /// `transfer(resource, domain, copies, groups, ttl)`: stages held copies
    /// for another session to seize; returns the transfer id.
    pub async fn transfer(
        &mut self,
        hold: &Hold,
        copies: u64,
        ttl: Millis,
    ) -> Result<String, LimitError> {
        let copies = positive_count("copies", copies)?;
        let ttl = transfer_ttl(ttl)?;
        self.check_held(hold, copies)?;
        let _op = self.limiter.holds.operation().await;
        let id = self.limiter.store.transfer(hold, copies, ttl).await?;
        self.forget(hold, copies);
        Ok(id)
    }

    /// `seize(transfer_id)`: the staged copies become this session's hold.
    pub async fn seize(&mut self, transfer_id: &str) -> Result<Staged, LimitError> {
        // Ids may embed the resource name (the Redis store routes by it),
        // so they may be longer than a name.
        if transfer_id.is_empty()
            || transfer_id.len() > 2_048
            || transfer_id.chars().any(char::is_control)
        {
            return Err(ClientError::invalid(
                "transfer_id must be 1 to 2048 bytes without control characters",
            )
            .into());
        }
        let _op = self.limiter.holds.operation().await;
        let staged = self
            .limiter
            .store
            .seize(transfer_id)
            .await?
            .ok_or_else(|| ClientError::UnknownTransfer(transfer_id.to_owned()))?;
        *lock(&self.holds).entry(staged.hold.clone()).or_default() += staged.copies;
        Ok(staged)
    }

    /// Copies this session holds, by hold (a copy: the set may change
    /// while the caller looks).
    pub fn holds(&self) -> impl Iterator<Item = (Hold, u64)> + use<> {
        let holds: Vec<(Hold, u64)> = lock(&self.holds)
            .iter()
            .map(|(h, &n)| (h.clone(), n))
            .collect();
        holds.into_iter()
    }

    /// Copies this session holds in all.
    pub fn held_copies(&self) -> u64 {
        lock(&self.holds).values().sum()
    }

    /// Ends the session, releasing every hold: one release per (resource,
    /// domain, group set), as paper §4.3.1 describes. Returns the copies
    /// released. On a store error the holds not yet released are returned
    /// with it, so the caller can retry them with
    /// [`Limiter::release_ended`]; until then they still count as this
    /// server's holds.
    pub async fn end(mut self) -> Result<u64, (LimitError, Vec<(Hold, u64)>)> {
        let tickets: Vec<Ticket> = self.waiting().cloned().collect();
        for ticket in tickets {
            // A store error leaves the waiter to its deadline, when the
            // store rejects it; nothing is granted to it after that.
            let _ = self.leave_wait(&ticket).await;
        }
        let mut released = 0;
        loop {
            let op = self.limiter.holds.operation().await;
            let Some((hold, n)) = lock(&self.holds).pop_first() else {
                return Ok(released);
            };
            if let Err(e) = self.limiter.store.release(&hold, n).await {
                let mut left = vec![(hold, n)];
                left.extend(std::mem::take(&mut *lock(&self.holds)));
                self.limiter.holds.add_ended(&left);
                drop(op);
                return Err((e.into(), left));
            }
            released += n;
        }
    }

    fn check_held(&self, hold: &Hold, copies: u64) -> Result<(), LimitError> {
        check_name("resource", &hold.resource)?;
        check_name("domain", &hold.domain)?;
        for g in &hold.groups {
            check_name("group", g)?;
        }
        let held = lock(&self.holds).get(hold).copied().unwrap_or(0);
        if held < copies {
            return Err(ClientError::NotHeld {
                resource: hold.resource.clone(),
                domain: hold.domain.clone(),
                groups: hold.groups.clone(),
                held,
                asked: copies,
            }
            .into());
        }
        Ok(())
    }

    fn forget(&mut self, hold: &Hold, copies: u64) {
        let mut holds = lock(&self.holds);
        if let Some(n) = holds.get_mut(hold) {
            *n = n.saturating_sub(copies);
            if *n == 0 {
                holds.remove(hold);
            }
        }
    }
}
