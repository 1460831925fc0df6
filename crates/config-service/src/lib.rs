//! Charon's configuration service (paper §4.1).
//!
//! The central authority for resource configurations: an HTTP JSON API
//! ([`router`]) over a relational database (a SQLite file by default,
//! PostgreSQL by URL), where every change is validated and normalized by
//! charon-core before it is committed, every commit bumps one global
//! version, and limiting servers keep their own view in sync by polling
//! deltas (`GET /v1/changes`). The JSON bodies of that contract are
//! [`wire`]; the client side (the HTTP client of `charon config` and the
//! feed of limiting servers) is the crate above, `charon-config-client`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use charon_config_service::{AppState, Tokens, serve};
//! let state = AppState::open("charon-config.db", Tokens::new().writer("s3cret")).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7072").await?;
//! serve(listener, state, std::future::pending()).await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/config-service.md` for the endpoints, versions and choices.

// The wire bodies' fields are documented by `docs/config-service.md` and the
// OpenAPI document, not yet item by item.
#![allow(missing_docs)]
#![warn(clippy::print_stdout, clippy::print_stderr)]

mod api;
mod audit;
mod auth;
mod edit;
mod error;
mod store;

/// The JSON bodies of the API (the crate `charon-config-wire`, which the
/// clients use without this one).
pub use charon_config_wire as wire;

use std::future::Future;
use std::sync::Arc;

pub use api::router;
pub use auth::{Role, Tokens};
pub use store::{ConfigDbError, DEFAULT_AUDIT_VERSIONS, StoreOptions};

/// The OpenAPI 3.1 document served at `/openapi.json`, generated (by
/// utoipa) from the handlers' attributes and the bodies' types, so that it
/// cannot drift from what the API serves.
pub fn openapi_json() -> &'static str {
    api::openapi_json()
}

/// What the API needs: the database and the tokens. Cheap to clone; holds
/// no global state, so several can live in one process (tests do).
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: store::Db,
    /// Swapped whole when a tokens file changes (`set_tokens`).
    tokens: arc_swap::ArcSwap<Tokens>,
}

impl AppState {
    /// Opens (creating if needed) the database and brings its schema up to
    /// date. `database` is a `postgres://…` URL, a `sqlite:…` URL, or the
    /// path of a SQLite file.
    pub async fn open(database: &str, tokens: Tokens) -> Result<Self, ConfigDbError> {
        Self::open_with(database, tokens, StoreOptions::default()).await
    }

    /// [`AppState::open`] with storage options (history kept, pool size).
    pub async fn open_with(
        database: &str,
        tokens: Tokens,
        options: StoreOptions,
    ) -> Result<Self, ConfigDbError> {
        let db = store::Db::open(database, &options).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                tokens: arc_swap::ArcSwap::from_pointee(tokens),
            }),
        })
    }

    /// Closes the database connections (requests after this fail with 503).
    pub async fn close(&self) {
        self.inner.db.close().await;
    }

    pub(crate) fn db(&self) -> &store::Db {
        &self.inner.db
    }

    pub(crate) fn tokens(&self) -> arc_swap::Guard<Arc<Tokens>> {
        self.inner.tokens.load()
    }

    /// Accepts `tokens` from now on instead of those in force (a rotated
    /// tokens file); requests already past the check are not affected.
    pub fn set_tokens(&self, tokens: Tokens) {
        self.inner.tokens.store(Arc::new(tokens));
    }
}

/// Serves the API on `listener` until `shutdown` completes, then finishes
/// the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "configuration API listening");
    }
    axum::serve(listener, router(state).fallback(api::not_found))
        .with_graceful_shutdown(shutdown)
        .await
}
