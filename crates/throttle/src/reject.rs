//! What a rejected request is answered, so that its caller knows when to
//! come back (seed 001: server-side throttling leaves clients "no clue
//! when to try again"; every rejection here says it):
//! - gRPC (a `content-type` of `application/grpc…`): `RESOURCE_EXHAUSTED`
//!   as a trailers-only response, with `google.rpc.Status` carrying
//!   `google.rpc.RetryInfo` in `grpc-status-details-bin`, the retry delay
//!   in milliseconds;
//! - HTTP: 429 or 503 with `Retry-After` in whole seconds, rounded up, or
//!   a 307 redirect to the configured URL with the same `Retry-After`.
//!
//! Every rejection carries `charon-throttle: <reason>` and
//! `charon-retry-after-ms`, the exact wait.

use base64::Engine;
use bytes::Bytes;
use charon_core::throttle::Reject;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// Why a request was rejected, as metrics and the `charon-throttle`
/// header name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The queue had no room for it.
    QueueFull,
    /// A CRITICAL arrival took its place in the queue.
    Evicted,
    /// It waited `max_wait` without starting.
    Expired,
    /// Its client is over a per-client limit decided in process.
    ClientLimit,
    /// Its client is over a global limit of the Charon server.
    GlobalLimit,
    /// The Charon server of a global limit cannot be reached and the
    /// degraded mode is pessimistic.
    GlobalUnavailable,
}

impl Reason {
    /// Every reason, for metrics registered at zero.
    pub const ALL: [Reason; 6] = [
        Reason::QueueFull,
        Reason::Evicted,
        Reason::Expired,
        Reason::ClientLimit,
        Reason::GlobalLimit,
        Reason::GlobalUnavailable,
    ];

    /// The reasons a request is refused before it waits (evictions and
    /// expiries are outcomes of their own).
    pub const REFUSALS: [Reason; 4] = [
        Reason::QueueFull,
        Reason::ClientLimit,
        Reason::GlobalLimit,
        Reason::GlobalUnavailable,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::Evicted => "evicted",
            Reason::Expired => "expired",
            Reason::ClientLimit => "client_limit",
            Reason::GlobalLimit => "global_limit",
            Reason::GlobalUnavailable => "global_unavailable",
        }
    }
}

/// A rejection: why, and when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Why.
    pub reason: Reason,
    /// The wait until a request like it would be admitted if nothing else
    /// arrived, in milliseconds.
    pub retry_after_ms: u64,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<prost_types::Duration>,
}

/// gRPC's `RESOURCE_EXHAUSTED`.
const RESOURCE_EXHAUSTED: i32 = 8;

/// Whether a request is gRPC (by its content type).
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The response to a rejected request.
pub fn response(rejection: Rejection, grpc: bool, reject: &Reject) -> Response<Full<Bytes>> {
    let ms = rejection.retry_after_ms;
    let message = format!(
        "throttled ({}); retry after {ms} ms",
        rejection.reason.name()
    );
    let mut builder = Response::builder()
        .header("charon-throttle", rejection.reason.name())
        .header("charon-retry-after-ms", ms);
    let body = if grpc {
        builder = builder
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("grpc-status", RESOURCE_EXHAUSTED)
            .header("grpc-message", grpc_message(&message))
            .header("grpc-status-details-bin", status_details(&message, ms));
        Bytes::new()
    } else {
        let seconds = ms.div_ceil(1000);
        builder = builder
            .header(header::RETRY_AFTER, seconds)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8");
        builder = match reject {
            Reject::Status(code) => {
                builder.status(StatusCode::from_u16(*code).unwrap_or(StatusCode::TOO_MANY_REQUESTS))
            }
            Reject::Redirect(url) => builder.status(StatusCode::TEMPORARY_REDIRECT).header(
                header::LOCATION,
                HeaderValue::from_str(url).unwrap_or(HeaderValue::from_static("/")),
            ),
        };
        Bytes::from(message + "\n")
    };
    builder.body(Full::new(body)).unwrap_or_else(|_| {
        let mut r = Response::new(Full::new(Bytes::from_static(b"throttled\n")));
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        r
    })
}

/// `grpc-message` is percent-encoded (the gRPC HTTP/2 protocol).
fn grpc_message(message: &str) -> String {
    message
        .bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `google.rpc.Status` with `RetryInfo`, encoded as gRPC's binary header
/// wants it (base64, no padding).
fn status_details(message: &str, retry_after_ms: u64) -> String {
    let delay = prost_types::Duration {
        seconds: i64::try_from(retry_after_ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((retry_after_ms % 1000) * 1_000_000).unwrap_or(0),
    };
    let info = RetryInfo {
        retry_delay: Some(delay),
    };
    let status = RpcStatus {
        code: RESOURCE_EXHAUSTED,
        message: message.to_owned(),
        details: vec![prost_types::Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".to_owned(),
            value: prost::Message::encode_to_vec(&info),
        }],
    };
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(prost::Message::encode_to_vec(&status))
}

/// Reads the retry delay of a `grpc-status-details-bin` value (for tests
/// and clients of this crate): `None` if it carries no `RetryInfo`.
pub fn retry_delay_of(details_bin: &str) -> Option<std::time::Duration> {
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(details_bin.trim_end_matches('='))
        .ok()?;
    let status: RpcStatus = prost::Message::decode(bytes.as_slice()).ok()?;
    let any = status
        .details
        .iter()
        .find(|a| a.type_url.ends_with("google.rpc.RetryInfo"))?;
    let info: RetryInfo = prost::Message::decode(any.value.as_slice()).ok()?;
    let d = info.retry_delay?;
    Some(
        std::time::Duration::from_secs(u64::try_from(d.seconds).ok()?)
            + std::time::Duration::from_nanos(u64::try_from(d.nanos).ok()?),
    )
}
