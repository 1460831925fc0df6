//! A hash table split into independently locked shards, so that requests
//! for different (resource, domain) pairs almost never wait for each other
//! and no global lock sits on the hot path.

use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

/// Entries that know their own hash (computed once, when inserted), so the
/// table can grow without re-hashing keys.
pub(crate) trait Hashed {
    fn hash(&self) -> u64;
}

pub(crate) struct Shards<E> {
    shards: Box<[Mutex<HashTable<E>>]>,
}

impl<E: Hashed> Shards<E> {
    /// `count` shards, rounded up to a power of two.
    pub(crate) fn new(count: usize) -> Self {
        let count = count.max(1).next_power_of_two();
        Self {
            shards: (0..count).map(|_| Mutex::new(HashTable::new())).collect(),
        }
    }

    /// The locked shard for `hash`. The shard index comes from middle bits
    /// of the hash: the table inside uses the low bits for its buckets and
    /// the top seven for its tags, and sharing them would crowd buckets.
    pub(crate) fn lock(&self, hash: u64) -> MutexGuard<'_, HashTable<E>> {
        self.lock_index(self.index(hash))
    }

    /// The shard index of `hash`.
    pub(crate) fn index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    fn lock_index(&self, i: usize) -> MutexGuard<'_, HashTable<E>> {
        // A panic while a shard was locked cannot leave it half-updated in a
        // way later requests should fear more than a dead limiter.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Finds the entry for `hash` matching `is`, inserting `make()` if
    /// there is none, and runs `f` on it.
    pub(crate) fn with<R>(
        &self,
        hash: u64,
        is: impl Fn(&E) -> bool,
        make: impl FnOnce() -> E,
        f: impl FnOnce(&mut E) -> R,
    ) -> R {
        let mut shard = self.lock(hash);
        match shard.find_mut(hash, is) {
            Some(e) => f(e),
            None => f(shard.insert_unique(hash, make(), E::hash).into_mut()),
        }
    }

    /// The shards of every hash in `hashes`, each locked once, in
    /// increasing index order: every caller that holds several takes them
    /// in that order, so two batches never wait for each other in a cycle.
    pub(crate) fn lock_many(&self, hashes: impl IntoIterator<Item = u64>) -> LockedShards<'_, E> {
        let mut indices: Vec<usize> = hashes.into_iter().map(|h| self.index(h)).collect();
        indices.sort_unstable();
        indices.dedup();
        LockedShards {
            shards: self,
            guards: indices
                .into_iter()
                .map(|i| (i, self.lock_index(i)))
                .collect(),
        }
    }

    /// Keeps only the entries for which `keep` holds, shard by shard, and
    /// gives memory back when a shard has shrunk a lot.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&mut E) -> bool) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut t = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let before = t.len();
            t.retain(&mut keep);
            removed += before - t.len();
            if t.capacity() > 64 && t.len() * 4 < t.capacity() {
                t.shrink_to_fit(E::hash);
            }
        }
        removed
    }

    /// Visits every entry, shard by shard.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&E)) {
        for shard in &self.shards {
            shard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .for_each(&mut f);
        }
    }
}

/// Shards locked together ([`Shards::lock_many`]).
pub(crate) struct LockedShards<'s, E> {
    shards: &'s Shards<E>,
    guards: Vec<(usize, MutexGuard<'s, HashTable<E>>)>,
}

impl<E: Hashed> LockedShards<'_, E> {
    /// The locked table of `hash`'s shard. Callers ask only for the
    /// hashes they locked; another one's shard is locked then (out of
    /// order, but never while waiting on this set).
    pub(crate) fn table(&mut self, hash: u64) -> &mut HashTable<E> {
        let i = self.shards.index(hash);
        let at = match self.guards.iter().position(|(j, _)| *j == i) {
            Some(at) => at,
            None => {
                self.guards.push((i, self.shards.lock_index(i)));
                self.guards.len() - 1
            }
        };
        &mut self.guards[at].1
    }
}
