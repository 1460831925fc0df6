//! The embedded configuration service: its database and write token, and
//! its writes answered only once the limiter holds what they committed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use charon_config_client::FeedHandle;
use charon_config_service::{AppState, StoreOptions, Tokens};
use tracing::{error, info, warn};

use super::EmbeddedService;

/// Opens the embedded configuration service's database, with the write
/// tokens given or one made up and kept beside the database.
pub(super) async fn open(service: &EmbeddedService) -> anyhow::Result<AppState> {
    let tokens = match (&service.tokens, &service.tokens_file) {
        (_, Some(path)) => {
            read_tokens_file(path).map_err(|e| anyhow::anyhow!("--config-tokens-file: {e}"))?
        }
        (Some(spec), None) => {
            Tokens::parse(spec).map_err(|e| anyhow::anyhow!("--config-token: {e}"))?
        }
        (None, None) => Tokens::new().writer(embedded_token(&service.db)?),
    };
    let options = StoreOptions {
        audit_versions: service.audit_keep,
        ..StoreOptions::default()
    };
    AppState::open_with(&service.db, tokens, options)
        .await
        .with_context(|| format!("cannot open the configuration database {}", service.db))
}

/// The tokens of a tokens file, or why it cannot be used.
fn read_tokens_file(path: &std::path::Path) -> Result<Tokens, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Tokens::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Keeps the service's tokens in step with its tokens file, if it has
/// one: re-read on SIGHUP and when it changes (the configuration file's
/// `FileWatch`), until `shutdown`. A file that does not load is logged
/// and the tokens in force stay.
pub(super) fn follow_tokens_file(
    app: &AppState,
    service: &EmbeddedService,
    shutdown: &crate::Shutdown,
) {
    let Some(path) = service.tokens_file.clone() else {
        return;
    };
    let (app, shutdown) = (app.clone(), shutdown.clone());
    let mut watch = match crate::file_reload::FileWatch::new(&path, "configuration API tokens") {
        Ok(watch) => watch,
        Err(e) => return error!("configuration API tokens are not reloaded: {e}"),
    };
    tokio::spawn(async move {
        let result = async {
            while let Some(text) = watch.next(&shutdown).await? {
                let tokens = text.and_then(|t| {
                    Tokens::parse_file(&String::from_utf8_lossy(&t))
                        .map_err(|e| format!("{}: {e}", path.display()))
                });
                match tokens {
                    Ok(tokens) => {
                        info!(file = %path.display(), tokens = tokens.names().len(), "configuration API tokens reloaded");
                        app.set_tokens(tokens);
                    }
                    Err(e) => {
                        error!(
                            "configuration API tokens refused; the previous ones stay in force: {e}"
                        );
                    }
                }
            }
            Ok::<(), String>(())
        };
        if let Err(e) = result.await {
            error!("configuration API tokens are not reloaded: {e}");
        }
    });
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

/// The URL of this server's own HTTP listener, for the embedded
/// service's feed (`https://` under TLS).
pub(super) fn loopback_url(addr: SocketAddr, tls: bool) -> String {
    let ip = if addr.ip().is_unspecified() {
        "127.0.0.1".parse().unwrap_or(addr.ip())
    } else {
        addr.ip()
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// The limiter's feed, for the embedded service's answers (set once the
/// feed runs, just after the server starts).
pub(super) type FeedSlot = Arc<OnceLock<Arc<FeedHandle>>>;

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
pub(super) fn answer_when_in_force(routes: axum::Router, feed: FeedSlot) -> axum::Router {
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
