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
//!
//! Each concern has its file: [`Settings`] and the source's, store's and
//! TLS files' settings (`settings.rs`), the listeners (`listeners.rs`),
//! the configuration source as a value (`source.rs`), a limiting server
//! from start to stop (`serve.rs`) and the API-only mode (`api_only.rs`).

mod api_only;
mod embedded;
mod feed;
mod lease_parent;
mod listeners;
mod serve;
mod settings;
mod source;
mod store;

use std::future::Future;
use std::sync::Arc;

use tracing::{error, info};

use crate::ServerState;
use crate::tls::{ServerTls, TlsSettings};
use source::Mode;

pub use embedded::token_file;
pub use listeners::{GrpcIncoming, Listeners};
pub use settings::{ClientTlsFiles, ConfigSource, EmbeddedService, Settings, StoreSettings};
pub use store::{check_redis_url, redis_tls, server_id};

/// The gRPC address when neither the settings nor the file name one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The HTTP address when neither the settings nor the file name one.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7071";

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
    match settings.source.clone().into_mode() {
        Mode::ApiOnly(service) => api_only::serve(&settings, &service, listeners, shutdown).await,
        Mode::Limiter(source) => serve::serve(settings, source, listeners, shutdown, started).await,
    }
    .map_err(Error)
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
