//! `charon serve`: wiring only. Flags become settings, settings become a
//! store, a limiter, a configuration source and listeners; the server and
//! config-service crates do the serving.
//!
//! Where the limits come from:
//! - `--config FILE`: a file, reloaded on change and on SIGHUP;
//! - `--config-url URL`: a configuration service, polled for deltas every
//!   `--config-refresh` and on SIGHUP, its last view kept while it is down;
//! - neither (the embedded default): a configuration service in this
//!   process on the database `--db` (a local SQLite file by default),
//!   mounted on the HTTP address, which the limiter follows like any other.
//!
//! `--config-api-only` runs just the configuration service (production
//! splits it from the limiting servers).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use charon_config_service::feed::{ConfigFeed, FeedHandle, FeedOptions};
use charon_config_service::{AppState, Tokens};
use charon_core::config::Config;
use charon_limiter::Limiter;
use charon_server::config_file::{self, FileServerSettings};
use charon_server::file_reload;
use charon_server::{ConfigReport, ServerOptions, ServerState};
use charon_store::{MemoryStore, RedisOptions, RedisStore, Store, SystemClock};
use clap::Args;
use tokio::net::TcpListener;
use tracing::{error, info, warn};

/// Flags of `charon serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Limits from this file (SPEC §6 YAML), reloaded on SIGHUP and when it
    /// changes. It may carry a `server:` section (store, listen,
    /// http_listen) that these flags override.
    #[arg(long, value_name = "FILE", env = "CHARON_CONFIG", conflicts_with_all = ["config_url", "config_api_only"])]
    pub config: Option<PathBuf>,
    /// Limits from the configuration service at this URL.
    #[arg(
        long,
        value_name = "URL",
        env = "CHARON_CONFIG_URL",
        conflicts_with = "config_api_only"
    )]
    pub config_url: Option<String>,
    /// How often to ask the configuration service for changes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    pub config_refresh: Duration,
    /// Keep the last configuration view in this file, so a server that
    /// starts while the configuration service is down still has limits.
    #[arg(long, value_name = "FILE")]
    pub config_cache: Option<PathBuf>,
    /// Bearer token(s) of the configuration service: with --config-url, the
    /// token to read with (if it needs one); for the embedded service, the
    /// write tokens it accepts (`write:S,read:S`; a bare S is a write
    /// token). Without one, the embedded service makes a write token and
    /// keeps it in `<db>.token`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CHARON_CONFIG_TOKEN",
        hide_env_values = true
    )]
    pub config_token: Option<String>,
    /// The embedded configuration service's database: a SQLite file path
    /// or a `postgres://` URL.
    #[arg(
        long,
        value_name = "PATH|URL",
        default_value = "charon.db",
        env = "CHARON_DB"
    )]
    pub db: String,
    /// Run only the configuration service (on the HTTP address), no limiter.
    #[arg(long)]
    pub config_api_only: bool,
    /// gRPC address [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDR", env = "CHARON_LISTEN")]
    pub listen: Option<String>,
    /// HTTP address: /metrics, /healthz, /readyz, the simulator page and
    /// the embedded configuration API [default: 127.0.0.1:7071].
    #[arg(long, value_name = "ADDR", env = "CHARON_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Where state lives: `memory` (this process only) or
    /// `redis://host:port` [default: memory].
    #[arg(long, value_name = "URL", env = "CHARON_STORE")]
    pub store: Option<String>,
    /// Redis store: a server that stops renewing its liveness for this long
    /// (and a third more) is counted dead and the others remove its holds.
    /// It renews every third of it; from half of it without a renewal its
    /// copy operations get server errors until it renews again. It resigns
    /// (exit 3) only if the others removed its holds.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub liveness_ttl: Duration,
    /// Redis store: the time limit of each operation (then a server error).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub store_timeout: Duration,
    /// Redis store: how long to keep trying to reach Redis at start-up.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub store_connect_timeout: Duration,
    /// A client that stops answering is detected, and its holds released,
    /// within about this long.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    pub keepalive: Duration,
    /// The longest a graceful shutdown (SIGTERM) may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

/// Exit code of a server whose store made it stop (a Redis server that
/// resigned).
const EXIT_RESIGNED: u8 = 3;

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        if args.config_api_only {
            config_api_only(args).await
        } else {
            serve(args).await
        }
    })
}

/// Where the limits come from.
enum Source {
    File(PathBuf),
    Service(String),
    Embedded(AppState),
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let (source, initial, file_settings) = match (&args.config, &args.config_url) {
        (Some(path), _) => {
            let (config, settings) = config_file::load_file(path)
                .map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
            (Source::File(path.clone()), Some(config), settings)
        }
        (None, Some(url)) => (
            Source::Service(url.clone()),
            None,
            FileServerSettings::default(),
        ),
        (None, None) => (
            Source::Embedded(open_embedded(&args).await?),
            None,
            FileServerSettings::default(),
        ),
    };
    let store_url = args
        .store
        .clone()
        .or(file_settings.store)
        .unwrap_or_else(|| "memory".to_owned());
    let listen = args
        .listen
        .clone()
        .or(file_settings.listen)
        .unwrap_or_else(|| "127.0.0.1:7070".to_owned());
    let http_listen = args
        .http_listen
        .clone()
        .or(file_settings.http_listen)
        .unwrap_or_else(|| "127.0.0.1:7071".to_owned());

    let store = open_store(&store_url, &args).await?;
    let limiter = Limiter::new(initial.unwrap_or_default(), store.clone());
    let options = ServerOptions {
        keepalive: args.keepalive,
        shutdown_grace: args.shutdown_grace,
        ..ServerOptions::default()
    };
    let state = ServerState::new(limiter, options);
    if !matches!(source, Source::File(_)) {
        // Not ready, and answering server errors, until the feed's first
        // view arrives.
        state.report_config(ConfigReport {
            source: "a configuration service, not reached yet".to_owned(),
            version: 0,
            loaded: false,
            problem: None,
        });
    }
    let grpc = bind(&listen, "gRPC").await?;
    let http = bind(&http_listen, "HTTP").await?;
    let http_addr = http.local_addr()?;

    let embedded_feed = FeedSlot::default();
    let mut routes = charon_simulator_web::router();
    let described = match &source {
        Source::File(path) => {
            state.report_config(config_file::file_report(path, None));
            file_reload::spawn_file_reloader(state.clone(), path.clone());
            format!("configuration from {}", path.display())
        }
        Source::Service(url) => format!("configuration from the service at {url}"),
        Source::Embedded(app) => {
            routes = routes.merge(answer_when_in_force(
                charon_config_service::router(app.clone()),
                embedded_feed.clone(),
            ));
            format!(
                "configuration from the embedded service on {http_addr}, database {}",
                args.db
            )
        }
    };
    info!(
        "charon listening on {} (gRPC) and {http_addr} (HTTP), store {}, {described}",
        grpc.local_addr()?,
        store.kind(),
    );
    let server = tokio::spawn(charon_server::serve(state.clone(), grpc, http, routes));

    // The feed must outlive the server: dropping its handle stops it.
    let _feed = match &source {
        Source::File(_) => {
            spawn_signal_handler(state.clone(), None);
            None
        }
        Source::Service(url) => Some(follow(&state, url, &args)?),
        Source::Embedded(_) => {
            let feed = follow(&state, &loopback_url(http_addr), &args)?;
            let _ = embedded_feed.set(feed.clone());
            Some(feed)
        }
    };
    let maintenance = {
        let (state, store) = (state.clone(), store.clone());
        tokio::spawn(async move {
            let reason = store.maintain().await;
            error!("store stopped: {reason}; shutting down");
            state.set_ready(false);
            state.shutdown.trigger();
            reason
        })
    };
    // A gRPC or HTTP side that stopped by itself is an error: after the
    // same clean shutdown, the process exits 1 with the reason.
    let served = server.await?;
    if let Source::Embedded(app) = &source {
        app.close().await;
    }
    if maintenance.is_finished() {
        return Ok(ExitCode::from(EXIT_RESIGNED));
    }
    if let Err(e) = store.leave().await {
        warn!(
            "could not leave the store cleanly ({e}); the others will clean up after this server"
        );
    }
    served?;
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

async fn open_store(url: &str, args: &ServeArgs) -> anyhow::Result<Arc<dyn Store>> {
    if url == "memory" || url == "memory://" {
        return Ok(Arc::new(MemoryStore::new(Arc::new(SystemClock::new()))));
    }
    if !(url.starts_with("redis://")
        || url.starts_with("rediss://")
        || url.starts_with("redis+unix://"))
    {
        bail!("unsupported store {url:?} (expected memory or redis://host:port)");
    }
    let options = RedisOptions {
        server_id: server_id(),
        liveness_ttl: args.liveness_ttl,
        op_timeout: args.store_timeout,
        ..RedisOptions::default()
    };
    let deadline = tokio::time::Instant::now() + args.store_connect_timeout;
    loop {
        match RedisStore::connect(url, options.clone()).await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() < deadline => {
                warn!("cannot use Redis at {url} yet ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => bail!("cannot use Redis at {url}: {e}"),
        }
    }
}

/// This server's name in the Redis membership: host and process id, so an
/// operator can tell whose holds were cleaned up.
fn server_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// Opens the embedded configuration service's database, with the write
/// tokens given or one made up and kept beside the database.
async fn open_embedded(args: &ServeArgs) -> anyhow::Result<AppState> {
    let tokens = match &args.config_token {
        Some(spec) => Tokens::parse(spec).map_err(|e| anyhow::anyhow!("--config-token: {e}"))?,
        None => Tokens::new().writer(embedded_token(&args.db)?),
    };
    AppState::open(&args.db, tokens)
        .await
        .with_context(|| format!("cannot open the configuration database {}", args.db))
}

/// The embedded service's write token when none is configured: read from
/// `<db>.token`, or made up and written there (readable by its owner
/// only). An empty file (a start that could not finish writing it, on a
/// full disk) held no usable token, so it is replaced.
fn embedded_token(db: &str) -> anyhow::Result<String> {
    let path = token_file(db);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
        Ok(_) => warn!(
            "{} is empty (a start that could not finish writing it?); making a new token",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let token = format!("{:032x}", rand::random::<u128>());
    let token = write_token_file(&path, &token)
        .with_context(|| format!("cannot write the write token to {}", path.display()))?;
    info!(
        "the configuration API's write token is in {}",
        path.display()
    );
    Ok(token)
}

/// Puts `token` in `path` whole or not at all: written to a temporary
/// file (mode 0600) and synced, then linked into place, so that no reader
/// and no later start ever sees a half-written token. If another process
/// put a token there meanwhile, that one is used.
fn write_token_file(path: &std::path::Path, token: &str) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(f, "{token}")?;
        f.sync_all()?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(token.to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let there = std::fs::read_to_string(path)?;
                if there.trim().is_empty() {
                    std::fs::rename(&tmp, path)?;
                    Ok(token.to_owned())
                } else {
                    Ok(there.trim().to_owned())
                }
            }
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written
}

/// Where the embedded service keeps its made-up write token.
pub fn token_file(db: &str) -> PathBuf {
    let file = if db.contains("://") {
        "charon.db"
    } else {
        db.trim_start_matches("sqlite:")
    };
    PathBuf::from(format!("{file}.token"))
}

fn loopback_url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        "127.0.0.1".parse().unwrap_or(addr.ip())
    } else {
        addr.ip()
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The limiter's feed, for the embedded service's answers (set once the
/// feed runs, just after the server starts).
type FeedSlot = Arc<OnceLock<Arc<FeedHandle>>>;

/// How long the answer to a write to the embedded service waits for the
/// limiter to hold the version it committed. The feed's own calls are
/// bounded by 5 s too; a write whose version is not in force by then is
/// answered anyway, saying so.
const IN_FORCE_WAIT: Duration = Duration::from_secs(5);

/// Header on every successful write to the embedded service: `true` when
/// the limiter decided by the committed version (or a later one) before
/// the answer left, `false` when it did not within [`IN_FORCE_WAIT`] (the
/// write is committed and applies at the next successful refresh).
const IN_FORCE_HEADER: &str = "charon-config-in-force";

/// The embedded service's routes, answering a successful write only once
/// the limiter's configuration holds the version the write committed (its
/// `ETag`): a `Request` sent after the answer is decided by it.
fn answer_when_in_force(routes: axum::Router, feed: FeedSlot) -> axum::Router {
    use axum::http::{HeaderValue, Method, header};
    routes.layer(axum::middleware::map_response(
        move |method: Method, mut response: axum::response::Response| {
            let feed = feed.clone();
            async move {
                let reads = [Method::GET, Method::HEAD, Method::OPTIONS];
                if reads.contains(&method) || !response.status().is_success() {
                    return response;
                }
                let version = response
                    .headers()
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim_matches('"').parse::<u64>().ok());
                let in_force = match (feed.get(), version) {
                    (Some(feed), Some(version)) => {
                        let held = feed.wait_for_version(version, IN_FORCE_WAIT).await;
                        if !held {
                            warn!(
                                version,
                                in_force = feed.version(),
                                "a write to the configuration API was answered before the \
                                 limiter held its version (waited {IN_FORCE_WAIT:?}); it \
                                 applies at the next successful refresh"
                            );
                        }
                        held
                    }
                    _ => false,
                };
                response.headers_mut().insert(
                    IN_FORCE_HEADER,
                    HeaderValue::from_static(if in_force { "true" } else { "false" }),
                );
                response
            }
        },
    ))
}

/// Keeps the limiter's configuration in step with the service at `url`:
/// a feed polling every `--config-refresh`, refreshed at once on SIGHUP or
/// when a write to the embedded service waits for it, reported in /readyz
/// and /metrics.
fn follow(
    state: &Arc<ServerState>,
    url: &str,
    args: &ServeArgs,
) -> anyhow::Result<Arc<FeedHandle>> {
    let options = FeedOptions {
        token: args
            .config_url
            .is_some()
            .then(|| args.config_token.clone())
            .flatten(),
        cache_file: args.config_cache.clone(),
        ..FeedOptions::default()
    };
    let feed = ConfigFeed::new(url, options)
        .map_err(|e| anyhow::anyhow!("configuration service {url}: {e}"))?;
    let source = format!("service {url}");
    state.limiter.replace_config(Config::clone(&feed.config()));
    state.report_config(ConfigReport {
        source: source.clone(),
        version: feed.version(),
        loaded: feed.is_loaded(),
        problem: None,
    });
    let limiter = state.limiter.clone();
    let handle = Arc::new(feed.spawn(args.config_refresh, move |_, config| {
        limiter.replace_config(Config::clone(&config))
    }));
    let mut status = handle.subscribe();
    let reporter = state.clone();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let s = status.borrow_and_update().clone();
            reporter.report_config(ConfigReport {
                source: source.clone(),
                version: s.version,
                loaded: s.loaded,
                problem: s
                    .last_error
                    .map(|e| format!("the configuration service could not be reached: {e}")),
            });
        }
    });
    spawn_signal_handler(state.clone(), Some(handle.clone()));
    Ok(handle)
}

/// SIGTERM and SIGINT start a graceful shutdown; SIGHUP refreshes the
/// configuration from its service (a file source has its own SIGHUP
/// handling in the reloader).
fn spawn_signal_handler(state: Arc<ServerState>, feed: Option<Arc<FeedHandle>>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            error!("cannot listen for signals");
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM: shutting down"); break; }
                _ = int.recv() => { info!("SIGINT: shutting down"); break; }
                _ = hup.recv() => if let Some(feed) = &feed {
                    info!("SIGHUP: refreshing the configuration");
                    feed.refresh_now();
                },
            }
        }
        state.shutdown.trigger();
    });
}

/// `charon serve --config-api-only`: the configuration service alone.
async fn config_api_only(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let app = open_embedded(&args).await?;
    let http_listen = args
        .http_listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:7071".to_owned());
    let http = bind(&http_listen, "HTTP").await?;
    info!(
        "charon configuration service listening on {} (HTTP), database {}",
        http.local_addr()?,
        args.db
    );
    let shutdown = async {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            }
            _ => std::future::pending().await,
        }
        info!("shutting down");
    };
    let routes = charon_config_service::router(app.clone())
        .route("/healthz", axum::routing::get(|| async { "ok\n" }));
    axum::serve(http, routes)
        .with_graceful_shutdown(shutdown)
        .await?;
    app.close().await;
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}
