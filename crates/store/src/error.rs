//! The server-error class of SPEC §5, as the stores raise it, and the one
//! client error only a store's atomic step can find.

use charon_core::ClientError;
use thiserror::Error;

/// A store could not give an answer. Never a rejection, and never the
/// client's fault (the client should not retry on the same server at once)
/// except [`StoreError::Refused`].
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The client's fault after all (SPEC §5 client class), found inside
    /// the store's atomic step because it depends on the counts there: a
    /// grant would take a count beyond `charon_core::MAX_COUNT` (see
    /// `charon_core::bound`). Nothing changed. The limiter reports it as a
    /// client error, never as a server error.
    #[error(transparent)]
    Refused(ClientError),
    /// The store cannot be reached or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that makes no sense (a bug or foreign
    /// data under our keys).
    #[error("store returned bad data: {0}")]
    BadData(String),
    /// Redis refuses this server for good: the credentials of the store
    /// URL, the user's rights (`NOPERM`) or the TLS certificates. Waiting
    /// does not help (a server stops retrying at start-up); an operator
    /// must act. The message never holds the password.
    #[error("store refused this server: {0}")]
    Denied(String),
    /// This server's membership lapsed and it has resigned (Redis store).
    #[error("this server has resigned: {0}")]
    Resigned(String),
}
