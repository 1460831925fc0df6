//! What this server knows of its own membership ([`MemberState`]): its
//! generation, its last renewal, whether it resigned, the copy gate and
//! the resources known to be in its key set; and the checks and updates of
//! it that every copy operation and the renewal loop go through.

use std::collections::HashSet;
use std::sync::{Arc, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use super::RedisStore;
use crate::{HoldSource, StoreError};

/// What this member knows about its membership.
#[derive(Debug)]
pub(super) struct MemberState {
    /// The copy log's generation this member joined (see `renew.lua`).
    pub(super) generation: String,
    /// When the latest successful renewal (or the join) was sent.
    pub(super) renewed: Instant,
    /// Why this member resigned, once it has.
    pub(super) resigned: Option<String>,
    /// Resources (escaped tags) known to be in this member's key set.
    pub(super) known: HashSet<String>,
    /// Bumped whenever `known` is emptied, so that an operation that
    /// started before does not put back what it learned.
    pub(super) epoch: u64,
    /// Redis lost its data: this member must rebuild its contributions
    /// from its sessions' holds before it touches copies again.
    pub(super) rebuild_pending: bool,
    /// Whether reserves may run: false while the copy gate of a new
    /// generation is closed (see `members.lua`).
    pub(super) gate_open: bool,
}

impl RedisStore {
    pub(super) fn lock(&self) -> MutexGuard<'_, MemberState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The test clock's time, or '' for Redis TIME.
    pub(super) fn clock_arg(&self) -> String {
        self.clock.arg()
    }

    /// Checks that this member may change copy counts now (`reserves`:
    /// and add to them). It must not have resigned; its latest renewal must
    /// be less than half a ttl old, so that whatever it sends lands while
    /// its liveness key surely exists (nobody can fence it then); it must
    /// have rebuilt its holds after Redis lost its data; and reserves wait
    /// until every member has (the copy gate). All but resignation pass
    /// by themselves: they are server errors, and clients fail open.
    pub(super) fn check_member(&self, reserves: bool) -> Result<(), StoreError> {
        let s = self.lock();
        if let Some(why) = &s.resigned {
            return Err(StoreError::Resigned(why.clone()));
        }
        let since = s.renewed.elapsed();
        if since > self.ttl / 2 {
            return Err(StoreError::Unavailable(format!(
                "this server's liveness was last renewed {since:?} ago (ttl {:?}); \
                 copy operations wait for the next renewal",
                self.ttl
            )));
        }
        if s.rebuild_pending {
            return Err(StoreError::Unavailable(
                "Redis lost the copy counts; this server is rebuilding its sessions' holds".into(),
            ));
        }
        if reserves && !s.gate_open {
            return Err(StoreError::Unavailable(
                "copy counts of a new Redis generation are being rebuilt; \
                 reserves wait until every server has rebuilt its holds"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The hold sets of this server, if a [`HoldSource`] is attached and
    /// still there.
    pub(super) fn hold_source(&self) -> Option<Arc<dyn HoldSource>> {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Records whether the copy gate is open, logging when reserves open
    /// again after a new generation of the copy log.
    pub(super) fn note_gate(&self, open: bool) {
        let was = std::mem::replace(&mut self.lock().gate_open, open);
        if open && !was {
            tracing::info!(
                "copy reserves are open: the copy counts of this Redis generation are complete"
            );
        }
    }

    /// A copy operation saw another generation in Redis: its effect there
    /// is overwritten by the rebuild, and copies wait until it is done.
    pub(super) fn generation_lost(&self) {
        {
            let mut s = self.lock();
            s.rebuild_pending = true;
            s.gate_open = false;
        }
        self.wake.notify_one();
    }

    /// Resigns for good; every later copy operation fails.
    pub(super) fn resign(&self, why: String) -> StoreError {
        let mut s = self.lock();
        let why = s.resigned.get_or_insert(why).clone();
        StoreError::Resigned(why)
    }

    pub(super) fn resigned(&self) -> Option<StoreError> {
        self.lock().resigned.clone().map(StoreError::Resigned)
    }

    /// After a failed operation: if Redis may have restarted, this member's
    /// key set may be gone, so every resource is added again on next use.
    pub(super) fn on_error(&self, e: &StoreError) {
        if matches!(e, StoreError::Unavailable(_)) {
            self.forget_known();
        }
    }

    pub(super) fn forget_known(&self) {
        let mut s = self.lock();
        s.known.clear();
        s.epoch += 1;
    }

    /// The command that adds `tag` to this member's key set, unless it is
    /// known to be there, and the epoch to remember it under.
    pub(super) fn key_set_add(&self, tag: &str) -> (Vec<redis::Cmd>, u64) {
        let s = self.lock();
        if s.known.contains(tag) {
            return (Vec::new(), s.epoch);
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.keys.key_set(&self.member)).arg(tag);
        (vec![cmd], s.epoch)
    }

    pub(super) fn key_set_added(&self, tag: &str, epoch: u64) {
        let mut s = self.lock();
        if s.epoch == epoch && !s.known.contains(tag) {
            s.known.insert(tag.to_owned());
        }
    }
}
