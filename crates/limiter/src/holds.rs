//! Every hold set of this server, for a store that must rebuild its copy
//! counts from them (the Redis store after Redis lost its data).
//!
//! Each session keeps its hold set here; copy operations run under a
//! shared pause lock, which a snapshot takes exclusively, so that no
//! operation is half done (applied in the store, not yet in its hold set)
//! while the store reads the holds and writes them back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use charon_core::copy::Hold;
use charon_store::{HoldSnapshot, HoldSource};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// One session's holds: copies held by hold.
pub(crate) type HoldSet = Arc<Mutex<BTreeMap<Hold, u64>>>;

/// The hold sets of every live session, and the holds of sessions that
/// ended while their release could not reach the store.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pause: Arc<RwLock<()>>,
    sessions: Mutex<HashMap<u64, HoldSet>>,
    ended: Mutex<BTreeMap<Hold, u64>>,
    next: AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    /// A new session's id and (empty) hold set.
    pub(crate) fn register(&self) -> (u64, HoldSet) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let set = HoldSet::default();
        lock(&self.sessions).insert(id, set.clone());
        (id, set)
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.sessions).remove(&id);
    }

    /// Held for the whole of one copy operation (store call and hold set
    /// update); a snapshot waits for it.
    pub(crate) async fn operation(&self) -> OwnedRwLockReadGuard<()> {
        self.pause.clone().read_owned().await
    }

    /// Holds of an ended session whose release failed: still counted in
    /// the store, so still this server's until released.
    pub(crate) fn add_ended(&self, holds: &[(Hold, u64)]) {
        let mut ended = lock(&self.ended);
        for (hold, n) in holds {
            *ended.entry(hold.clone()).or_default() += n;
        }
    }

    /// Forgets `copies` of an ended session's `hold` (released, or given
    /// up on).
    pub(crate) fn remove_ended(&self, hold: &Hold, copies: u64) {
        let mut ended = lock(&self.ended);
        if let Some(n) = ended.get_mut(hold) {
            *n = n.saturating_sub(copies);
            if *n == 0 {
                ended.remove(hold);
            }
        }
    }
}

#[async_trait]
impl HoldSource for Registry {
    async fn snapshot(&self) -> HoldSnapshot {
        let paused = self.pause.clone().write_owned().await;
        let mut all: BTreeMap<Hold, u64> = lock(&self.ended).clone();
        let sessions: Vec<HoldSet> = lock(&self.sessions).values().cloned().collect();
        for set in sessions {
            for (hold, n) in lock(&set).iter() {
                *all.entry(hold.clone()).or_default() += n;
            }
        }
        HoldSnapshot::new(all.into_iter().collect(), paused)
    }
}
