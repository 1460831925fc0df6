//! Following a configuration service: the limiter's configuration kept in
//! step with it, reported in /readyz and /metrics, refreshed on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use charon_config_client::{ConfigFeed, ConfigTls, FeedHandle, FeedOptions};
use charon_core::config::Config;
use tracing::{error, info};

use crate::{ConfigReport, ServerState};

/// Keeps the limiter's configuration in step with the service at `url`:
/// a feed polling every `refresh`, refreshed at once on SIGHUP or when a
/// write to the embedded service waits for it, reported in /readyz and
/// /metrics.
pub(super) fn follow(
    state: &Arc<ServerState>,
    url: &str,
    token: Option<String>,
    refresh: Duration,
    cache_file: Option<PathBuf>,
    tls: ConfigTls,
) -> anyhow::Result<Arc<FeedHandle>> {
    let options = FeedOptions {
        token,
        cache_file,
        tls,
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
    let handle = Arc::new(feed.spawn(refresh, move |_, config| {
        limiter.replace_config(Config::clone(&config));
    }));
    let mut status = handle.subscribe();
    let reporter = state.clone();
    tokio::spawn(async move {
        let (mut version, mut failures) = (feed_version(&status), 0);
        while status.changed().await.is_ok() {
            let s = status.borrow_and_update().clone();
            // Refreshes failed since the last look (several may pass
            // between two looks; a success in between resets the count).
            let failed = if s.consecutive_failures >= failures {
                s.consecutive_failures - failures
            } else {
                s.consecutive_failures
            };
            for _ in 0..failed {
                crate::metrics::config_refresh_failed();
            }
            failures = s.consecutive_failures;
            if s.version != version {
                crate::metrics::config_reload(true);
                version = s.version;
            }
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
    refresh_on_sighup(state.clone(), handle.clone());
    Ok(handle)
}

/// The version a feed's status starts from.
fn feed_version(status: &tokio::sync::watch::Receiver<charon_config_client::FeedStatus>) -> u64 {
    status.borrow().version
}

/// SIGHUP refreshes the configuration from its service (a file source has
/// its own SIGHUP handling in the reloader), until shutdown.
fn refresh_on_sighup(state: Arc<ServerState>, feed: Arc<FeedHandle>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            error!("cannot listen for signals");
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    info!("SIGHUP: refreshing the configuration");
                    feed.refresh_now();
                }
                () = state.shutdown.wait() => break,
            }
        }
    });
}
