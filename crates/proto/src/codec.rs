//! The protobuf codec of `charon.v1`: prost's, except for what a message
//! that cannot be decoded becomes.
//!
//! tonic's prost codec answers every undecodable message with `INTERNAL`,
//! which SPEC §5 would count as a server error (and a client in degraded
//! mode would then grant on its own). Which side is at fault depends on
//! who sent the message: a request that cannot be decoded is the client's
//! mistake (`INVALID_ARGUMENT`, class client); a reply that cannot be
//! decoded is the server's (`INTERNAL`, class server). The generated server
//! and client both use this codec, so each message type says which it is.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The metadata key carrying the SPEC §5 class of an error status.
pub const CLASS_KEY: &str = "charon-error-class";

/// Who sends messages of a type, hence who is at fault when one cannot be
/// decoded.
pub trait Sender {
    /// Requests are sent by clients; replies by servers.
    const FROM_CLIENT: bool;
}

/// A status for a message that could not be read, `why` saying what was
/// wrong with it: `INVALID_ARGUMENT`, class client, for a request;
/// `INTERNAL`, class server, for a reply.
pub fn malformed(from_client: bool, why: &str) -> Status {
    let (code, what, class) = if from_client {
        (Code::InvalidArgument, "request", "client")
    } else {
        (Code::Internal, "reply", "server")
    };
    with_class(Status::new(code, format!("malformed {what}: {why}")), class)
}

/// `status` with `charon-error-class: class`.
pub fn with_class(mut status: Status, class: &'static str) -> Status {
    status.metadata_mut().insert(
        CLASS_KEY,
        tonic::metadata::MetadataValue::from_static(class),
    );
    status
}

/// prost's encoder; a decoder that classifies what it cannot decode.
#[derive(Debug)]
pub struct CharonCodec<T, U> {
    _pd: PhantomData<fn() -> (T, U)>,
}

impl<T, U> Default for CharonCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for CharonCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Sender + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CharonDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CharonDecoder {
            inner: ProstDecoder::default(),
        }
    }
}

/// Decodes with prost; a message prost refuses becomes [`malformed`].
#[derive(Debug)]
pub struct CharonDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default + Sender> Decoder for CharonDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // prost's own error is the only one the inner decoder returns.
        U::decode(buf)
            .map(Some)
            .map_err(|e| malformed(U::FROM_CLIENT, &e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

macro_rules! senders {
    ($from_client:literal: $($t:ident),*) => {
        $(impl Sender for crate::v1::$t {
            const FROM_CLIENT: bool = $from_client;
        })*
    };
}

senders!(true: RateRequest, ChargeRequest, SessionRequest, GetCapacityRequest, ReleaseCapacityRequest);
senders!(false: RateReply, SessionReply, GetCapacityReply, ReleaseCapacityReply);

impl Sender for crate::envoy::service::ratelimit::v3::RateLimitRequest {
    const FROM_CLIENT: bool = true;
}

impl Sender for crate::envoy::service::ratelimit::v3::RateLimitResponse {
    const FROM_CLIENT: bool = false;
}
