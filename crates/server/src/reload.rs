//! Configuration reload without restart, from a file: on SIGHUP and when
//! the file changes. A valid new configuration is swapped in atomically
//! (requests in flight finish with the one they started with); an invalid
//! one is refused, its errors logged, and the old one stays in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use charon_core::config::Config;
use notify::Watcher;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::ServerState;
use crate::metrics;

/// Reads and validates a configuration file; the error lists every
/// problem, one per line, prefixed with the file name.
pub fn load_file(path: &Path) -> Result<Config, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (config, adjustments) = Config::from_yaml(&text).map_err(|errors| {
        errors
            .0
            .iter()
            .map(|e| format!("{}: {e}", path.display()))
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    for a in adjustments {
        info!(file = %path.display(), "normalized: {a}");
    }
    Ok(config)
}

/// Watches `path` and reloads it into `state.limiter` on change or SIGHUP,
/// until shutdown.
pub fn spawn_file_reloader(state: Arc<ServerState>, path: PathBuf) {
    tokio::spawn(async move {
        if let Err(e) = watch(state, path).await {
            error!("configuration reload stopped: {e}");
        }
    });
}

async fn watch(state: Arc<ServerState>, path: PathBuf) -> Result<(), String> {
    let (tx, mut changes) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = tx.send(());
        }
    })
    .map_err(|e| format!("cannot watch files: {e}"))?;
    // Watch the directory, not the file: editors and Kubernetes replace
    // files by renaming, which a watch on the file itself would miss.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        warn!(dir = %dir.display(), "cannot watch the configuration's directory ({e}); reload on SIGHUP only");
    }
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    let mut last = std::fs::read(&path).ok();
    loop {
        let forced = tokio::select! {
            () = state.shutdown.wait() => return Ok(()),
            _ = hangups.recv() => true,
            Some(()) = changes.recv() => false,
        };
        if !forced {
            // Let a burst of events (write, rename, chmod) settle.
            tokio::time::sleep(Duration::from_millis(200)).await;
            while changes.try_recv().is_ok() {}
            let now = std::fs::read(&path).ok();
            if now.is_none() || now == last {
                continue;
            }
            last = now;
        }
        apply(&state, &path);
    }
}

fn apply(state: &ServerState, path: &Path) {
    match load_file(path) {
        Ok(config) => {
            let resources = config.resources().len();
            state.limiter.replace_config(config);
            state
                .config_source
                .store(Arc::new(format!("file {}", path.display())));
            metrics::config_reload(true);
            info!(file = %path.display(), resources, "configuration reloaded");
        }
        Err(errors) => {
            metrics::config_reload(false);
            error!(file = %path.display(), "configuration refused; the previous one stays in force:\n{errors}");
        }
    }
}
