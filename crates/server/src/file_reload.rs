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
use crate::config_file::{FileServerSettings, file_report, load_bytes};
use crate::metrics;

/// How long a watched file must stay the same before it is applied: a
/// writer that truncates and then writes, or writes in several pieces,
/// is never seen half-way as long as its pauses are shorter than this.
/// SIGHUP applies the file as it is, at once.
pub const DEBOUNCE: Duration = Duration::from_millis(250);

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
        let text = if forced {
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        } else {
            // Debounce: the content must read the same twice, DEBOUNCE
            // apart, before it is applied. Events meanwhile (this file's or
            // its neighbours') only mean "look again".
            let mut seen = std::fs::read(&path).ok();
            loop {
                tokio::select! {
                    () = state.shutdown.wait() => return Ok(()),
                    () = tokio::time::sleep(DEBOUNCE) => {}
                }
                while changes.try_recv().is_ok() {}
                let now = std::fs::read(&path).ok();
                if now == seen {
                    break;
                }
                seen = now;
            }
            match seen {
                // Gone (being replaced) or unchanged: nothing to do.
                None => continue,
                Some(ref now) if Some(now) == last.as_ref() => continue,
                Some(now) => {
                    last = Some(now.clone());
                    Ok(now)
                }
            }
        };
        apply(&state, &path, text.and_then(|t| load_bytes(&path, &t)));
    }
}

fn apply(state: &ServerState, path: &Path, loaded: Result<(Config, FileServerSettings), String>) {
    match loaded {
        Ok((config, _)) => {
            let resources = config.resources().len();
            state.limiter.replace_config(config);
            state.report_config(file_report(path, None));
            metrics::config_reload(true);
            info!(file = %path.display(), resources, "configuration reloaded");
        }
        Err(errors) => {
            metrics::config_reload(false);
            state.report_config(file_report(
                path,
                Some("the file changed and is invalid; see the log".to_owned()),
            ));
            error!(file = %path.display(), "configuration refused; the previous one stays in force:\n{errors}");
        }
    }
}
