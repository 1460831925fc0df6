//! Where the in-memory store leaves the answers to waiters (SPEC §14):
//! one slot per ticket, filled under the resource's lock when the queue
//! serves the waiter, and a wake-up for the task that waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use charon_core::copy::{Decided, ReserveReply};
use tokio::sync::Notify;

#[derive(Default)]
struct Slot {
    decided: Option<ReserveReply>,
    wake: Arc<Notify>,
}

/// The slots of every waiter of the store.
#[derive(Default)]
pub(super) struct Waits {
    next: AtomicU64,
    slots: Mutex<HashMap<u64, Slot>>,
}

impl Waits {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new ticket with an empty slot (tickets start at 1: 0 names a
    /// reserve that does not wait).
    pub(super) fn issue(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.slots().insert(id, Slot::default());
        id
    }

    /// Leaves each answer in its slot and wakes its waiter.
    pub(super) fn deliver(&self, decided: Vec<Decided>) {
        if decided.is_empty() {
            return;
        }
        let mut slots = self.slots();
        for d in decided {
            if let Some(slot) = slots.get_mut(&d.ticket) {
                slot.decided = Some(d.reply);
                slot.wake.notify_one();
            }
        }
    }

    /// The answer of `id`, taken with its slot; `None` while it waits.
    pub(super) fn take(&self, id: u64) -> Option<ReserveReply> {
        let mut slots = self.slots();
        let decided = slots.get_mut(&id)?.decided.take()?;
        slots.remove(&id);
        Some(decided)
    }

    /// Forgets `id`'s slot.
    pub(super) fn forget(&self, id: u64) {
        self.slots().remove(&id);
    }

    /// What wakes `id`'s waiter.
    pub(super) fn wake(&self, id: u64) -> Option<Arc<Notify>> {
        self.slots().get(&id).map(|s| s.wake.clone())
    }
}
