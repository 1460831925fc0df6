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

/// How often watched files are read even without a change event: a change
/// the directory watch does not report (a network file system, a watch
/// that could not be set up, a directory that is itself a swapped
/// symlink) is still seen within this.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Watches `path` and reloads it into `state.limiter` on change or SIGHUP,
/// until shutdown.
pub fn spawn_file_reloader(state: Arc<ServerState>, path: PathBuf) {
    let mut watch = match FileWatch::new(&path, "configuration") {
        Ok(watch) => watch,
        Err(e) => return error!("configuration reload stopped: {e}"),
    };
    tokio::spawn(async move {
        let result = async {
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

/// Files watched for reloads (the configuration file, the API tokens
/// file, the TLS certificate, key and client CA): yields their contents on
/// SIGHUP (as they are, at once) and when they changed and settled (read
/// the same twice, [`DEBOUNCE`] apart, and unlike what was last yielded).
/// Several files are read and yielded together, so that a writer replacing
/// them one after the other (a certificate, then its key) is not caught
/// half-way as long as its pauses are shorter than [`DEBOUNCE`]. Besides
/// the directory watch, the files are read every [`POLL_EVERY`]. Public
/// for `charon sidecar`, whose configuration file reloads the same way.
///
/// Its first read is what later reads are compared with, so it is made
/// where the files were loaded, before the server answers, and then moved
/// into the task that waits on it: made inside a freshly spawned task, it
/// could first read a file written just after start, and that change would
/// never be applied.
pub struct FileWatch {
    paths: Vec<PathBuf>,
    // Kept alive: dropping it stops the events.
    _watcher: notify::RecommendedWatcher,
    changes: mpsc::UnboundedReceiver<()>,
    hangups: tokio::signal::unix::Signal,
    poll: tokio::time::Interval,
    last: Option<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl FileWatch {
    /// Starts watching `path` (`what` names it in warnings).
    pub fn new(path: &Path, what: &str) -> Result<Self, String> {
        Self::of_files(vec![path.to_owned()], what)
    }

    /// Starts watching every file of `paths`, yielded together.
    pub(crate) fn of_files(paths: Vec<PathBuf>, what: &str) -> Result<Self, String> {
        let (tx, changes) = mpsc::unbounded_channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    let _ = tx.send(());
                }
            })
            .map_err(|e| format!("cannot watch files: {e}"))?;
        // Watch the directories, not the files: editors and Kubernetes
        // replace files by renaming, which a watch on the file itself
        // would miss.
        let mut dirs: Vec<&Path> = paths
            .iter()
            .map(|p| {
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        for dir in dirs {
            if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
                warn!(dir = %dir.display(), "cannot watch the {what}'s directory ({e}); changes are seen by reading every second, and on SIGHUP");
            }
        }
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
        let last = read_all(&paths).ok();
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + POLL_EVERY, POLL_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Self {
            paths,
            _watcher: watcher,
            changes,
            hangups,
            poll,
            last,
        })
    }

    /// The file's content to apply next (an error: SIGHUP and it cannot be
    /// read); `Ok(None)` once `shutdown` is triggered.
    pub async fn next(
        &mut self,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Result<Option<Result<Vec<u8>, String>>, String> {
        let next = self.next_all(shutdown).await?;
        Ok(next.map(|contents| contents.map(|mut all| all.swap_remove(0))))
    }

    /// The files' contents to apply next, in the order given (an error:
    /// SIGHUP and one cannot be read); `Ok(None)` once `shutdown` is
    /// triggered.
    pub(crate) async fn next_all(
        &mut self,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Result<Option<Result<Vec<Vec<u8>>, String>>, String> {
        loop {
            let forced = tokio::select! {
                () = shutdown.wait() => return Ok(None),
                _ = self.hangups.recv() => true,
                Some(()) = self.changes.recv() => false,
                _ = self.poll.tick() => {
                    // Unchanged, as nearly always: nothing to settle.
                    if self.read().await.ok() == self.last {
                        continue;
                    }
                    false
                }
            };
            if forced {
                return Ok(Some(self.read_now().await));
            }
            // Debounce: the contents must read the same twice, DEBOUNCE
            // apart, before they are applied. Events meanwhile (these
            // files' or their neighbours') only mean "look again"; a
            // SIGHUP (an operator who wrote the files, then signalled)
            // applies them at once, once.
            let mut seen = self.read().await.ok();
            loop {
                tokio::select! {
                    () = shutdown.wait() => return Ok(None),
                    _ = self.hangups.recv() => return Ok(Some(self.read_now().await)),
                    () = tokio::time::sleep(DEBOUNCE) => {}
                }
                while self.changes.try_recv().is_ok() {}
                let now = self.read().await.ok();
                if now == seen {
                    break;
                }
                seen = now;
            }
            match seen {
                // One is gone (being replaced), or nothing changed.
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

impl FileWatch {
    /// The files as they are (SIGHUP), remembered as the last yielded so
    /// that the change event of the same write does not yield them again.
    async fn read_now(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let now = self.read().await;
        if let Ok(now) = &now {
            self.last = Some(now.clone());
        }
        now
    }
}

impl FileWatch {
    /// The files as they are, read on a blocking thread: a file system
    /// that hangs stalls this watch, never the runtime's workers.
    async fn read(&self) -> Result<Vec<Vec<u8>>, String> {
        let paths = self.paths.clone();
        tokio::task::spawn_blocking(move || read_all(&paths))
            .await
            .unwrap_or_else(|e| Err(format!("reading the files failed: {e}")))
    }
}

/// Every file of `paths`, or which one could not be read and why. Only
/// regular files are read: opening a FIFO or a device put in a file's
/// place could wait for a writer forever.
fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, String> {
    paths
        .iter()
        .map(|p| {
            let cannot = |e: std::io::Error| format!("cannot read {}: {e}", p.display());
            if !std::fs::metadata(p).map_err(cannot)?.is_file() {
                return Err(format!("{} is not a regular file", p.display()));
            }
            std::fs::read(p).map_err(cannot)
        })
        .collect()
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
