//! The composition root: a resolved [`Settings`] value becomes a
//! configuration source, a store, a limiter and listeners, served until a
//! shutdown future resolves, the store resigns or a listener dies
//! ([`run`], in the shape of mini-redis's `server::run(listener,
//! shutdown)`). `charon serve` is argument parsing plus a call to it; tests
//! start a whole server in-process the same way.
//!
//! Where the limits come from ([`ConfigSource`]):
//! - a file, reloaded on change and on SIGHUP;
//! - a configuration service, polled for deltas every `refresh` and on
//!   SIGHUP, its last view kept while it is down;
//! - the embedded default: a configuration service in this process on a
//!   database (a local SQLite file by default), mounted on the HTTP
//!   address, which the limiter follows like any other;
//! - or only that configuration service, no limiter
//!   ([`ConfigSource::ApiOnly`]; production splits it from the limiting
//!   servers).

mod embedded;
mod feed;
mod lease_parent;
mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use charon_config_client::ConfigTls;
use charon_config_service::AppState;
use charon_core::config::Config;
use charon_limiter::Limiter;
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;
use tracing::{error, info, warn};

use crate::config_file::{self, FileServerSettings};
use crate::tls::{ServerTls, TlsSettings};
use crate::{ConfigReport, ServerOptions, ServerState, file_reload};

pub use embedded::token_file;
pub use store::{check_redis_url, redis_tls, server_id};

/// The gRPC address when neither the settings nor the file name one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The HTTP address when neither the settings nor the file name one.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7071";

/// Everything a server needs to know before it starts, resolved from flags,
/// environment and defaults (plain data: `charon serve` builds it from its
/// arguments, tests by hand).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the limits come from.
    pub source: ConfigSource,
    /// The gRPC address; `None`: the file's `server.listen`, else
    /// [`DEFAULT_LISTEN`]. Used only with [`Listeners::AtSettings`].
    pub listen: Option<String>,
    /// The HTTP address; `None`: the file's `server.http_listen`, else
    /// [`DEFAULT_HTTP_LISTEN`]. Used only with [`Listeners::AtSettings`].
    pub http_listen: Option<String>,
    /// Where state lives.
    pub store: StoreSettings,
    /// A client that stops answering is detected, and its holds released,
    /// within about this long.
    pub keepalive: Duration,
    /// The longest a graceful shutdown may take.
    pub shutdown_grace: Duration,
    /// The largest gRPC message accepted (see [`ServerOptions`]).
    pub max_message_bytes: usize,
    /// Operations of one session stream in flight at once (see
    /// [`ServerOptions`]).
    pub session_concurrency: usize,
    /// The gRPC URL of a parent lease server (SPEC §12 tree): lease
    /// resources share what it grants instead of their configured
    /// capacity. `None`: this server is a root.
    pub lease_parent: Option<String>,
    /// TLS (and, with a client CA, mutual TLS) on both listeners, the
    /// certificate reloaded on SIGHUP and when its files change; `None`:
    /// plain text.
    pub tls: Option<TlsSettings>,
    /// What this server trusts and presents when it calls its lease
    /// parent over `https://`.
    pub lease_parent_tls: ClientTlsFiles,
    /// The limiting API's tokens file (issue 16, see [`crate::api_auth`]):
    /// every call then needs a token of it, allowed the resource's
    /// namespace. `None`: the limiting API is open.
    pub api_tokens: Option<PathBuf>,
    /// The decision stream (`--events`): `None`, none.
    pub events: Option<crate::events::EventSettings>,
}

impl Settings {
    /// Settings with `source` and every other value at `charon serve`'s
    /// defaults (the in-memory store).
    pub fn new(source: ConfigSource) -> Self {
        let options = ServerOptions::default();
        Self {
            source,
            listen: None,
            http_listen: None,
            store: StoreSettings::default(),
            keepalive: options.keepalive,
            shutdown_grace: options.shutdown_grace,
            max_message_bytes: options.max_message_bytes,
            session_concurrency: options.session_concurrency,
            lease_parent: None,
            tls: None,
            lease_parent_tls: ClientTlsFiles::default(),
            api_tokens: None,
            events: None,
        }
    }

    /// The network behaviour these settings ask for.
    fn server_options(&self) -> ServerOptions {
        ServerOptions {
            keepalive: self.keepalive,
            shutdown_grace: self.shutdown_grace,
            max_message_bytes: self.max_message_bytes,
            session_concurrency: self.session_concurrency,
            tls: None,
        }
    }
}

/// Where the limits come from.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// A configuration file (SPEC §6 YAML, with an optional `server:`
    /// section that the settings override), reloaded on SIGHUP and when it
    /// changes.
    File(PathBuf),
    /// The configuration service at `url`.
    Service {
        /// The service's base URL.
        url: String,
        /// The bearer token to read with, if it needs one.
        token: Option<String>,
        /// How often to ask for changes.
        refresh: Duration,
        /// Where to keep the last view, so a server that starts while the
        /// service is down still has limits.
        cache: Option<PathBuf>,
        /// TLS of an `https://` URL: the CA to trust, the client
        /// certificate to present.
        tls: ClientTlsFiles,
    },
    /// A configuration given by value, never reloaded (tests and embedders
    /// that change it through the limiter).
    Inline(Config),
    /// A configuration service in this process, on the HTTP address.
    Embedded(EmbeddedService),
    /// Only the embedded configuration service (on the HTTP address): no
    /// limiter, no gRPC, no store.
    ApiOnly(EmbeddedService),
}

/// The PEM files of a TLS client: what this server trusts and presents
/// when it calls a configuration service or a lease parent at an
/// `https://` URL. Read at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA certificates to trust instead of the built-in roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (chain) to present (mutual TLS); with `key`.
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    pub key: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// The files' contents, for the configuration client.
    fn read(&self) -> anyhow::Result<ConfigTls> {
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
        let identity_pem = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            _ => anyhow::bail!("a client certificate needs its key, and a key its certificate"),
        };
        Ok(ConfigTls {
            ca_pem: self.ca.as_ref().map(read).transpose()?,
            identity_pem,
            rustls: None,
        })
    }
}

/// The embedded configuration service.
#[derive(Debug, Clone)]
pub struct EmbeddedService {
    /// Its database: a SQLite file path or a `postgres://` URL.
    pub db: String,
    /// The tokens it accepts (`write:S,read:S`; a bare S is a write token);
    /// `None`: a write token made up and kept in [`token_file`].
    pub tokens: Option<String>,
    /// A file of the tokens it accepts instead (the same list, one per
    /// line or comma-separated), re-read on SIGHUP and when it changes.
    pub tokens_file: Option<PathBuf>,
    /// Audit rows kept (0: every one).
    pub audit_keep: u64,
    /// How often the limiter asks it for changes.
    pub refresh: Duration,
    /// Where the limiter keeps its last view.
    pub cache: Option<PathBuf>,
}

impl EmbeddedService {
    /// The service on `db` with `charon serve`'s defaults.
    pub fn new(db: impl Into<String>) -> Self {
        Self {
            db: db.into(),
            tokens: None,
            tokens_file: None,
            audit_keep: charon_config_service::DEFAULT_AUDIT_VERSIONS,
            refresh: Duration::from_secs(2),
            cache: None,
        }
    }
}

/// Where state lives, and how the Redis store behaves.
#[derive(Clone)]
pub struct StoreSettings {
    /// `memory`, `redis://[user:password@]host:port[/db]` or
    /// `rediss://…` (TLS); `None`: the file's `server.store`, else
    /// `memory`. It may hold a password: it is shown only through
    /// [`charon_store::redacted`].
    pub url: Option<String>,
    /// Redis: a server that stops renewing its liveness for this long is
    /// counted dead (see `charon serve --help`).
    pub liveness_ttl: Duration,
    /// Redis: the time limit of each operation.
    pub op_timeout: Duration,
    /// Redis: how long to keep trying to reach it at start-up.
    pub connect_timeout: Duration,
    /// Redis over TLS (`rediss://`): a PEM file of the CA certificates to
    /// trust instead of the system's roots.
    pub redis_ca: Option<PathBuf>,
    /// Redis over TLS: a PEM file with this server's client certificate
    /// (chain), for a Redis that requires one (mutual TLS); with
    /// `redis_key`.
    pub redis_cert: Option<PathBuf>,
    /// Redis over TLS: the PEM private key of `redis_cert`.
    pub redis_key: Option<PathBuf>,
    /// Redis: the most decisions of one hash slot sent as one script call
    /// when they queue behind a call in flight (1: every decision alone).
    pub max_batch: usize,
}

// By hand: the derived form would print the URL's password.
impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &self.url.as_deref().map(charon_store::redacted))
            .field("liveness_ttl", &self.liveness_ttl)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("redis_ca", &self.redis_ca)
            .field("redis_cert", &self.redis_cert)
            .field("redis_key", &self.redis_key)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: None,
            liveness_ttl: Duration::from_secs(10),
            op_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(30),
            redis_ca: None,
            redis_cert: None,
            redis_key: None,
            max_batch: charon_store::RedisOptions::default().max_batch,
        }
    }
}

/// The listeners [`run`] serves on.
#[derive(Debug)]
pub enum Listeners {
    /// Already bound by the caller (tests: port 0). With
    /// [`ConfigSource::ApiOnly`] only `http` is used (`grpc` is closed at
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
    /// Bound by [`run`] at the settings' (or the file's) addresses, once the
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

/// The gRPC side as [`serve`] gets it.
enum GrpcSide {
    Listener(TcpListener),
    Incoming(GrpcIncoming),
}

impl GrpcSide {
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Listener(l) => l.local_addr(),
            Self::Incoming(i) => Ok(i.addr),
        }
    }
}

/// How a server that stopped without an error ended: what the process
/// should exit with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop, and stopped cleanly (exit code 0).
    Stopped,
    /// The store made it stop: a Redis server whose holds the others
    /// removed resigned (exit code 3).
    Resigned,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Self::Stopped => 0,
            Self::Resigned => 3,
        }
    }
}

/// Why a server could not start, or stopped by itself (a listener that
/// died): one line, saying what and why.
#[derive(Debug)]
pub struct Error(anyhow::Error);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Error {}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Self(e)
    }
}

/// Resolves on SIGTERM or SIGINT, saying which: the shutdown future of
/// `charon serve`. The handlers are installed by this call, not when the
/// future is first polled (call it inside the runtime, before anything
/// starts): a signal that arrives while the server starts is kept, and
/// [`run`] stops cleanly at once (exit 0) instead of the process dying of
/// it half-started. Never resolves if signals cannot be listened for.
pub fn terminated() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = signals else {
            error!("cannot listen for signals");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
    }
}

/// Runs a server with `settings` on `listeners` until `shutdown` resolves
/// (then a graceful shutdown: sessions end, their holds are released,
/// within `shutdown_grace`), the store resigns ([`Exit::Resigned`]), or the
/// gRPC or HTTP side stops by itself (an [`Error`] naming it, after the
/// same graceful shutdown).
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Exit, Error> {
    run_observed(settings, listeners, shutdown, |_| {}).await
}

/// [`run`], handing the server's state to `started` as soon as it exists
/// (the store open, nothing served yet): for tests and embedders that look
/// inside a running server (its limiter, readiness, configuration report)
/// while it is started exactly as `charon serve` starts it. Not called
/// with [`ConfigSource::ApiOnly`], which has no limiter, nor when the
/// configuration or the store cannot be opened.
pub async fn run_observed(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    started: impl FnOnce(Arc<ServerState>) + Send,
) -> Result<Exit, Error> {
    match settings.source.clone() {
        ConfigSource::ApiOnly(service) => api_only(&settings, &service, listeners, shutdown).await,
        _ => serve(settings, listeners, shutdown, started).await,
    }
    .map_err(Error)
}

/// The configuration source, opened.
enum Source {
    File(PathBuf),
    Inline,
    Service {
        url: String,
        token: Option<String>,
        refresh: Duration,
        cache: Option<PathBuf>,
        tls: ConfigTls,
    },
    Embedded(AppState, EmbeddedService),
}

async fn serve(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    started: impl FnOnce(Arc<ServerState>) + Send,
) -> anyhow::Result<Exit> {
    // Before the store opens: what it counts from the start (at zero)
    // must reach the recorder that /metrics renders.
    crate::metrics::install();
    // Watched from the start: a stop asked while the configuration or the
    // store opens (Redis may take --store-connect-timeout) ends the start.
    let mut shutdown = Box::pin(shutdown);
    let mut options = settings.server_options();
    let tls = open_tls(settings.tls.clone())?;
    options.tls.clone_from(&tls);
    let (source, initial, file_settings) = match settings.source {
        ConfigSource::File(path) => {
            let (config, from_file) = config_file::load_file(&path)
                .map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
            (Source::File(path), Some(config), from_file)
        }
        ConfigSource::Inline(config) => {
            (Source::Inline, Some(config), FileServerSettings::default())
        }
        ConfigSource::Service {
            url,
            token,
            refresh,
            cache,
            tls,
        } => (
            Source::Service {
                url,
                token,
                refresh,
                cache,
                tls: tls
                    .read()
                    .context("--config-ca/--config-cert/--config-key")?,
            },
            None,
            FileServerSettings::default(),
        ),
        ConfigSource::Embedded(service) => {
            let app = tokio::select! {
                app = embedded::open(&service) => app?,
                () = &mut shutdown => return Ok(stopped_while_starting()),
            };
            (
                Source::Embedded(app, service),
                None,
                FileServerSettings::default(),
            )
        }
        ConfigSource::ApiOnly(_) => unreachable!("run serves ApiOnly apart"),
    };
    let store_url = settings
        .store
        .url
        .clone()
        .or(file_settings.store)
        .unwrap_or_else(|| "memory".to_owned());
    let store = tokio::select! {
        store = store::open(&store_url, &settings.store) => store?,
        () = &mut shutdown => return Ok(stopped_while_starting()),
    };
    let limiter = Limiter::new(initial.unwrap_or_default(), store.clone());
    let state = ServerState::new(limiter, options);
    if let Some(tls) = &tls {
        tls.spawn_reloader(state.shutdown.clone());
    }
    if let Some(path) = &settings.api_tokens {
        let tokens = crate::api_auth::ApiTokens::load(path)
            .map_err(|e| anyhow::anyhow!("--api-tokens: {e}"))?;
        tracing::info!(
            file = %path.display(),
            tokens = tokens.len(),
            "the limiting API needs a token"
        );
        state.api_auth.set(tokens);
        crate::api_auth::spawn_reloader(state.clone(), path.clone());
    }
    if let Some(events) = &settings.events {
        let events =
            crate::events::Events::start(events, server_id()).context("decision events")?;
        state.set_events(events);
    }
    if let Some(parent) = &settings.lease_parent {
        lease_parent::spawn(&state, parent, &settings.lease_parent_tls, server_id())?;
    }
    started(state.clone());
    if !matches!(source, Source::File(_) | Source::Inline) {
        // Not ready, and answering server errors, until the feed's first
        // view arrives.
        state.report_config(ConfigReport {
            source: "a configuration service, not reached yet".to_owned(),
            version: 0,
            loaded: false,
            problem: None,
        });
    }
    let (grpc, http) = match listeners {
        Listeners::Bound { grpc, http } => (GrpcSide::Listener(grpc), http),
        Listeners::Incoming { grpc, http } => (GrpcSide::Incoming(grpc), http),
        Listeners::AtSettings => {
            let listen = settings
                .listen
                .or(file_settings.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
            let http_listen = settings
                .http_listen
                .or(file_settings.http_listen)
                .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.to_owned());
            (
                GrpcSide::Listener(bind(&listen, "gRPC").await?),
                bind(&http_listen, "HTTP").await?,
            )
        }
    };
    let http_addr = http.local_addr()?;

    let embedded_feed = embedded::FeedSlot::default();
    let mut routes = charon_simulator_web::router();
    let described = match &source {
        Source::File(path) => {
            state.report_config(config_file::file_report(path, None));
            file_reload::spawn_file_reloader(state.clone(), path.clone());
            format!("configuration from {}", path.display())
        }
        Source::Inline => "configuration given at start".to_owned(),
        Source::Service { url, .. } => format!("configuration from the service at {url}"),
        Source::Embedded(app, service) => {
            embedded::follow_tokens_file(app, service, &state.shutdown);
            routes = routes.merge(embedded::answer_when_in_force(
                charon_config_service::router(app.clone()),
                embedded_feed.clone(),
            ));
            format!(
                "configuration from the embedded service on {http_addr}, database {}",
                service.db
            )
        }
    };
    info!(
        "charon listening on {} (gRPC) and {http_addr} (HTTP){}, store {}, {described}",
        grpc.local_addr()?,
        tls_described(tls.as_deref()),
        store.kind(),
    );
    let server = match grpc {
        GrpcSide::Listener(grpc) => tokio::spawn(crate::serve(state.clone(), grpc, http, routes)),
        GrpcSide::Incoming(GrpcIncoming { addr, stream }) => tokio::spawn(crate::serve_incoming(
            state.clone(),
            (addr, stream),
            http,
            routes,
        )),
    };

    // The feed must outlive the server: dropping its handle stops it.
    let _feed = match &source {
        Source::File(_) | Source::Inline => None,
        Source::Service {
            url,
            token,
            refresh,
            cache,
            tls,
        } => Some(feed::follow(
            &state,
            url,
            token.clone(),
            *refresh,
            cache.clone(),
            tls.clone(),
        )?),
        Source::Embedded(_, service) => {
            // Under TLS the feed connects to this server's own HTTP
            // listener with its own certificate, trusting only that one
            // (see `ServerTls::loopback_client`).
            let loopback_tls = match &tls {
                Some(tls) => ConfigTls {
                    rustls: Some(Arc::new(tls.loopback_client().map_err(anyhow::Error::msg)?)),
                    ..ConfigTls::default()
                },
                None => ConfigTls::default(),
            };
            let feed = feed::follow(
                &state,
                &embedded::loopback_url(http_addr, tls.is_some()),
                None,
                service.refresh,
                service.cache.clone(),
                loopback_tls,
            )?;
            let _ = embedded_feed.set(feed.clone());
            Some(feed)
        }
    };
    {
        let state = state.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => state.shutdown.trigger(),
                () = state.shutdown.wait() => {}
            }
        });
    }
    // The recorder keeps every histogram sample until an upkeep drains it;
    // /metrics runs one, but a server nobody scrapes would otherwise grow
    // by 16 bytes per decision without bound.
    {
        let state = state.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::metrics::UPKEEP_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => crate::metrics::install().run_upkeep(),
                    () = state.shutdown.wait() => break,
                }
            }
        });
    }
    // Set before the shutdown is triggered: the servers can finish before
    // the upkeep task is seen as finished, and a resignation must still
    // exit 3 (a test once saw 0).
    let resigned = Arc::new(AtomicBool::new(false));
    let maintenance = {
        let (state, store, resigned) = (state.clone(), store.clone(), resigned.clone());
        tokio::spawn(async move {
            let reason = store.maintain().await;
            error!("store stopped: {reason}; shutting down");
            resigned.store(true, Ordering::SeqCst);
            state.set_ready(false);
            state.shutdown.trigger();
            reason
        })
    };
    // A gRPC or HTTP side that stopped by itself is an error: after the
    // same clean shutdown, the process exits 1 with the reason.
    let served = server.await?;
    if let Some(events) = state.events() {
        // What is queued is written before the process ends.
        events.close(Duration::from_secs(2));
    }
    if let Source::Embedded(app, _) = &source {
        app.close().await;
    }
    if resigned.load(Ordering::SeqCst) {
        return Ok(Exit::Resigned);
    }
    if let Err(e) = store.leave().await {
        warn!(
            "could not leave the store cleanly ({e}); the others will clean up after this server"
        );
    }
    // The process used to end here; a server run in-process stops its
    // store's upkeep instead (after leaving, as the process did).
    maintenance.abort();
    served?;
    info!("stopped");
    Ok(Exit::Stopped)
}

/// A stop asked before the server opened its store: nothing to drain.
fn stopped_while_starting() -> Exit {
    info!("stopped before it started serving");
    Exit::Stopped
}

/// Reads and checks the TLS files, if any: a problem is an error at start.
fn open_tls(settings: Option<TlsSettings>) -> anyhow::Result<Option<Arc<ServerTls>>> {
    settings
        .map(|s| ServerTls::load(s).map_err(|e| anyhow::anyhow!("TLS: {e}")))
        .transpose()
}

/// How the log line at start says what TLS is on.
fn tls_described(tls: Option<&ServerTls>) -> &'static str {
    match tls {
        None => "",
        Some(t) if t.mutual() => " over mutual TLS",
        Some(_) => " over TLS",
    }
}

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// The configuration service alone.
async fn api_only(
    settings: &Settings,
    service: &EmbeddedService,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Exit> {
    let tls = open_tls(settings.tls.clone())?;
    let app = embedded::open(service).await?;
    let http = match listeners {
        Listeners::Bound { grpc, http } => {
            // No gRPC here: closed now, not when `run` returns.
            drop(grpc);
            http
        }
        Listeners::Incoming { grpc, http } => {
            drop(grpc);
            http
        }
        Listeners::AtSettings => {
            let http_listen = settings
                .http_listen
                .clone()
                .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.to_owned());
            bind(&http_listen, "HTTP").await?
        }
    };
    info!(
        "charon configuration service listening on {} (HTTP){}, database {}",
        http.local_addr()?,
        tls_described(tls.as_deref()),
        service.db
    );
    let stopping = crate::Shutdown::new();
    embedded::follow_tokens_file(&app, service, &stopping);
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            info!("shutting down");
            stopping.trigger();
        }
    };
    let routes = charon_config_service::router(app.clone())
        .route("/healthz", axum::routing::get(|| async { "ok\n" }));
    match tls {
        None => {
            axum::serve(http, routes)
                .with_graceful_shutdown(shutdown)
                .await?;
        }
        Some(tls) => {
            tls.spawn_reloader(stopping);
            axum::serve(crate::tls::HttpListener::new(tls, http)?, routes)
                .with_graceful_shutdown(shutdown)
                .await?;
        }
    }
    app.close().await;
    info!("stopped");
    Ok(Exit::Stopped)
}
