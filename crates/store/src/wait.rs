//! The store's side of waiting for a copy (SPEC §14): what a reserve that
//! may wait comes to, and the ticket a waiter is known by while the store
//! decides for it. The rule (arrival order, passing over, stopping) is
//! `charon_core::copy`'s; a store keeps the queue beside the counts and
//! serves it in the same atomic step as every change of the counts.

use charon_core::Millis;
use charon_core::copy::ReserveReply;

/// How a reserve may wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitOptions {
    /// How long it may wait (0: answered at once).
    pub wait_ms: Millis,
    /// The resource's `queue_limit`: the most callers that may wait.
    pub queue_limit: u64,
}

/// What a reserve that may wait came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Answered at once.
    Now(ReserveReply),
    /// Waiting in the resource's queue: the store decides for it later
    /// (ask with [`crate::Store::wait_outcome`]).
    Waiting(Ticket),
}

/// A waiter as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ticket {
    /// The resource it waits for.
    pub resource: String,
    /// Its number, unique in the store while it waits.
    pub id: u64,
}
