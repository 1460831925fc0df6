//! Where a server listens: the listeners a caller hands to [`super::run`]
//! ([`Listeners`]), bound by the caller or at the settings' addresses, and
//! the gRPC side as the serving code gets it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_stream::Stream;

use super::{DEFAULT_HTTP_LISTEN, DEFAULT_LISTEN, Settings};
use crate::ServerState;
use crate::config_file::FileServerSettings;

/// The listeners [`run`](super::run) serves on.
#[derive(Debug)]
pub enum Listeners {
    /// Already bound by the caller (tests: port 0). With
    /// [`ConfigSource::ApiOnly`](super::ConfigSource::ApiOnly) only `http` is used (`grpc` is closed at
    /// once).
    Bound {
        /// Where gRPC is served.
        grpc: TcpListener,
        /// Where HTTP (metrics, health, pages, API) is served.
        http: TcpListener,
    },
    /// gRPC connections from a stream the caller accepts, HTTP on a bound
    /// listener: how a test makes the gRPC side's listener go away while
    /// the server runs (the stream ends; a failed accept, an error item,
    /// is skipped), as [`crate::serve_incoming`] does for [`crate::serve`].
    Incoming {
        /// The gRPC connections, and the address they stand for.
        grpc: GrpcIncoming,
        /// Where HTTP (metrics, health, pages, API) is served.
        http: TcpListener,
    },
    /// Bound by [`run`](super::run) at the settings' (or the file's) addresses, once the
    /// configuration source and the store are open: nothing listens before
    /// it can answer (a server waiting for Redis refuses connections rather
    /// than accepting ones it cannot serve), which is what `charon serve`
    /// does.
    AtSettings,
}

/// A stream of accepted gRPC connections and the address it stands for
/// (only reported), for [`Listeners::Incoming`].
pub struct GrpcIncoming {
    addr: SocketAddr,
    stream: Pin<Box<dyn Stream<Item = std::io::Result<TcpStream>> + Send>>,
}

impl GrpcIncoming {
    /// Connections from `stream`, reported as listening on `addr`.
    pub fn new(
        addr: SocketAddr,
        stream: impl Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
    ) -> Self {
        Self {
            addr,
            stream: Box::pin(stream),
        }
    }
}

impl std::fmt::Debug for GrpcIncoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIncoming")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Listeners {
    /// Both sides of a limiting server: bound now at the settings' (else
    /// the file's, else the default) addresses for [`Listeners::AtSettings`].
    pub(super) async fn open(
        self,
        settings: &Settings,
        from_file: &FileServerSettings,
    ) -> anyhow::Result<(GrpcSide, TcpListener)> {
        Ok(match self {
            Self::Bound { grpc, http } => (GrpcSide::Listener(grpc), http),
            Self::Incoming { grpc, http } => (GrpcSide::Incoming(grpc), http),
            Self::AtSettings => {
                let listen = settings
                    .listen
                    .clone()
                    .or_else(|| from_file.listen.clone())
                    .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
                let http_listen = settings
                    .http_listen
                    .clone()
                    .or_else(|| from_file.http_listen.clone())
                    .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.to_owned());
                (
                    GrpcSide::Listener(bind(&listen, "gRPC").await?),
                    bind(&http_listen, "HTTP").await?,
                )
            }
        })
    }

    /// The HTTP side alone, for the configuration service without a
    /// limiter: a gRPC side handed in is closed now, not when
    /// [`super::run`] returns.
    pub(super) async fn http_only(self, settings: &Settings) -> anyhow::Result<TcpListener> {
        Ok(match self {
            Self::Bound { grpc, http } => {
                drop(grpc);
                http
            }
            Self::Incoming { grpc, http } => {
                drop(grpc);
                http
            }
            Self::AtSettings => {
                let http_listen = settings
                    .http_listen
                    .clone()
                    .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.to_owned());
                bind(&http_listen, "HTTP").await?
            }
        })
    }
}

/// The gRPC side of a limiting server, however it was given.
pub(super) enum GrpcSide {
    Listener(TcpListener),
    Incoming(GrpcIncoming),
}

impl GrpcSide {
    /// The address it serves on (for the log).
    pub(super) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Listener(l) => l.local_addr(),
            Self::Incoming(i) => Ok(i.addr),
        }
    }

    /// Serves gRPC here and HTTP on `http` in a task of its own, until
    /// `state.shutdown` is triggered or a side stops by itself.
    pub(super) fn spawn_serving(
        self,
        state: &Arc<ServerState>,
        http: TcpListener,
        routes: axum::Router,
    ) -> JoinHandle<std::io::Result<()>> {
        match self {
            Self::Listener(grpc) => tokio::spawn(crate::serve(state.clone(), grpc, http, routes)),
            Self::Incoming(GrpcIncoming { addr, stream }) => tokio::spawn(crate::serve_incoming(
                state.clone(),
                (addr, stream),
                http,
                routes,
            )),
        }
    }
}

/// Binds `addr`, naming the side (`what`) if it cannot.
async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}
