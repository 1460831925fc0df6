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
        let result = async {
            let mut watch = FileWatch::new(&path, "configuration")?;
            while let Some(text) = watch.next(&state.shutdown).await? {
                apply(&state, &path, text.and_then(|t| load_bytes(&path, &t)));
            }
            Ok::<(), String>(())
        };
        if let Err(e) = result.await {
            error!("configuration reload stopped: {e}");
        }
    });
}

/// A file watched for reloads (the configuration file, the API tokens
/// file): yields its content on SIGHUP (as it is, at once) and when it
/// changed and settled (read the same twice, [`DEBOUNCE`] apart, and
/// unlike what it last yielded).
pub(crate) struct FileWatch {
    path: PathBuf,
    // Kept alive: dropping it stops the events.
    _watcher: notify::RecommendedWatcher,
    changes: mpsc::UnboundedReceiver<()>,
    hangups: tokio::signal::unix::Signal,
    last: Option<Vec<u8>>,
}

impl FileWatch {
    /// Starts watching `path` (`what` names it in warnings).
    pub(crate) fn new(path: &Path, what: &str) -> Result<Self, String> {
        let (tx, changes) = mpsc::unbounded_channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
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
            warn!(dir = %dir.display(), "cannot watch the {what}'s directory ({e}); reload on SIGHUP only");
        }
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
        Ok(Self {
            path: path.to_owned(),
            _watcher: watcher,
            changes,
            hangups,
            last: std::fs::read(path).ok(),
        })
    }

    /// The file's content to apply next (an error: SIGHUP and it cannot be
    /// read); `Ok(None)` once `shutdown` is triggered.
    pub(crate) async fn next(
        &mut self,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Result<Option<Result<Vec<u8>, String>>, String> {
        loop {
            let forced = tokio::select! {
                () = shutdown.wait() => return Ok(None),
                _ = self.hangups.recv() => true,
                Some(()) = self.changes.recv() => false,
            };
            if forced {
                return Ok(Some(
                    std::fs::read(&self.path)
                        .map_err(|e| format!("cannot read {}: {e}", self.path.display())),
                ));
            }
            // Debounce: the content must read the same twice, DEBOUNCE
            // apart, before it is applied. Events meanwhile (this file's or
            // its neighbours') only mean "look again".
            let mut seen = std::fs::read(&self.path).ok();
            loop {
                tokio::select! {
                    () = shutdown.wait() => return Ok(None),
                    () = tokio::time::sleep(DEBOUNCE) => {}
                }
                while self.changes.try_recv().is_ok() {}
                let now = std::fs::read(&self.path).ok();
                if now == seen {
                    break;
                }
                seen = now;
            }
            match seen {
                // Gone (being replaced) or unchanged: nothing to do.
                None => {}
                Some(ref now) if Some(now) == self.last.as_ref() => {}
                Some(now) => {
                    self.last = Some(now.clone());
                    return Ok(Some(Ok(now)));
                }
            }
        }
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
