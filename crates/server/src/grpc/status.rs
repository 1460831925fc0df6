//! SPEC §5 on the wire, in one place: how client and server errors become
//! gRPC statuses (unary calls) and `Error` messages (session streams).
//!
//! Codes: client errors are `INVALID_ARGUMENT` (malformed), `NOT_FOUND`
//! (unknown resource or transfer id) and `FAILED_PRECONDITION` (wrong kind
//! of resource, copies not held); server errors are `UNAVAILABLE` (the store
//! cannot be reached; this server resigned) and `INTERNAL` (bad data). Every
//! status also carries `charon-error-class: client|server`.
//!
//! A request that cannot be read (undecodable protobuf, broken gRPC
//! framing, a message over the size limit) is a client error too: the
//! codec (`charon_proto::codec`) classifies what prost refuses, and
//! [`inbound`] what tonic refuses before a message reaches the codec.

use charon_core::ClientError;
use charon_limiter::LimitError;
use charon_proto::v1;
use charon_store::StoreError;
use tonic::{Code, Status};

/// The metadata key carrying the SPEC §5 class.
pub const CLASS_KEY: &str = charon_proto::codec::CLASS_KEY;

pub fn code(e: &LimitError) -> Code {
    match e {
        // A store's refusal is a client error (see `LimitError::from`).
        LimitError::Client(c) | LimitError::Server(StoreError::Refused(c)) => client_code(c),
        // Denied: this server's Redis user or certificate is refused; the
        // client may well be served by another server.
        LimitError::Server(
            StoreError::Unavailable(_) | StoreError::Resigned(_) | StoreError::Denied(_),
        ) => Code::Unavailable,
        LimitError::Server(StoreError::BadData(_)) => Code::Internal,
    }
}

fn client_code(e: &ClientError) -> Code {
    match e {
        ClientError::InvalidArgument(_) => Code::InvalidArgument,
        ClientError::UnknownResource(_) | ClientError::UnknownTransfer(_) => Code::NotFound,
        ClientError::WrongKind { .. } | ClientError::NotHeld { .. } => Code::FailedPrecondition,
    }
}

pub fn to_status(e: &LimitError) -> Status {
    crate::metrics::store_error(e);
    let mut status = Status::new(code(e), e.to_string());
    if let Ok(v) = e.class().parse() {
        status.metadata_mut().insert(CLASS_KEY, v);
    }
    status
}

pub fn to_error(e: &LimitError) -> v1::Error {
    crate::metrics::store_error(e);
    let class = match e.class() {
        "client" => v1::error::Class::Client,
        _ => v1::error::Class::Server,
    };
    v1::Error {
        class: class as i32,
        message: e.to_string(),
        code: code(e) as i32,
    }
}

/// The status for a request tonic could not read, given tonic's own: a
/// client error. A message over the size limit is `RESOURCE_EXHAUSTED`; an
/// unsupported `grpc-encoding` stays `UNIMPLEMENTED`; anything else (broken
/// framing, a stream ended inside a message, no message at all) becomes
/// `INVALID_ARGUMENT`. A status that already carries its class (the
/// codec's, or the service's own) is left as it is.
pub fn inbound(status: Status) -> Status {
    if status.metadata().contains_key(CLASS_KEY) {
        return status;
    }
    let status = match status.code() {
        Code::OutOfRange | Code::ResourceExhausted => Status::resource_exhausted(format!(
            "malformed request: message too large: {}",
            status.message()
        )),
        Code::Unimplemented => status,
        _ => Status::invalid_argument(format!("malformed request: {}", status.message())),
    };
    charon_proto::codec::with_class(status, "client")
}
