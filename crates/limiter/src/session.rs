//! A client session: the hold set of paper §4.2, kept by the server that
//! the session is bound to.

use std::collections::BTreeMap;
use std::sync::Arc;

use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::rate::RateReply;
use charon_core::request::{Amount, check_name, positive_count, transfer_ttl};
use charon_core::{ClientError, Millis};

use crate::{LimitError, Limiter};

/// One session of SPEC §3. Every hold belongs to the session that made or
/// seized it; [`Session::end`] releases them all.
#[derive(Debug)]
pub struct Session {
    limiter: Arc<Limiter>,
    holds: BTreeMap<Hold, u64>,
}

impl Session {
    pub(crate) fn new(limiter: Arc<Limiter>) -> Self {
        Self {
            limiter,
            holds: BTreeMap::new(),
        }
    }

    /// A rate-limited request on this session's connection (hits are not
    /// held, so this is [`Limiter::request`]).
    pub async fn request(
        &self,
        resource: &str,
        domain: &str,
        amount: Amount,
    ) -> Result<RateReply, LimitError> {
        self.limiter.request(resource, domain, amount).await
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
            *self.holds.entry(hold).or_default() += reply.granted;
        }
        Ok(reply)
    }

    /// `release(resource, domain, copies, groups)`: gives back copies this
    /// session holds under exactly that group set.
    pub async fn release(&mut self, hold: &Hold, copies: u64) -> Result<CopyStatus, LimitError> {
        let copies = positive_count("copies", copies)?;
        self.check_held(hold, copies)?;
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
        let staged = self
            .limiter
            .store
            .seize(transfer_id)
            .await?
            .ok_or_else(|| ClientError::UnknownTransfer(transfer_id.to_owned()))?;
        *self.holds.entry(staged.hold.clone()).or_default() += staged.copies;
        Ok(staged)
    }

    /// Copies this session holds, by hold.
    pub fn holds(&self) -> impl Iterator<Item = (&Hold, u64)> {
        self.holds.iter().map(|(h, &n)| (h, n))
    }

    /// Copies this session holds in all.
    pub fn held_copies(&self) -> u64 {
        self.holds.values().sum()
    }

    /// Ends the session, releasing every hold: one release per (resource,
    /// domain, group set), as paper §4.3.1 describes. Returns the copies
    /// released. On a store error the holds not yet released are returned
    /// with it, so the caller can retry them.
    pub async fn end(mut self) -> Result<u64, (LimitError, Vec<(Hold, u64)>)> {
        let mut released = 0;
        while let Some((hold, n)) = self.holds.pop_first() {
            if let Err(e) = self.limiter.store.release(&hold, n).await {
                let mut left = vec![(hold, n)];
                left.extend(std::mem::take(&mut self.holds));
                return Err((e.into(), left));
            }
            released += n;
        }
        Ok(released)
    }

    fn check_held(&self, hold: &Hold, copies: u64) -> Result<(), LimitError> {
        check_name("resource", &hold.resource)?;
        check_name("domain", &hold.domain)?;
        for g in &hold.groups {
            check_name("group", g)?;
        }
        let held = self.holds.get(hold).copied().unwrap_or(0);
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
        if let Some(n) = self.holds.get_mut(hold) {
            *n -= copies;
            if *n == 0 {
                self.holds.remove(hold);
            }
        }
    }
}
