//! The limiting service without a protocol.
//!
//! A [`Limiter`] holds the configuration in force (swapped atomically on
//! reload) and a store; a [`Session`] is one client's session of SPEC §3,
//! owning the holds it made or seized and releasing them all when it ends.
//! The gRPC server, the simulator and the HTTP simulator endpoint are thin
//! shells around these two types, so every protocol decides the same way.

mod error;
mod holds;
mod session;
pub mod simulation;

use std::sync::Arc;

use arc_swap::ArcSwap;
use charon_core::config::Config;
use charon_core::copy::{CopyStatus, Hold};
use charon_core::rate::RateReply;
use charon_core::request::{Amount, check_name};
use charon_store::{HoldSource, Store};

use self::holds::Registry;

pub use error::LimitError;
pub use session::Session;

/// Configuration in force plus the store that holds the state, and the
/// hold sets of every session (which the store may need to rebuild its
/// copy counts).
#[derive(Debug)]
pub struct Limiter {
    config: ArcSwap<Config>,
    store: Arc<dyn Store>,
    holds: Arc<Registry>,
}

impl Limiter {
    /// A limiter enforcing `config` over `store`; the store is told where
    /// this limiter's hold sets are (the last limiter built over a store
    /// is the one it asks).
    pub fn new(config: Config, store: Arc<dyn Store>) -> Arc<Self> {
        let holds = Arc::new(Registry::default());
        let source: Arc<dyn HoldSource> = holds.clone();
        store.attach_holds(Arc::downgrade(&source));
        Arc::new(Self {
            config: ArcSwap::from_pointee(config),
            store,
            holds,
        })
    }

    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Puts `config` in force for every request that starts after this
    /// returns. State is kept: a lowered limit applies to hits already in
    /// the window.
    pub fn replace_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// `request(resource, domain, copies, min_copies)` for a rate-limited
    /// resource (SPEC §2). Needs no session: hits are never given back.
    pub async fn request(
        &self,
        resource: &str,
        domain: &str,
        amount: Amount,
    ) -> Result<RateReply, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        let config = self.config.load();
        let (rate, enforcement) = config.rate(resource)?;
        let limits = rate.limits_for(domain);
        Ok(self
            .store
            .request(resource, domain, limits, amount, enforcement)
            .await?)
    }

    /// Opens a session (SPEC §3): the owner of holds.
    pub fn session(self: &Arc<Self>) -> Session {
        Session::new(self.clone())
    }

    /// Releases copies of a session that ended while the store could not
    /// be reached ([`Session::end`] returned them): until then they are
    /// still counted as this server's holds.
    pub async fn release_ended(&self, hold: &Hold, copies: u64) -> Result<CopyStatus, LimitError> {
        let _op = self.holds.operation().await;
        let status = self.store.release(hold, copies).await?;
        self.holds.remove_ended(hold, copies);
        Ok(status)
    }

    /// Gives up releasing copies of an ended session: they are no longer
    /// counted as this server's holds (a later rebuild of the store's
    /// counts leaves them out).
    pub fn abandon_ended(&self, holds: &[(Hold, u64)]) {
        for (hold, n) in holds {
            self.holds.remove_ended(hold, *n);
        }
    }
}
