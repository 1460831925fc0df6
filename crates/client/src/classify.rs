//! A gRPC status, as tonic hands it over, in the client's error model:
//! the server's own answers by their `charon-error-class` metadata (or
//! their code), and the transport's failures (nothing listening, TLS, a
//! port that speaks another protocol) by what their source chain holds,
//! each with a message that names the address and what to check.

use std::error::Error as StdError;

use tonic::Code;

use crate::error::{Error, ErrorKind};

/// The gRPC port of `charon serve` unless `--listen` says otherwise, and
/// its HTTP port: named in the hint for a client that dialled the wrong
/// one.
const PORTS_HINT: &str = "the gRPC port is 7070 and the HTTP port 7071 unless --listen and \
                          --http-listen say otherwise";

impl Error {
    /// A failed connection (`Endpoint::connect` of a tonic client of the
    /// server at `address`, as `charon bench` makes them) in this model.
    /// Here rather than in `error`, so that the model does not depend on
    /// its translation from tonic.
    pub fn from_connect_error(e: tonic::transport::Error, address: &str) -> Self {
        let status = tonic::Status::from_error(Box::new(e));
        from_status(&status, address)
    }
}

/// `status` as an error of the client's model, from the server at
/// `address`.
pub(crate) fn from_status(status: &tonic::Status, address: &str) -> Error {
    if let Some(transport) = transport_failure(status, address) {
        return transport.with_code(status.code()).at(address);
    }
    let class = status
        .metadata()
        .get(charon_proto::codec::CLASS_KEY)
        .and_then(|v| v.to_str().ok());
    let kind = kind_of_answer(status.code(), class);
    if let Some(http) = status.message().strip_prefix(MAPPED) {
        // Made up by tonic from an HTTP answer that was no gRPC answer.
        let message = match kind {
            ErrorKind::WrongProtocol => format!(
                "{address} is not a Charon gRPC port: it answered HTTP {http} without a gRPC \
                 status (the HTTP port? {PORTS_HINT})"
            ),
            _ => format!("{address} answered HTTP {http} without a gRPC status (a proxy?)"),
        };
        return Error::new(kind, message)
            .with_code(status.code())
            .at(address);
    }
    let message = match status.code() {
        Code::Unimplemented => format!(
            "the server at {address} does not serve this call ({}): not a Charon server, or an \
             older one",
            status.message()
        ),
        _ => status.message().to_owned(),
    };
    Error::new(kind, message).answered(status.code(), address)
}

/// How tonic words a status it made up from an HTTP answer without one.
const MAPPED: &str = "grpc-status header missing, mapped from HTTP status code ";

/// The kind of a status a server (or a proxy) answered: by its class when
/// the server said it (`charon-error-class`), else by its code.
fn kind_of_answer(code: Code, class: Option<&str>) -> ErrorKind {
    let client = match class {
        Some(class) => class == "client",
        None => matches!(
            code,
            Code::InvalidArgument
                | Code::NotFound
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::ResourceExhausted
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::Unimplemented
        ),
    };
    match (client, code) {
        (true, Code::NotFound) => ErrorKind::NotFound,
        (true, Code::FailedPrecondition) => ErrorKind::FailedPrecondition,
        (true, Code::Unauthenticated) => ErrorKind::Unauthenticated,
        (true, Code::PermissionDenied) => ErrorKind::PermissionDenied,
        (true, Code::Unimplemented) => ErrorKind::WrongProtocol,
        (true, _) => ErrorKind::InvalidRequest,
        (false, Code::DeadlineExceeded) => ErrorKind::Timeout,
        (false, Code::Unavailable | Code::Cancelled | Code::Aborted) => ErrorKind::Unavailable,
        (false, _) => ErrorKind::Internal,
    }
}

/// A failure of the transport (no answer from a server), if `status` is
/// one: its error, or `None` for an answer.
fn transport_failure(status: &tonic::Status, address: &str) -> Option<Error> {
    let source = status.source()?;
    // Only what the transport failed with: a status a server sent has no
    // source.
    source.downcast_ref::<tonic::transport::Error>()?;
    let chain = || chain(source);
    if let Some(tls) = chain().find_map(rustls_error) {
        return Some(tls_failure(tls, address));
    }
    let io_kind = chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
        .next();
    let text = chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ");
    use std::io::ErrorKind as Io;
    Some(match io_kind {
        Some(Io::ConnectionRefused) => Error::new(
            ErrorKind::Unreachable,
            format!(
                "cannot connect to {address}: connection refused (nothing listens there: is \
                 the server running, and is this its gRPC port?)"
            ),
        ),
        Some(Io::TimedOut) => Error::new(
            ErrorKind::Timeout,
            format!("cannot connect to {address}: timed out ({text})"),
        ),
        _ if text.contains("dns error") || text.contains("failed to lookup address") => Error::new(
            ErrorKind::Unreachable,
            format!("cannot connect to {address}: its name does not resolve ({text})"),
        ),
        _ if text.contains("timed out") || text.contains("deadline has elapsed") => Error::new(
            ErrorKind::Timeout,
            format!("cannot connect to {address}: timed out ({text})"),
        ),
        Some(Io::NetworkUnreachable | Io::HostUnreachable | Io::AddrNotAvailable) => Error::new(
            ErrorKind::Unreachable,
            format!("cannot connect to {address}: {text}"),
        ),
        // Closed, reset, a broken pipe, an HTTP/2 error: a server that
        // stopped, or one that speaks another protocol (see `diagnose`).
        _ => Error::new(
            ErrorKind::Unavailable,
            format!("the connection to {address} ended without an answer ({text})"),
        ),
    })
}

/// Whether `status` is a transport failure that says nothing of its
/// cause: the connection was closed, reset or broken. A server that died
/// does that, and so do a TLS server refusing a client certificate after
/// the handshake and a TLS port spoken to in plain text: `diagnose` tells
/// which.
pub(crate) fn is_ambiguous(status: &tonic::Status, address: &str) -> bool {
    transport_failure(status, address).is_some_and(|e| {
        e.kind() == ErrorKind::Unavailable
            && status
                .source()
                .is_some_and(|s| chain(s).all(|e| rustls_error(e).is_none()))
    })
}

/// An error and its causes. An `io::Error` wrapping another error hides it
/// from `source()`: it is unwrapped here.
fn chain<'a>(
    first: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> + 'a {
    let mut next = Some(first);
    std::iter::from_fn(move || {
        let current = next?;
        next = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn StdError + 'static))
            .or_else(|| current.source());
        Some(current)
    })
}

fn rustls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    e.downcast_ref::<rustls::Error>()
}

/// A TLS failure with the server at `address`: which certificate, and why.
pub(crate) fn tls_failure(e: &rustls::Error, address: &str) -> Error {
    use rustls::{AlertDescription as Alert, CertificateError as Cert};
    let (kind, message) = match e {
        rustls::Error::InvalidCertificate(cert) => {
            let why = match cert {
                Cert::UnknownIssuer => "is not signed by a CA this client trusts (give the CA \
                                       that signed it: the CLI's --ca, ClientTls::ca_pem)"
                    .to_owned(),
                Cert::Expired | Cert::ExpiredContext { .. } => {
                    format!("has expired ({e}): the server must be given a new certificate")
                }
                Cert::NotValidYet | Cert::NotValidYetContext { .. } => format!(
                    "is not valid yet ({e}): check the server's certificate, or this host's clock"
                ),
                Cert::NotValidForName | Cert::NotValidForNameContext { .. } => format!(
                    "does not carry the name this client connects to ({e}): connect by a name \
                     it carries, or set the name to expect (the CLI's --server-name, \
                     ClientTls::server_name)"
                ),
                _ => format!("cannot be verified: {e}"),
            };
            (
                ErrorKind::Tls,
                format!("TLS with {address}: the server's certificate {why}"),
            )
        }
        rustls::Error::AlertReceived(Alert::CertificateRequired) => (
            ErrorKind::Tls,
            format!(
                "TLS with {address}: the server requires a client certificate (mutual TLS) and \
                 this client presented none (give one: the CLI's --cert and --key, \
                 ClientTls::identity_pem)"
            ),
        ),
        rustls::Error::AlertReceived(
            alert @ (Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::UnsupportedCertificate
            | Alert::AccessDenied
            | Alert::DecryptError),
        ) => (
            ErrorKind::Tls,
            format!(
                "TLS with {address}: the server refused this client's certificate ({alert:?}): it \
                 must be valid and signed by a CA of the server's --tls-client-ca"
            ),
        ),
        rustls::Error::AlertReceived(Alert::NoApplicationProtocol)
        | rustls::Error::NoApplicationProtocol => (
            ErrorKind::WrongProtocol,
            format!("TLS with {address}: the server does not speak HTTP/2 (ALPN h2) on this port"),
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => (
            ErrorKind::WrongProtocol,
            format!(
                "{address} does not speak TLS ({e}): connect in plain text (an http:// address, \
                 no CA given: neither the CLI's --ca nor ClientTls), or to its TLS port"
            ),
        ),
        other => (
            ErrorKind::Tls,
            format!("TLS with {address} failed: {other}"),
        ),
    };
    Error::new(kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_says_the_class_and_the_code_picks_the_kind() {
        let status = charon_proto::codec::with_class(
            tonic::Status::resource_exhausted("message too large"),
            "client",
        );
        let e = from_status(&status, "http://h:1");
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
        assert!(e.is_client());
        let unavailable = from_status(&tonic::Status::unavailable("store down"), "http://h:1");
        assert_eq!(unavailable.kind(), ErrorKind::Unavailable);
        assert_eq!(
            unavailable.to_string(),
            "server error: store down (UNAVAILABLE from http://h:1)"
        );
    }

    #[test]
    fn an_http_port_is_the_wrong_protocol_and_says_so() {
        let status = tonic::Status::unimplemented(
            "grpc-status header missing, mapped from HTTP status code 404",
        );
        let e = from_status(&status, "http://127.0.0.1:7071");
        assert_eq!(e.kind(), ErrorKind::WrongProtocol);
        assert!(
            e.message().starts_with(
                "http://127.0.0.1:7071 is not a Charon gRPC port: it answered HTTP 404"
            ),
            "{e}"
        );
    }
}
