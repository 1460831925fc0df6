use charon_core::ClientError;
use charon_store::StoreError;
use thiserror::Error;

/// Why an operation got no ordinary reply: the two classes of SPEC §5,
/// kept apart so no protocol can confuse them (or either with a rejection).
#[derive(Debug, Clone, Error)]
pub enum LimitError {
    /// The request is wrong; sending it again will not help.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A dependency failed; do not retry on this server at once. Never
    /// [`StoreError::Refused`]: see the `From` conversion.
    #[error(transparent)]
    Server(StoreError),
}

impl From<StoreError> for LimitError {
    /// A store's error is a server error, except a refusal the store's
    /// atomic step made for the client's sake (a count would pass
    /// `charon_core::MAX_COUNT`), which is the client error it carries.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Refused(c) => LimitError::Client(c),
            other => LimitError::Server(other),
        }
    }
}

impl LimitError {
    /// `client` or `server`, as metrics and the simulator label it.
    pub fn class(&self) -> &'static str {
        match self {
            LimitError::Client(_) | LimitError::Server(StoreError::Refused(_)) => "client",
            LimitError::Server(_) => "server",
        }
    }
}
