//! The limiting server: the protocols, listeners and operations around
//! [`charon_limiter::Limiter`], which makes every decision.
//!
//! - gRPC (`charon.v1.Limiter`): unary `Request`, `Charge` and `Refund`,
//!   and the bidirectional `Session` stream that *is* the client's session — when
//!   it ends for any reason, every hold it owns is released. HTTP/2
//!   keep-alive detects peers that vanished without a word. The standard
//!   health service and server reflection are served beside it, with
//!   `charon.v1.Capacity` (capacity leases) and Envoy's
//!   `RateLimitService`.
//! - HTTP: `/metrics` (Prometheus), `/healthz`, `/readyz`, plus whatever
//!   routes the binary mounts (the simulator page, the config API).
//! - Configuration reload without restart ([`file_reload`], the feed of
//!   a configuration service) and graceful shutdown ([`Shutdown`]).
//! - The composition root ([`run`] with [`Settings`]): configuration
//!   source, store, signals and exit status, so that `charon serve` is
//!   argument parsing plus a call, and tests start whole servers
//!   in-process.

#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod api_auth;
pub mod config_file;
pub mod events;
pub mod file_reload;
mod grpc;
pub mod http;
pub mod metrics;
pub mod null;
mod observe;
mod root;
mod shutdown;
pub mod tls;
pub mod trace;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use charon_limiter::Limiter;
use tokio::net::TcpListener;
use tracing::{error, info, warn};

pub use grpc::LimiterService;
pub use grpc::capacity::CapacityService;
pub use grpc::envoy::EnvoyService;

use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
pub use root::{
    ClientTlsFiles, ConfigSource, DEFAULT_HTTP_LISTEN, DEFAULT_LISTEN, EmbeddedService, Error,
    Exit, GrpcIncoming, Listeners, Settings, StoreSettings, check_redis_url, redis_tls, run,
    run_observed, server_id, terminated, token_file,
};
pub use shutdown::Shutdown;
pub use tls::TlsSettings;

/// How the server behaves on the network.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// A peer that stopped answering is detected (and its session ended)
    /// within about this long: HTTP/2 pings every half of it, each given the
    /// other half to be answered.
    pub keepalive: Duration,
    /// How long a graceful shutdown may take before the server stops anyway.
    pub shutdown_grace: Duration,
    /// The largest gRPC message accepted; larger ones are refused with
    /// `RESOURCE_EXHAUSTED`, class client (on a session stream, that ends
    /// the stream, after the operations before it are answered).
    pub max_message_bytes: usize,
    /// Operations of one session stream in flight at once: read and not yet
    /// answered (rate requests run concurrently; copy operations run in
    /// order). The server reads no further on the stream until one is
    /// answered.
    pub session_concurrency: usize,
    /// TLS on both listeners (`None`: plain text), its certificate
    /// replaced while serving by [`tls::ServerTls::spawn_reloader`].
    pub tls: Option<Arc<tls::ServerTls>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            keepalive: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(10),
            max_message_bytes: 1 << 20,
            session_concurrency: 64,
            tls: None,
        }
    }
}

/// What the server shares between its protocols.
#[derive(Debug)]
pub struct ServerState {
    /// The limiter every protocol decides through.
    pub limiter: Arc<Limiter>,
    /// What the server was started with.
    pub options: ServerOptions,
    /// Shutdown, for every task that must stop with the server.
    pub shutdown: Shutdown,
    ready: AtomicBool,
    config: arc_swap::ArcSwap<ConfigReport>,
    /// The decision counters of the configuration in force, rebuilt by the
    /// first decision after a reload ([`ServerState::decisions`]).
    decisions: arc_swap::ArcSwap<metrics::Decisions>,
    /// Who may use the limiting API (off unless `--api-tokens`).
    pub api_auth: api_auth::ApiAuth,
    /// The decision stream, when `--events` asked for one.
    events: OnceLock<Arc<events::Events>>,
}

/// Where the configuration in force came from, for `/readyz` and
/// `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigReport {
    /// `file limits.yaml`, `service http://…`.
    pub source: String,
    /// The version in force (0 for a file).
    pub version: u64,
    /// Whether a configuration was ever loaded (a server fed by a
    /// configuration service it has never reached is not ready).
    pub loaded: bool,
    /// The last problem getting a newer one, if any (the server goes on
    /// with the configuration in force).
    pub problem: Option<String>,
}

impl ServerState {
    /// State for a server around `limiter`.
    pub fn new(limiter: Arc<Limiter>, options: ServerOptions) -> Arc<Self> {
        let decisions = metrics::Decisions::for_config(limiter.config());
        Arc::new(Self {
            decisions: arc_swap::ArcSwap::from_pointee(decisions),
            api_auth: api_auth::ApiAuth::default(),
            events: OnceLock::new(),
            limiter,
            options,
            shutdown: Shutdown::new(),
            ready: AtomicBool::new(true),
            // The limiter was built with a configuration; whoever feeds it
            // from elsewhere reports where it came from (and, for a
            // configuration service, whether it was loaded yet).
            config: arc_swap::ArcSwap::from_pointee(ConfigReport {
                source: "given at start".to_owned(),
                version: 0,
                loaded: true,
                problem: None,
            }),
        })
    }

    /// Records where the configuration in force came from.
    pub fn report_config(&self, report: ConfigReport) {
        // /readyz first: whoever sees the version in /metrics finds it in
        // /readyz too.
        let (version, loaded, problem) = (report.version, report.loaded, report.problem.is_some());
        self.config.store(Arc::new(report));
        metrics::config_version(version);
        metrics::config_state(loaded, problem);
    }

    /// Where the configuration in force came from.
    pub fn config_report(&self) -> Arc<ConfigReport> {
        self.config.load_full()
    }

    /// A server error while no configuration was ever loaded (a server fed
    /// by a configuration service it has not reached yet): answering
    /// "unknown resource" then would be a client error the client cannot
    /// fix, where a server error lets it degrade (fail open).
    pub fn check_configured(&self) -> Result<(), charon_limiter::LimitError> {
        if self.config.load().loaded {
            return Ok(());
        }
        Err(NotConfigured.into())
    }

    /// The metric handles of decisions under the configuration in force:
    /// those of the last decision unless a reload put another
    /// configuration in force since, then new ones for it (two decisions
    /// racing after a reload may both build them; the series they
    /// register are the same).
    pub fn decisions(&self) -> arc_swap::Guard<Arc<metrics::Decisions>> {
        let config = self.limiter.current_config();
        let decisions = self.decisions.load();
        if decisions.is_for(&config) {
            return decisions;
        }
        drop(decisions);
        self.decisions
            .store(Arc::new(metrics::Decisions::for_config(Arc::clone(
                &config,
            ))));
        self.decisions.load()
    }

    /// Sends every decision from now on to `events` too (once: a second
    /// stream is refused, and `false` returned).
    pub fn set_events(&self, events: Arc<events::Events>) -> bool {
        self.events.set(events).is_ok()
    }

    /// The decision stream, if there is one.
    pub fn events(&self) -> Option<&Arc<events::Events>> {
        self.events.get()
    }

    /// Records one decision in the stream, if there is one: `build` makes
    /// the event from the decision's time, only if it is sampled and under
    /// the cap (see [`events::Events::emit`]).
    #[inline]
    pub(crate) fn emit(&self, build: impl FnOnce(u64) -> events::Event) {
        if let Some(events) = self.events.get() {
            events.emit(build);
        }
    }

    /// Whether `/readyz` should say yes (the store is checked separately).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.shutdown.is_triggered()
    }

    /// Marks the server as not ready (while it cannot serve correctly).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
}

/// A server that never loaded a configuration (fed by a configuration
/// service it has not reached yet): its own error, so that every protocol
/// and `/readyz` say it the same way. On the limiting APIs it is a server
/// error (the store's "unavailable"), which lets a client degrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotConfigured;

impl std::fmt::Display for NotConfigured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no configuration loaded yet")
    }
}

impl std::error::Error for NotConfigured {}

impl From<NotConfigured> for charon_limiter::LimitError {
    fn from(e: NotConfigured) -> Self {
        charon_store::StoreError::Unavailable(e.to_string()).into()
    }
}

/// HTTP/2 receive window of each stream: what a client may send on one
/// stream before the server reads it. h2 closes the whole connection
/// (`GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`) once the small DATA
/// frames it holds unread cost more than half the connection window, each
/// frame under 256 bytes counting 256 minus its size. A session that stops
/// being read (its operations in flight are at their bound) holds at most
/// one stream window unread: 16 KiB of the smallest messages (12 bytes, one
/// per frame) cost 333 KB of that budget, where hyper's default 1 MiB
/// window let one session cost 21 MB. 16 KiB is still far more than
/// `session_concurrency` operations need in flight.
const STREAM_WINDOW: u32 = 16 * 1024;

/// HTTP/2 receive window of a connection (all its streams together). h2's
/// budget for unread small DATA frames is half of it: 8 MiB, so at least
/// 25 sessions of one connection may each hold a full stream window of the
/// smallest messages unread at once.
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// Accepted connections get TCP_NODELAY (one small message per decision;
/// Nagle's algorithm against delayed ACKs would add up to 40 ms) and TCP
/// keep-alive. The builder's own TCP settings apply only to listeners it
/// binds itself, so they are set here.
fn incoming(listener: TcpListener, keepalive: Duration) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(keepalive))
}

/// Serves gRPC on `grpc` and HTTP on `http` until `state.shutdown` is
/// triggered, then shuts down gracefully: stops accepting, ends every
/// session (releasing its holds) and waits for in-flight work, at most
/// `shutdown_grace`.
///
/// Fails, after the same graceful shutdown, if the gRPC or the HTTP server
/// stops while it should be serving (its listener ended, its task failed):
/// a server that no longer answers on one of its ports must not look
/// alive, so the process exits non-zero and says which port and why.
pub async fn serve(
    state: Arc<ServerState>,
    grpc: TcpListener,
    http: TcpListener,
    extra_routes: axum::Router,
) -> std::io::Result<()> {
    let grpc_addr: SocketAddr = grpc.local_addr()?;
    let keepalive = state.options.keepalive / 2;
    serve_incoming(
        state,
        (grpc_addr, incoming(grpc, keepalive)),
        http,
        extra_routes,
    )
    .await
}

/// [`serve`] with the gRPC connections from any stream of accepted
/// connections (`addr` is only reported): tests use it to end the stream
/// and see the server notice.
pub async fn serve_incoming<I>(
    state: Arc<ServerState>,
    (grpc_addr, grpc): (SocketAddr, I),
    http: TcpListener,
    extra_routes: axum::Router,
) -> std::io::Result<()>
where
    I: tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static,
{
    let http_addr: SocketAddr = http.local_addr()?;
    let options = state.options.clone();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<charon_proto::v1::limiter_server::LimiterServer<LimiterService>>()
        .await;
    health_reporter
        .set_serving::<RateLimitServiceServer<EnvoyService>>()
        .await;
    health_reporter
        .set_serving::<charon_proto::v1::capacity_server::CapacityServer<CapacityService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(charon_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(charon_proto::envoy::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(std::io::Error::other)?;
    let half = options.keepalive / 2;
    let limiter_service = grpc::classify::Classified(
        charon_proto::v1::limiter_server::LimiterServer::new(LimiterService::new(state.clone()))
            .max_decoding_message_size(options.max_message_bytes),
    );
    let envoy_service = grpc::classify::Classified(
        RateLimitServiceServer::new(EnvoyService::new(state.clone()))
            .max_decoding_message_size(options.max_message_bytes),
    );
    let capacity_service = grpc::classify::Classified(
        charon_proto::v1::capacity_server::CapacityServer::new(CapacityService::new(state.clone()))
            .max_decoding_message_size(options.max_message_bytes),
    );
    let shutdown = state.shutdown.clone();
    let grpc_router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(half))
        .http2_keepalive_timeout(Some(half))
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(limiter_service)
        .add_service(envoy_service)
        .add_service(capacity_service);
    let stop = async move { shutdown.wait().await };
    // Under TLS, the same connections after their handshake (each in a
    // task of its own, so one that stalls blocks no other).
    let grpc_server: Served<tonic::transport::Error> = match &options.tls {
        None => Box::pin(grpc_router.serve_with_incoming_shutdown(grpc, stop)),
        Some(tls) => Box::pin(
            grpc_router.serve_with_incoming_shutdown(tls::grpc_incoming(tls.clone(), grpc), stop),
        ),
    };

    let app = http::router(state.clone()).merge(extra_routes);
    let shutdown = state.shutdown.clone();
    let stop = async move { shutdown.wait().await };
    let http_server: Served<std::io::Error> = match &options.tls {
        None => Box::pin(
            axum::serve(http, app)
                .with_graceful_shutdown(stop)
                .into_future(),
        ),
        Some(tls) => Box::pin(
            axum::serve(tls::HttpListener::new(tls.clone(), http)?, app)
                .with_graceful_shutdown(stop)
                .into_future(),
        ),
    };

    tracing::debug!(%grpc_addr, %http_addr, "serving");
    let mut grpc_task = tokio::spawn(grpc_server);
    let mut http_task = tokio::spawn(http_server);
    let (mut grpc_ended, mut http_ended) = (false, false);
    // A server that ended *because* shutdown was asked (their graceful
    // shutdown waits on the same trigger) is no failure: `select!` may see
    // its task done before the trigger's own branch (tokio's cooperative
    // budget can make a ready `wait` answer pending once), so an end is a
    // failure only while shutdown was not asked. Seen in the SIGTERM test
    // as "the HTTP server ... stopped" with exit 1.
    let asked = || state.shutdown.is_triggered();
    let failure = tokio::select! {
        biased;
        () = state.shutdown.wait() => None,
        ended = &mut grpc_task => {
            grpc_ended = true;
            (!asked()).then(|| {
                format!("the gRPC server on {grpc_addr} stopped: {}", why_stopped(ended))
            })
        }
        ended = &mut http_task => {
            http_ended = true;
            (!asked()).then(|| {
                format!("the HTTP server on {http_addr} stopped: {}", why_stopped(ended))
            })
        }
    };
    if let Some(reason) = &failure {
        error!("{reason}; shutting down");
        state.set_ready(false);
        state.shutdown.trigger();
    }
    health_reporter
        .set_not_serving::<charon_proto::v1::limiter_server::LimiterServer<LimiterService>>()
        .await;
    health_reporter
        .set_not_serving::<RateLimitServiceServer<EnvoyService>>()
        .await;
    health_reporter
        .set_not_serving::<charon_proto::v1::capacity_server::CapacityServer<CapacityService>>()
        .await;
    info!("shutting down: no new connections, ending sessions");
    let drained = tokio::time::timeout(options.shutdown_grace, async {
        if !grpc_ended {
            let _ = grpc_task.await;
        }
        if !http_ended {
            let _ = http_task.await;
        }
        state.shutdown.sessions_ended().await;
    })
    .await;
    if drained.is_err() {
        warn!(grace = ?options.shutdown_grace, "shutdown grace period passed; stopping anyway");
    }
    failure.map_or(Ok(()), |reason| Err(std::io::Error::other(reason)))
}

/// A server's future, whichever listener it serves (plain or TLS).
type Served<E> = std::pin::Pin<Box<dyn Future<Output = Result<(), E>> + Send>>;

/// Why a server task ended although nobody asked it to.
fn why_stopped<E: std::fmt::Display>(
    ended: Result<Result<(), E>, tokio::task::JoinError>,
) -> String {
    match ended {
        Ok(Ok(())) => "its listener stopped accepting connections".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(e) if e.is_panic() => "its task panicked".to_owned(),
        Err(e) => e.to_string(),
    }
}
