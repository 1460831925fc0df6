//! The configuration source of a limiting server as a value with methods:
//! [`LimiterSource`] is what the settings ask for (every [`ConfigSource`]
//! but the API-only mode), [`Source`] the same source opened: it says what
//! it is ([`Source::describe`]), mounts what it serves beside the limiter
//! ([`Source::mount`]) and keeps the limiter in step with it
//! ([`Source::follow`]).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use charon_config_client::{ConfigTls, FeedHandle};
use charon_config_service::AppState;
use charon_core::config::Config;

use super::{ClientTlsFiles, ConfigSource, EmbeddedService, embedded, feed};
use crate::config_file::{self, FileServerSettings};
use crate::tls::ServerTls;
use crate::{ConfigReport, ServerState, file_reload};

/// What a server runs as, from its configuration source.
pub(super) enum Mode {
    /// A limiter, its limits from this source.
    Limiter(LimiterSource),
    /// Only the embedded configuration service: no limiter, no gRPC, no
    /// store.
    ApiOnly(EmbeddedService),
}

impl ConfigSource {
    /// The mode this source asks for.
    pub(super) fn into_mode(self) -> Mode {
        Mode::Limiter(match self {
            Self::File(path) => LimiterSource::File(path),
            Self::Service {
                url,
                token,
                refresh,
                cache,
                tls,
            } => LimiterSource::Service {
                url,
                token,
                refresh,
                cache,
                tls,
            },
            Self::Inline(config) => LimiterSource::Inline(config),
            Self::Embedded(service) => LimiterSource::Embedded(service),
            Self::ApiOnly(service) => return Mode::ApiOnly(service),
        })
    }
}

/// Where a limiter's limits come from (see [`ConfigSource`], whose
/// variants these are but the API-only one).
pub(super) enum LimiterSource {
    File(PathBuf),
    Service {
        url: String,
        token: Option<String>,
        refresh: Duration,
        cache: Option<PathBuf>,
        tls: ClientTlsFiles,
    },
    Inline(Config),
    Embedded(EmbeddedService),
}

/// A configuration source, opened: its files read, its database open.
pub(super) enum Source {
    File(PathBuf),
    Inline,
    Service {
        url: String,
        token: Option<String>,
        refresh: Duration,
        cache: Option<PathBuf>,
        tls: ConfigTls,
    },
    Embedded {
        app: AppState,
        service: EmbeddedService,
        /// The limiter's feed, for the service's answers to writes (set by
        /// [`Source::follow`]).
        feed: embedded::FeedSlot,
    },
}

/// What opening a source gives.
pub(super) struct Opened {
    pub source: Source,
    /// The configuration to start with; `None`: none yet (the feed brings
    /// it).
    pub initial: Option<Config>,
    /// The configuration file's `server:` section (empty for the others).
    pub from_file: FileServerSettings,
}

impl Source {
    /// Opens `source`. `None`: `shutdown` resolved first, which only the
    /// embedded service's database can give it time to do.
    pub(super) async fn open(
        source: LimiterSource,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> anyhow::Result<Option<Opened>> {
        let opened = |source, initial, from_file| {
            Some(Opened {
                source,
                initial,
                from_file,
            })
        };
        Ok(match source {
            LimiterSource::File(path) => {
                let (config, from_file) = config_file::load_file(&path)
                    .map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
                opened(Self::File(path), Some(config), from_file)
            }
            LimiterSource::Inline(config) => {
                opened(Self::Inline, Some(config), FileServerSettings::default())
            }
            LimiterSource::Service {
                url,
                token,
                refresh,
                cache,
                tls,
            } => opened(
                Self::Service {
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
            LimiterSource::Embedded(service) => {
                let app = tokio::select! {
                    app = embedded::open(&service) => app?,
                    () = shutdown => return Ok(None),
                };
                let feed = embedded::FeedSlot::default();
                opened(
                    Self::Embedded { app, service, feed },
                    None,
                    FileServerSettings::default(),
                )
            }
        })
    }

    /// The report of a server that waits for its first view of a
    /// configuration service (not ready, answering server errors, until it
    /// comes); `None` for a source read at start.
    pub(super) fn awaiting(&self) -> Option<ConfigReport> {
        match self {
            Self::File(_) | Self::Inline => None,
            Self::Service { .. } | Self::Embedded { .. } => Some(ConfigReport {
                source: "a configuration service, not reached yet".to_owned(),
                version: 0,
                loaded: false,
                problem: None,
            }),
        }
    }

    /// Starts what the source serves beside the limiter and returns the
    /// HTTP routes with its own: a file is reported and reloaded on change,
    /// the embedded service follows its tokens file and answers on the
    /// HTTP address.
    pub(super) fn mount(&self, state: &Arc<ServerState>, routes: axum::Router) -> axum::Router {
        match self {
            Self::File(path) => {
                state.report_config(config_file::file_report(path, None));
                file_reload::spawn_file_reloader(state.clone(), path.clone());
                routes
            }
            Self::Inline | Self::Service { .. } => routes,
            Self::Embedded { app, service, feed } => {
                embedded::follow_tokens_file(app, service, &state.shutdown);
                routes.merge(embedded::answer_when_in_force(
                    charon_config_service::router(app.clone()),
                    feed.clone(),
                ))
            }
        }
    }

    /// Where the limits come from, for the log line at start.
    pub(super) fn describe(&self, http_addr: SocketAddr) -> String {
        match self {
            Self::File(path) => format!("configuration from {}", path.display()),
            Self::Inline => "configuration given at start".to_owned(),
            Self::Service { url, .. } => format!("configuration from the service at {url}"),
            Self::Embedded { service, .. } => format!(
                "configuration from the embedded service on {http_addr}, database {}",
                service.db
            ),
        }
    }

    /// Keeps the limiter in step with a configuration service: the feed,
    /// which must outlive the server (dropping it stops it); `None` for a
    /// source read at start. The embedded service is followed through this
    /// server's own HTTP listener at `http_addr`, under `tls` with its own
    /// certificate, trusting only that one (see
    /// [`ServerTls::loopback_client`]).
    pub(super) fn follow(
        &self,
        state: &Arc<ServerState>,
        http_addr: SocketAddr,
        tls: Option<&Arc<ServerTls>>,
    ) -> anyhow::Result<Option<Arc<FeedHandle>>> {
        Ok(match self {
            Self::File(_) | Self::Inline => None,
            Self::Service {
                url,
                token,
                refresh,
                cache,
                tls,
            } => Some(feed::follow(
                state,
                url,
                token.clone(),
                *refresh,
                cache.clone(),
                tls.clone(),
            )?),
            Self::Embedded { service, feed, .. } => {
                let loopback_tls = match tls {
                    Some(tls) => ConfigTls {
                        rustls: Some(Arc::new(tls.loopback_client().map_err(anyhow::Error::msg)?)),
                        ..ConfigTls::default()
                    },
                    None => ConfigTls::default(),
                };
                let handle = feed::follow(
                    state,
                    &embedded::loopback_url(http_addr, tls.is_some()),
                    None,
                    service.refresh,
                    service.cache.clone(),
                    loopback_tls,
                )?;
                let _ = feed.set(handle.clone());
                Some(handle)
            }
        })
    }

    /// Closes the embedded service's database, once the server stopped.
    pub(super) async fn close(&self) {
        if let Self::Embedded { app, .. } = self {
            app.close().await;
        }
    }
}
