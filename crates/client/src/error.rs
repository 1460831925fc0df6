//! The client's one error model: every failure has a [`Class`] (client or
//! server, SPEC §5), a typed [`ErrorKind`], the gRPC code when there is
//! one, and the address it concerns. Only the server class may be turned
//! into a degraded grant: a misconfigured caller (a wrong token, a
//! certificate mistake, the wrong port) gets an error at once, never a
//! grant it was not given.

use std::fmt;

/// The two classes of SPEC §5, and what degraded mode may do with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The caller or its configuration is wrong: retrying will not help,
    /// and degraded mode never grants instead.
    Client,
    /// Charon (or the network to it) failed: degraded mode may grant
    /// locally, by the caller's policy (`fail_open`).
    Server,
}

impl Class {
    /// `client` or `server`, as the `charon-error-class` metadata, the
    /// CLI's JSON and the Python client spell it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Client => "client",
            Class::Server => "server",
        }
    }
}

/// What went wrong, precisely enough to act on. Each kind belongs to one
/// [`Class`]; `docs/errors.md` lists them with the mistakes that cause
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is malformed or out of range (bad numbers, a message
    /// too large, arguments refused before anything was sent).
    InvalidRequest,
    /// An unknown resource or transfer id.
    NotFound,
    /// The operation does not fit the resource: wrong kind, copies not
    /// held.
    FailedPrecondition,
    /// No bearer token, or one the server does not know.
    Unauthenticated,
    /// A valid token that is not allowed the resource's namespace.
    PermissionDenied,
    /// TLS failed over certificates or settings: the server's certificate
    /// is not trusted, has expired or names another host; the server wants
    /// a client certificate and got none, or one it does not trust.
    Tls,
    /// The address answers, but not as a Charon gRPC server over this
    /// transport: an HTTP port, plain text spoken to a TLS port or TLS to
    /// a plain-text one, another gRPC service.
    WrongProtocol,
    /// The client's own settings cannot be used (an endpoint that is not a
    /// URL, a token that cannot be sent).
    Settings,
    /// Nothing accepts connections at the address (refused, no route, the
    /// name does not resolve).
    Unreachable,
    /// No answer within the time allowed.
    Timeout,
    /// The server answered that it cannot decide now (its store is down,
    /// no configuration loaded yet), or the connection broke.
    Unavailable,
    /// The server failed otherwise (an internal error, an answer that
    /// makes no sense).
    Internal,
}

impl ErrorKind {
    /// The class of this kind of error.
    pub fn class(self) -> Class {
        match self {
            ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::FailedPrecondition
            | ErrorKind::Unauthenticated
            | ErrorKind::PermissionDenied
            | ErrorKind::Tls
            | ErrorKind::WrongProtocol
            | ErrorKind::Settings => Class::Client,
            ErrorKind::Unreachable
            | ErrorKind::Timeout
            | ErrorKind::Unavailable
            | ErrorKind::Internal => Class::Server,
        }
    }

    /// The kind's name in snake case (`wrong_protocol`), as the CLI's JSON
    /// and the Python client's `CharonError.kind` spell it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Tls => "tls",
            ErrorKind::WrongProtocol => "wrong_protocol",
            ErrorKind::Settings => "settings",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Why an operation got no answer the application can act on.
///
/// A rejection is not an error (it is an answer with `granted = 0`), and in
/// degraded mode a server-class failure is not an error either (the
/// client grants on its own, marked as degraded). Its `Display` says the
/// class, what went wrong and, for an answer from a server, the gRPC code
/// and the address: `client error: unknown resource "x" (NOT_FOUND from
/// http://127.0.0.1:7070)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    code: Option<tonic::Code>,
    address: Option<String>,
    message: String,
    /// Whether a server answered with this status (then `Display` adds the
    /// code and the address; a transport failure names the address in its
    /// message).
    answered: bool,
}

impl Error {
    /// An error of `kind` with `message`, concerning no address yet.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            code: None,
            address: None,
            message: message.into(),
            answered: false,
        }
    }

    /// A request refused before it was sent (bad numbers, a hold that
    /// does not have the copies).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// This error as the answer of the server at `address` with `code`.
    pub(crate) fn answered(mut self, code: tonic::Code, address: &str) -> Self {
        self.code = Some(code);
        self.address = Some(address.to_owned());
        self.answered = true;
        self
    }

    /// This error with the gRPC code the transport reported (`UNAVAILABLE`
    /// for a refused connection, as every gRPC library says).
    pub(crate) fn with_code(mut self, code: tonic::Code) -> Self {
        self.code = Some(code);
        self
    }

    /// This error concerning `address`, unless it names one already.
    pub(crate) fn at(mut self, address: &str) -> Self {
        if self.address.is_none() {
            self.address = Some(address.to_owned());
        }
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Client or server class: only the server class may be degraded.
    pub fn class(&self) -> Class {
        self.kind.class()
    }

    /// Whether this is a server error (degraded mode may grant instead).
    pub fn is_server(&self) -> bool {
        self.class() == Class::Server
    }

    /// Whether this is a client error (never degraded: fix the request or
    /// the client's settings).
    pub fn is_client(&self) -> bool {
        self.class() == Class::Client
    }

    /// The gRPC status code, if the failure came as a gRPC status (from
    /// the server, or made up by the transport: `UNAVAILABLE` for a refused
    /// connection). `None` for errors found before anything was sent.
    pub fn code(&self) -> Option<tonic::Code> {
        self.code
    }

    /// The server address the failure concerns (the client's endpoint).
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// The cause, without the class.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error: {}", self.class().name(), self.message)?;
        match (&self.code, &self.address) {
            (Some(code), Some(address)) if self.answered => {
                write!(f, " ({} from {address})", code_name(*code))
            }
            _ => Ok(()),
        }
    }
}

impl std::error::Error for Error {}

/// The canonical name of a gRPC code (`NOT_FOUND`), as the gRPC
/// specification and the Python client spell it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_its_code_and_address_and_a_local_error_neither() {
        let e = Error::new(ErrorKind::NotFound, "unknown resource \"x\"")
            .answered(tonic::Code::NotFound, "http://127.0.0.1:7070");
        assert_eq!(
            e.to_string(),
            "client error: unknown resource \"x\" (NOT_FOUND from http://127.0.0.1:7070)"
        );
        assert_eq!(e.code(), Some(tonic::Code::NotFound));
        assert_eq!(e.address(), Some("http://127.0.0.1:7070"));
        let local = Error::invalid("need 1 <= min_copies <= copies");
        assert_eq!(
            local.to_string(),
            "client error: need 1 <= min_copies <= copies"
        );
        assert!(local.is_client() && local.code().is_none());
    }

    #[test]
    fn every_kind_has_one_class_and_a_distinct_name() {
        let kinds = [
            ErrorKind::InvalidRequest,
            ErrorKind::NotFound,
            ErrorKind::FailedPrecondition,
            ErrorKind::Unauthenticated,
            ErrorKind::PermissionDenied,
            ErrorKind::Tls,
            ErrorKind::WrongProtocol,
            ErrorKind::Settings,
            ErrorKind::Unreachable,
            ErrorKind::Timeout,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ];
        let names: std::collections::BTreeSet<_> = kinds.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), kinds.len());
        let server: Vec<_> = kinds
            .iter()
            .filter(|k| k.class() == Class::Server)
            .map(|k| k.name())
            .collect();
        assert_eq!(
            server,
            ["unreachable", "timeout", "unavailable", "internal"]
        );
    }
}
