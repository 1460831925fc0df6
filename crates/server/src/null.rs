//! The transport floor of the benchmarks: a `charon.v1.Limiter` service on
//! the same stack as the real server (tonic, the same codec, HTTP/2 windows,
//! TCP settings and keep-alive) that answers every `Request` with one
//! constant grant and decides nothing. `charon bench-null` serves it, and
//! `scripts/bench-kinds` loads it exactly as it loads the real server, so
//! the server CPU per call it spends is what the transport alone costs: the
//! real server's CPU per decision is reported as a ratio to it.

use std::net::SocketAddr;
use std::time::Duration;

use charon_proto::v1;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

/// Answers every call with a constant; never reads a store.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullLimiter;

/// The one reply: a grant of one, as a bucket with room would give.
fn granted() -> v1::RateReply {
    v1::RateReply {
        granted: 1,
        limit: Some(1_000_000_000),
        remaining: Some(999_999_999),
        reset_after_ms: Some(0),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl v1::limiter_server::Limiter for NullLimiter {
    async fn request(
        &self,
        _request: Request<v1::RateRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        Ok(Response::new(granted()))
    }

    async fn charge(
        &self,
        _request: Request<v1::ChargeRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        Ok(Response::new(granted()))
    }

    async fn refund(
        &self,
        _request: Request<v1::ChargeRequest>,
    ) -> Result<Response<v1::RateReply>, Status> {
        Ok(Response::new(granted()))
    }

    type SessionStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<v1::SessionReply, Status>> + Send>,
    >;

    async fn session(
        &self,
        _request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        Err(Status::unimplemented(
            "the null service answers unary calls only",
        ))
    }
}

/// Serves [`NullLimiter`] on `listener` with the real server's transport
/// settings (`keepalive` as `ServerOptions::keepalive`) until the process
/// ends.
pub async fn serve_null(listener: TcpListener, keepalive: Duration) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let half = keepalive / 2;
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(half))
        .http2_keepalive_timeout(Some(half))
        .initial_stream_window_size(Some(crate::STREAM_WINDOW))
        .initial_connection_window_size(Some(crate::CONNECTION_WINDOW))
        .add_service(v1::limiter_server::LimiterServer::new(NullLimiter))
        .serve_with_incoming(crate::incoming(listener, half))
        .await
        .map_err(|e| std::io::Error::other(format!("null service on {addr}: {e}")))
}
