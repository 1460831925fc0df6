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
    /// A dependency failed; do not retry on this server at once.
    #[error(transparent)]
    Server(#[from] StoreError),
}

impl LimitError {
    /// `client` or `server`, as metrics and the simulator label it.
    pub fn class(&self) -> &'static str {
        match self {
            LimitError::Client(_) => "client",
            LimitError::Server(_) => "server",
        }
    }
}
