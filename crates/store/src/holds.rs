//! What this server's sessions hold, as the layer above knows it.
//!
//! The store sits below the limiter, which keeps every session's hold set
//! (paper §4.2). When Redis loses its data, the copy counts can only be
//! rebuilt from those hold sets, so the Redis store asks for them through
//! this trait; the limiter implements it and registers itself at start
//! ([`crate::Store::attach_holds`]).

use async_trait::async_trait;
use charon_core::copy::Hold;

/// Gives the store a consistent view of every copy this server's sessions
/// hold.
#[async_trait]
pub trait HoldSource: Send + Sync {
    /// Every hold of this server (live sessions, and sessions that ended
    /// while their release could not reach the store), summed by hold.
    /// Copy operations are paused until the snapshot is dropped, so that
    /// none changes a hold set between reading it and writing it to the
    /// store.
    async fn snapshot(&self) -> HoldSnapshot;
}

/// The holds of a [`HoldSource`], with copy operations paused while it
/// lives.
pub struct HoldSnapshot {
    holds: Vec<(Hold, u64)>,
    _paused: Box<dyn Send + Sync>,
}

impl HoldSnapshot {
    /// `holds`, with `paused` (whatever keeps copy operations waiting)
    /// held until the snapshot is dropped.
    pub fn new(holds: Vec<(Hold, u64)>, paused: impl Send + Sync + 'static) -> Self {
        Self {
            holds,
            _paused: Box::new(paused),
        }
    }

    /// Copies held, by hold.
    pub fn holds(&self) -> &[(Hold, u64)] {
        &self.holds
    }
}

impl std::fmt::Debug for HoldSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldSnapshot")
            .field("holds", &self.holds)
            .finish_non_exhaustive()
    }
}
