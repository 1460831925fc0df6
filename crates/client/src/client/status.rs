//! A failed call in the client's error model: an `Error` reply on the
//! session stream, or a status diagnosed further when it is ambiguous.

use charon_proto::v1;

use crate::{ClientOptions, Error};

/// An operation's `Error` reply on the session stream, from the server at
/// `address`: its code (the one a unary call would get) picks the kind; a
/// server that predates the code gives only the class.
pub(crate) fn from_reply_error(e: &v1::Error, address: &str) -> Error {
    let client = e.class == v1::error::Class::Client as i32;
    let code = tonic::Code::from_i32(e.code);
    let code = match code {
        tonic::Code::Ok if client => tonic::Code::InvalidArgument,
        tonic::Code::Ok => tonic::Code::Unavailable,
        code => code,
    };
    let class = if client { "client" } else { "server" };
    let status = charon_proto::codec::with_class(tonic::Status::new(code, &e.message), class);
    crate::classify::from_status(&status, address)
}

/// A failed call's status in the error model, for a client with
/// `options`: see [`Client::classify`](super::Client::classify).
pub(crate) async fn classify(
    options: &ClientOptions,
    status: &tonic::Status,
    deadline: tokio::time::Instant,
) -> Error {
    let address = options.endpoint.as_str();
    let error = crate::classify::from_status(status, address);
    if !crate::classify::is_ambiguous(status, address) {
        return error;
    }
    match crate::diagnose::diagnose(address, options.tls.as_ref(), deadline).await {
        Some(cause) => cause.with_code(status.code()).at(address),
        None => error,
    }
}
