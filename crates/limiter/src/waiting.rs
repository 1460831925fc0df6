//! A session's reserves that wait for copies (SPEC §14), followed up
//! without the session: a server answers other operations of the session
//! (a release of another hold, say) while a reserve waits, so the wait is
//! a [`Waiter`] handle that shares the session's hold set and list of
//! waiting tickets.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use charon_core::copy::{Hold, ReserveReply};
use charon_store::Ticket;

use crate::holds::{HoldSet, lock};
use crate::{LimitError, Limiter};

/// A session's waiting tickets, with their domains.
pub(crate) type Tickets = Arc<Mutex<Vec<(Ticket, String)>>>;

/// One waiting reserve of a session.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) holds: HoldSet,
    pub(crate) tickets: Tickets,
    pub(crate) ticket: Ticket,
    pub(crate) domain: String,
}

impl Waiter {
    /// The store's ticket of this reserve.
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// The answer if the store has decided (a grant becomes the session's
    /// hold); `None` while it waits.
    pub async fn poll(&self) -> Result<Option<ReserveReply>, LimitError> {
        let op = self.limiter.holds.operation().await;
        let answer = self.limiter.store.wait_outcome(&self.ticket).await?;
        drop(op);
        if let Some(reply) = &answer {
            self.settle(reply).await;
        }
        Ok(answer)
    }

    /// Takes the reserve out of its queue; a grant it had already got
    /// becomes the session's hold.
    pub async fn leave(&self) -> Result<(), LimitError> {
        let op = self.limiter.holds.operation().await;
        let answer = self.limiter.store.leave_queue(&self.ticket).await?;
        drop(op);
        match answer {
            Some(reply) => self.settle(&reply).await,
            None => lock(&self.tickets).retain(|(t, _)| *t != self.ticket),
        }
        Ok(())
    }

    /// Whether the session still waits on this ticket (its end takes
    /// every ticket out).
    fn waits(&self) -> bool {
        lock(&self.tickets).iter().any(|(t, _)| *t == self.ticket)
    }

    /// Records the answer as the session's and forgets the ticket. If the
    /// session has ended meanwhile (its end took the ticket out), copies
    /// granted have nobody to hold them: they are released at once. The
    /// ticket list stays locked while the hold is recorded, so that the
    /// session's end (which clears the list before releasing its holds)
    /// either sees the hold or leaves it to this.
    async fn settle(&self, reply: &ReserveReply) {
        let hold = Hold {
            resource: self.ticket.resource.clone(),
            domain: self.domain.clone(),
            groups: reply.group_set(),
        };
        {
            let mut tickets = lock(&self.tickets);
            if let Some(i) = tickets.iter().position(|(t, _)| *t == self.ticket) {
                tickets.swap_remove(i);
                if reply.granted > 0 {
                    *lock(&self.holds).entry(hold).or_default() += reply.granted;
                }
                return;
            }
        }
        if reply.granted > 0 {
            let _op = self.limiter.holds.operation().await;
            if let Err(e) = self.limiter.store.release(&hold, reply.granted).await {
                tracing::warn!(error = %e, "could not give back copies granted to an ended session");
            }
        }
    }

    /// Waits in real time up to `wait_ms` (from now) for the answer.
    /// `None` if `gone` finished first or the session ended: the reserve
    /// has then left the queue.
    pub async fn wait(
        &self,
        wait_ms: u64,
        gone: impl Future<Output = ()>,
    ) -> Result<Option<ReserveReply>, LimitError> {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut gone = std::pin::pin!(gone);
        loop {
            if !self.waits() {
                return Ok(None);
            }
            match self.poll().await {
                Ok(Some(reply)) => return Ok(Some(reply)),
                Ok(None) => {}
                Err(e) => {
                    // Best effort: a waiter nobody follows up must not be
                    // handed copies; the session's end tries again.
                    let _ = self.leave().await;
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
                    self.leave().await?;
                    return Ok(None);
                }
                () = store.woken(&self.ticket, nap) => {}
            }
        }
    }
}
