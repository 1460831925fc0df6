//! The limiting server's side of configuration sync (paper §4.1): a view
//! of the configuration kept in memory, refreshed from the configuration
//! service periodically and on demand by applying deltas
//! (`GET /v1/changes?since=V`).
//!
//! The service is never a single point of failure: when it cannot be
//! reached, or sends something this server cannot use, the feed keeps the
//! view it has and reports the error; the next refresh tries again. With a
//! cache file, a server that restarts while the service is down starts from
//! the last view it saw.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use charon_config_client::{ConfigFeed, FeedOptions};
//! let feed = ConfigFeed::new("http://127.0.0.1:7071", FeedOptions::default())?;
//! let handle = feed.spawn(Duration::from_secs(10), |version, config| {
//!     // limiter.replace_config((*config).clone());
//!     let _ = (version, config);
//! });
//! handle.refresh_now(); // e.g. from an admin endpoint
//! println!("running configuration version {}", handle.version());
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::config::{Config, NamespaceSettings, Resource, parse_envoy, parse_resource};
use charon_core::envoy::Envoy;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::{ConfigClient, ConfigClientError, ConfigTls};

/// How a feed talks to the service.
#[derive(Debug, Clone)]
pub struct FeedOptions {
    /// Bearer token, if the service requires one for reads.
    pub token: Option<String>,
    /// Bound on each call to the service. Default 5s.
    pub timeout: Duration,
    /// Where to keep the last view across restarts (JSON; written after
    /// each change, atomically). None: memory only.
    pub cache_file: Option<PathBuf>,
    /// Ask for a full snapshot instead of a delta when the last one is
    /// older than this (anti-entropy: a database restored from a backup
    /// keeps its epoch, and a delta cannot tell that history was rewound).
    /// None: only when the service says so. Default 15 minutes.
    pub resync_every: Option<Duration>,
    /// TLS of an `https://` service: the CA to trust, the client
    /// certificate to present.
    pub tls: ConfigTls,
}

impl Default for FeedOptions {
    fn default() -> Self {
        Self {
            token: None,
            timeout: Duration::from_secs(5),
            cache_file: None,
            resync_every: Some(Duration::from_secs(15 * 60)),
            tls: ConfigTls::default(),
        }
    }
}

/// Why a refresh failed. The view in force is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    /// The service could not be reached or answered with an error.
    #[error(transparent)]
    Service(#[from] ConfigClientError),
    /// The service sent a configuration this server cannot use (a newer
    /// format?). Nothing of it was applied.
    #[error("the configuration service sent a configuration this server cannot use: {0}")]
    Invalid(String),
    /// The feed's task is gone (stopped, or it panicked in `on_change`).
    #[error("the configuration feed has stopped")]
    Stopped,
}

/// What a cache file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    epoch: String,
    version: u64,
    config: Value,
}

/// A limiting server's view of the configuration and the means to refresh it.
#[derive(Debug)]
pub struct ConfigFeed {
    client: ConfigClient,
    cache_file: Option<PathBuf>,
    resync_every: Option<Duration>,
    /// When the last snapshot was applied.
    last_snapshot: Option<Instant>,
    /// Whether the view came from the service (or its cache) at all.
    loaded: bool,
    epoch: Option<String>,
    version: u64,
    resources: BTreeMap<String, Resource>,
    namespaces: BTreeMap<String, NamespaceSettings>,
    /// The `envoy:` section (SPEC §11), if the configuration has one.
    envoy: Option<Envoy>,
    config: Arc<Config>,
}

impl ConfigFeed {
    /// A feed from the service at `base_url`. Starts from the cache file if
    /// one is configured and readable, else from an empty view at version
    /// 0 (not loaded; nothing is fetched until the first refresh).
    pub fn new(base_url: &str, options: FeedOptions) -> Result<Self, FeedError> {
        let client =
            ConfigClient::with_tls(base_url, options.token, options.timeout, &options.tls)?;
        let mut feed = Self {
            client,
            cache_file: options.cache_file,
            resync_every: options.resync_every,
            last_snapshot: None,
            loaded: false,
            epoch: None,
            version: 0,
            resources: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            envoy: None,
            config: Arc::new(Config::default()),
        };
        if let Some(path) = feed.cache_file.clone() {
            match read_cache(&path) {
                Ok(Some((cached, config))) => {
                    tracing::info!(
                        version = cached.version,
                        path = %path.display(),
                        "configuration view loaded from cache"
                    );
                    feed.resources = config
                        .resources()
                        .iter()
                        .map(|r| (r.name.clone(), r.clone()))
                        .collect();
                    feed.namespaces = config.namespaces().clone();
                    feed.envoy = config.envoy().cloned();
                    feed.config = Arc::new(config);
                    feed.version = cached.version;
                    feed.epoch = Some(cached.epoch);
                    feed.loaded = true;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring configuration cache");
                }
            }
        }
        Ok(feed)
    }

    /// The version of the view (0 before the first load).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The view in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.clone()
    }

    /// Whether the view came from the service (or its cache): false means
    /// the server has never seen a configuration.
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Asks the service for what changed since the view's version and
    /// applies it. `Some` when the view changed (or was loaded for the
    /// first time); `None` when it was up to date. On error the view is
    /// unchanged.
    pub async fn refresh(&mut self) -> Result<Option<(u64, Arc<Config>)>, FeedError> {
        let resync = match (self.resync_every, self.last_snapshot) {
            (Some(every), Some(at)) => at.elapsed() >= every,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let since = if self.loaded && !resync {
            self.version
        } else {
            0
        };
        let changes = self.client.changes(since, self.epoch.as_deref()).await?;
        if self.loaded
            && !changes.snapshot
            && changes.version == self.version
            && changes.resources.is_empty()
            && changes.namespaces.is_empty()
            && changes.envoy.is_none()
            && !changes.envoy_removed
        {
            return Ok(None);
        }
        // Build the new view aside; the old one stays if anything is wrong.
        let (mut resources, mut namespaces) = if changes.snapshot {
            (BTreeMap::new(), BTreeMap::new())
        } else {
            (self.resources.clone(), self.namespaces.clone())
        };
        for name in &changes.deleted_resources {
            resources.remove(name);
        }
        let mut problems = Vec::new();
        for doc in &changes.resources {
            match parse_resource(doc) {
                Ok(r) => {
                    resources.insert(r.name.clone(), r);
                }
                Err(e) => problems.push(format!("{}: {e}", doc["name"])),
            }
        }
        if !problems.is_empty() {
            return Err(FeedError::Invalid(problems.join("; ")));
        }
        for name in &changes.deleted_namespaces {
            namespaces.remove(name);
        }
        for (name, settings) in &changes.namespaces {
            namespaces.insert(name.clone(), NamespaceSettings::from(*settings));
        }
        // The section comes whole: on a snapshot it replaces the view's
        // (absent: none), in a delta only when it changed.
        let envoy = match &changes.envoy {
            Some(doc) => Some(parse_envoy(doc).map_err(|e| FeedError::Invalid(e.to_string()))?),
            None if changes.snapshot || changes.envoy_removed => None,
            None => self.envoy.clone(),
        };
        let (config, _) = Config::with_envoy(
            namespaces.clone(),
            resources.values().cloned().collect(),
            envoy.clone(),
        )
        .map_err(|e| FeedError::Invalid(e.to_string()))?;
        let changed = !self.loaded || changes.version != self.version || config != *self.config;
        if changes.snapshot {
            self.last_snapshot = Some(Instant::now());
        }
        self.loaded = true;
        self.epoch = Some(changes.epoch);
        self.version = changes.version;
        self.resources = resources;
        self.namespaces = namespaces;
        self.envoy = envoy;
        if !changed {
            return Ok(None);
        }
        self.config = Arc::new(config);
        self.write_cache();
        Ok(Some((self.version, self.config.clone())))
    }

    fn write_cache(&self) {
        let (Some(path), Some(epoch)) = (&self.cache_file, &self.epoch) else {
            return;
        };
        let cached = Cached {
            epoch: epoch.clone(),
            version: self.version,
            config: self.config.to_value(),
        };
        if let Err(e) = write_cache(path, &cached) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write configuration cache");
        }
    }

    /// Runs the feed in a task: refreshes now, then every `interval` and
    /// whenever [`FeedHandle::refresh_now`] asks, calling `on_change` with
    /// every new view (not with the view it starts from: put
    /// [`ConfigFeed::config`] in force before spawning, e.g. a view loaded
    /// from the cache file). Needs a tokio runtime.
    pub fn spawn(
        self,
        interval: Duration,
        on_change: impl Fn(u64, Arc<Config>) + Send + 'static,
    ) -> FeedHandle {
        let (status_tx, status_rx) = watch::channel(FeedStatus {
            version: self.version,
            config: self.config.clone(),
            loaded: self.loaded,
            last_success: None,
            last_error: None,
            consecutive_failures: 0,
        });
        let (command_tx, command_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(self, interval, on_change, status_tx, command_rx));
        FeedHandle {
            commands: command_tx,
            status: status_rx,
            task,
        }
    }
}

type Waiter = oneshot::Sender<Result<u64, FeedError>>;

async fn run(
    mut feed: ConfigFeed,
    interval: Duration,
    on_change: impl Fn(u64, Arc<Config>) + Send + 'static,
    status: watch::Sender<FeedStatus>,
    mut commands: mpsc::UnboundedReceiver<Option<Waiter>>,
) {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut waiters = Vec::new();
        tokio::select! {
            _ = ticker.tick() => {}
            command = commands.recv() => match command {
                Some(waiter) => waiters.extend(waiter),
                // Every handle is gone.
                None => return,
            },
        }
        // Requests that arrived meanwhile are served by this refresh.
        while let Ok(waiter) = commands.try_recv() {
            waiters.extend(waiter);
        }
        let result = feed.refresh().await;
        match &result {
            Ok(Some((version, config))) => {
                tracing::info!(version, "configuration view updated");
                on_change(*version, config.clone());
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                error = %e,
                version = feed.version(),
                "configuration refresh failed; keeping the current view"
            ),
        }
        status.send_modify(|s| {
            s.version = feed.version();
            s.config = feed.config();
            s.loaded = feed.is_loaded();
            match &result {
                Ok(_) => {
                    s.last_success = Some(Instant::now());
                    s.last_error = None;
                    s.consecutive_failures = 0;
                }
                Err(e) => {
                    s.last_error = Some(e.clone());
                    s.consecutive_failures += 1;
                }
            }
        });
        let answer = result.map(|_| feed.version());
        for waiter in waiters {
            let _ = waiter.send(answer.clone());
        }
        if answer.is_ok() {
            // A refresh on demand counts as the periodic one.
            ticker.reset();
        }
    }
}

/// The state of a running feed, for `/metrics` and `/readyz`.
#[derive(Debug, Clone)]
pub struct FeedStatus {
    /// The version of the view in force.
    pub version: u64,
    /// The view in force.
    pub config: Arc<Config>,
    /// Whether a view was ever loaded (from the service or the cache).
    pub loaded: bool,
    /// When the service last answered.
    pub last_success: Option<Instant>,
    /// The error of the last refresh, if it failed.
    pub last_error: Option<FeedError>,
    /// Refreshes failed in a row.
    pub consecutive_failures: u64,
}

/// A running feed. Dropping it (or [`FeedHandle::stop`]) stops the task.
#[derive(Debug)]
pub struct FeedHandle {
    commands: mpsc::UnboundedSender<Option<Waiter>>,
    status: watch::Receiver<FeedStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl FeedHandle {
    /// Asks for a refresh now, without waiting for it.
    pub fn refresh_now(&self) {
        let _ = self.commands.send(None);
    }

    /// Asks for a refresh now and waits for its outcome: the version in
    /// force after it.
    pub async fn refresh(&self) -> Result<u64, FeedError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Some(tx))
            .map_err(|_| FeedError::Stopped)?;
        rx.await.map_err(|_| FeedError::Stopped)?
    }

    /// The version of the view in force.
    pub fn version(&self) -> u64 {
        self.status.borrow().version
    }

    /// Refreshes until the view in force (the one `on_change` was given)
    /// holds `version` or a later one, for at most `within`; whether it
    /// does. A writer that knows the version its write committed calls
    /// this to answer only once the write is in force. Failed refreshes
    /// are retried after a short pause, doubling up to half a second.
    pub async fn wait_for_version(&self, version: u64, within: Duration) -> bool {
        let attempts = async {
            let mut pause = Duration::from_millis(10);
            loop {
                if self.version() >= version {
                    return true;
                }
                match self.refresh().await {
                    Ok(v) if v >= version => return true,
                    Err(FeedError::Stopped) => return false,
                    // The service answered an older version (another
                    // replica?) or failed: try again shortly.
                    Ok(_) | Err(_) => {}
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        };
        tokio::time::timeout(within, attempts)
            .await
            .unwrap_or(false)
    }

    /// The view in force.
    pub fn config(&self) -> Arc<Config> {
        self.status.borrow().config.clone()
    }

    /// Everything about the feed's health.
    pub fn status(&self) -> FeedStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn subscribe(&self) -> watch::Receiver<FeedStatus> {
        self.status.clone()
    }

    /// Stops the task.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for FeedHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn read_cache(path: &Path) -> Result<Option<(Cached, Config)>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let cached: Cached = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let (config, _) = Config::from_value(&cached.config).map_err(|e| e.to_string())?;
    Ok(Some((cached, config)))
}

/// Replaces the cache file whole: written aside and synced, then renamed
/// over it, so a full disk or a power cut leaves the previous view, never
/// half of a new one. A failed attempt removes what it wrote.
fn write_cache(path: &Path, cached: &Cached) -> std::io::Result<()> {
    use std::io::Write;
    let text = serde_json::to_vec(cached).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(&text)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
