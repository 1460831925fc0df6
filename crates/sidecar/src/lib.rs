//! `charon sidecar`: the server throttler of `charon-throttle` in front of any
//! service, whatever its language, as a reverse proxy on the same host.
//!
//! - The proxy ([`proxy`]) speaks HTTP/1.1 and HTTP/2 (cleartext, with
//!   prior knowledge, so gRPC works), streams bodies both ways and passes
//!   WebSocket upgrades through.
//! - Every request goes through [`charon_throttle::ThrottleLayer`], set up
//!   by the `throttle:` section of the configuration file (the file's
//!   `resources:` are what per-client limits decide by). The file is
//!   validated by path like every section, and reloaded like `charon
//!   serve`'s ([`charon_server::file_reload::FileWatch`]: SIGHUP, or the
//!   file changed and settled); an invalid file is refused, the one in
//!   force stays.
//! - Its own HTTP listener ([`admin`]) serves `/metrics`, `/healthz` and
//!   `/readyz` (ready while the upstream accepts connections and the
//!   sidecar is not shutting down).
//! - Slow or hostile clients are bounded: request headers must arrive
//!   within the header timeout (slowloris), and their size is bounded by
//!   hyper's limits.

#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod admin;
pub mod proxy;
mod reload;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use charon_server::Shutdown;
use charon_server::config_file;
use charon_throttle::{CostClock, PeerAddr, ThrottleLayer};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tracing::{info, warn};

pub use proxy::{Upstream, UpstreamHttp2};

/// How a sidecar runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The configuration file, with its `throttle:` section.
    pub config: PathBuf,
    /// The service behind the sidecar: `http://127.0.0.1:8080`.
    pub upstream: String,
    /// How requests travel to the upstream.
    pub upstream_http2: UpstreamHttp2,
    /// How long the upstream may take to send its response headers.
    pub upstream_timeout: Duration,
    /// How long a client may take to send its request headers (HTTP/1.1).
    pub header_timeout: Duration,
    /// How long a graceful shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
}

impl Settings {
    /// Settings for `config` in front of `upstream`, with the defaults of
    /// `charon sidecar`.
    pub fn new(config: impl Into<PathBuf>, upstream: impl Into<String>) -> Self {
        Self {
            config: config.into(),
            upstream: upstream.into(),
            upstream_http2: UpstreamHttp2::Auto,
            upstream_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// The listeners of a sidecar, bound by the caller (tests bind port 0).
#[derive(Debug)]
pub struct Listeners {
    /// Where clients send their requests.
    pub proxy: TcpListener,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub admin: TcpListener,
}

/// What the admin endpoints and the reloader share.
#[derive(Debug)]
pub struct SidecarState {
    /// The layer every connection uses.
    pub layer: ThrottleLayer,
    /// The upstream.
    pub upstream: Arc<Upstream>,
    /// The configuration file.
    pub config: PathBuf,
    /// The last reload's problem, if it was refused.
    pub problem: Mutex<Option<String>>,
    /// Triggered at shutdown.
    pub shutdown: Shutdown,
}

/// Runs a sidecar until `shutdown` resolves, then stops accepting, lets
/// requests in flight finish (at most `shutdown_grace`) and returns. An
/// error (an invalid file, one without a `throttle:` section, a bad
/// upstream URL) is returned before anything is served.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let (limits, file) = config_file::load_file(&settings.config)?;
    let Some(throttle) = file.throttle else {
        return Err(format!(
            "{}: no `throttle:` section; charon sidecar needs one (discipline, rate, queue, …)",
            settings.config.display()
        ));
    };
    let upstream = Arc::new(Upstream::new(
        &settings.upstream,
        settings.upstream_http2,
        settings.upstream_timeout,
    )?);
    admin::install_metrics();
    // The upstream's CPU cannot be seen from here: a request's cost is
    // the wall time from forwarding it to the upstream's response headers.
    let layer = ThrottleLayer::builder(throttle.clone())
        .limits(limits)
        .cost_clock(CostClock::Wall)
        .build()
        .map_err(|e| format!("{}: {e}", settings.config.display()))?;
    let state = Arc::new(SidecarState {
        layer,
        upstream: upstream.clone(),
        config: settings.config.clone(),
        problem: Mutex::new(None),
        shutdown: Shutdown::new(),
    });
    info!(
        proxy = %listeners.proxy.local_addr().map_err(|e| e.to_string())?,
        admin = %listeners.admin.local_addr().map_err(|e| e.to_string())?,
        upstream = %upstream.url(),
        discipline = throttle.discipline.name(),
        rate = throttle.rate,
        queue = throttle.queue,
        "charon sidecar started"
    );
    reload::spawn(state.clone());
    let admin = tokio::spawn(admin::serve(state.clone(), listeners.admin));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .keep_alive_interval(Some(Duration::from_secs(20)));
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listeners.proxy.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, say: go on once it passes.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = ServiceBuilder::new()
            .map_request(move |mut r: http::Request<hyper::body::Incoming>| {
                r.extensions_mut().insert(PeerAddr(peer));
                r
            })
            .layer(state.layer.clone())
            .service(proxy::Proxy::new(upstream.clone()));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    state.shutdown.trigger();
    info!("shutting down: no new connections; waiting for requests in flight");
    if tokio::time::timeout(settings.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("requests still in flight after the shutdown grace; stopping anyway");
    }
    admin.abort();
    Ok(())
}
