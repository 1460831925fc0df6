use thiserror::Error;

/// Why an operation got no answer the application can act on.
///
/// A rejection is not an error (it is an answer with `granted = 0`), and in
/// degraded mode a server that cannot be reached is not an error either
/// (the client grants on its own, marked as degraded).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// The request is wrong (SPEC §5 client error): unknown resource, wrong
    /// kind, copies not held, bad transfer id, invalid numbers. Retrying will
    /// not help.
    #[error("client error: {0}")]
    Client(String),
    /// The server or its store failed (SPEC §5 server error) and degraded
    /// mode is off, or the operation cannot be degraded (seize, transfer).
    #[error("server error: {0}")]
    Server(String),
}

impl Error {
    /// Classifies a gRPC status (see the server's `status` module): the
    /// server sets `charon-error-class`; without it, the code decides.
    pub(crate) fn from_status(s: &tonic::Status) -> Self {
        let class = s
            .metadata()
            .get("charon-error-class")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let client = match class.as_deref() {
            Some("client") => true,
            Some(_) => false,
            None => matches!(
                s.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::NotFound
                    | tonic::Code::FailedPrecondition
                    | tonic::Code::OutOfRange
                    | tonic::Code::ResourceExhausted
            ),
        };
        if client {
            Error::Client(s.message().to_owned())
        } else {
            Error::Server(format!("{}: {}", s.code(), s.message()))
        }
    }

    /// Whether this is a server error (degraded mode may grant instead).
    pub fn is_server(&self) -> bool {
        matches!(self, Error::Server(_))
    }
}
