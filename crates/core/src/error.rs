//! The client-error class of SPEC §5.
//!
//! A client error means "this request is wrong and will stay wrong if you
//! send it again". It is never confused with a rejection (an ordinary reply
//! with `granted = 0`) nor with a server error (a dependency is down), which
//! belongs to the store and server crates.

use thiserror::Error;

/// Why a request was refused as malformed or meaningless.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientError {
    /// A field is missing, has the wrong type or an impossible value.
    #[error("{0}")]
    InvalidArgument(String),
    /// The resource is not configured and its namespace does not
    /// `allow_unconfigured`.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// A copy operation on a rate-limited resource or the reverse.
    #[error(
        "resource {resource:?} is {actual}-limited; {operation} needs a {expected}-limited resource"
    )]
    WrongKind {
        resource: String,
        operation: &'static str,
        expected: &'static str,
        actual: &'static str,
    },
    /// A release or transfer of more copies than the session holds under
    /// that (resource, domain, group set).
    #[error(
        "this session holds {held} copies of {resource:?} for domain {domain:?} under groups {groups:?}; cannot give back {asked}"
    )]
    NotHeld {
        resource: String,
        domain: String,
        groups: Vec<String>,
        held: u64,
        asked: u64,
    },
    /// A seize of a transfer id that never existed, was already seized or
    /// whose ttl has passed (the paper notes these may be indistinguishable).
    #[error("unknown or expired transfer id {0:?}")]
    UnknownTransfer(String),
}

impl ClientError {
    /// Shorthand for [`ClientError::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument(message.into())
    }
}
