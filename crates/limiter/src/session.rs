//! A client session: the hold set of paper §4.2, kept by the server that
//! the session is bound to.

use std::sync::Arc;

use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::request::{Amount, check_name, positive_count, transfer_ttl};
use charon_core::{ClientError, Millis};

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
}

impl Drop for Session {
    fn drop(&mut self) {
        self.limiter.holds.unregister(self.id);
    }
}

impl Session {
    pub(crate) fn new(limiter: Arc<Limiter>) -> Self {
        let (id, holds) = limiter.holds.register();
        Self { limiter, id, holds }
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
        if reply.granted > 0 {
            let hold = Hold {
                resource: resource.to_owned(),
                domain: domain.to_owned(),
                groups: reply.group_set(),
            };
            *lock(&self.holds).entry(hold).or_default() += reply.granted;
        }
        Ok(reply)
    }

    /// `release(resource, domain, copies, groups)`: gives back copies this
    /// session holds under exactly that group set.
    pub async fn release(&mut self, hold: &Hold, copies: u64) -> Result<CopyStatus, LimitError> {
        let copies = positive_count("copies", copies)?;
        self.check_held(hold, copies)?;
        let _op = self.limiter.holds.operation().await;
        let status = self.limiter.store.release(hold, copies).await?;
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
    pub async fn end(self) -> Result<u64, (LimitError, Vec<(Hold, u64)>)> {
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
