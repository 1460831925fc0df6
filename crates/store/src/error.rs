//! The server-error class of SPEC §5, as the stores raise it.

use thiserror::Error;

/// A store could not give an answer. Never a rejection and never the
/// client's fault: the client should not retry on the same server at once.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The store cannot be reached or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that makes no sense (a bug or foreign
    /// data under our keys).
    #[error("store returned bad data: {0}")]
    BadData(String),
    /// This server's membership lapsed and it has resigned (Redis store).
    #[error("this server has resigned: {0}")]
    Resigned(String),
}
