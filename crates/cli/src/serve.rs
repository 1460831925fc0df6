//! `charon serve`: its flags become a [`charon_server::Settings`], and
//! [`charon_server::run`] does the rest (configuration source, store,
//! listeners, signals); what it returns becomes the exit code.
//!
//! Where the limits come from:
//! - `--config FILE`: a file, reloaded on change and on SIGHUP;
//! - `--config-url URL`: a configuration service, polled for deltas every
//!   `--config-refresh` and on SIGHUP, its last view kept while it is down;
//! - neither (the embedded default): a configuration service in this
//!   process on the database `--db` (a local SQLite file by default),
//!   mounted on the HTTP address, which the limiter follows like any other.
//!
//! `--config-api-only` runs just the configuration service (production
//! splits it from the limiting servers).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use charon_server::events::{EventSettings, EventSink};
use charon_server::{
    ClientTlsFiles, ConfigSource, EmbeddedService, Listeners, Settings, StoreSettings, TlsSettings,
};
use clap::Args;

/// Flags of `charon serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Limits from this file (YAML, as `charon config check` reads), reloaded on SIGHUP and when it
    /// changes. It may carry a `server:` section (store, listen,
    /// http_listen) that these flags override.
    #[arg(long, value_name = "FILE", env = "CHARON_CONFIG", conflicts_with_all = ["config_url", "config_api_only"])]
    pub config: Option<PathBuf>,
    /// Limits from the configuration service at this URL.
    #[arg(
        long,
        value_name = "URL",
        env = "CHARON_CONFIG_URL",
        conflicts_with = "config_api_only"
    )]
    pub config_url: Option<String>,
    /// How often to ask the configuration service for changes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    pub config_refresh: Duration,
    /// Keep the last configuration view in this file, so a server that
    /// starts while the configuration service is down still has limits.
    #[arg(long, value_name = "FILE")]
    pub config_cache: Option<PathBuf>,
    /// Bearer token(s) of the configuration service: with --config-url, the
    /// token to read with (if it needs one); for the embedded service, the
    /// write tokens it accepts (`write:S,read:S`; a bare S is a write
    /// token). Without one, the embedded service makes a write token and
    /// keeps it in `<db>.token`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CHARON_CONFIG_TOKEN",
        hide_env_values = true
    )]
    pub config_token: Option<String>,
    /// The embedded configuration service's tokens from a file instead
    /// (the same list as --config-token, one per line or comma-separated,
    /// `#` comment lines), re-read on SIGHUP and when it changes, so
    /// tokens rotate without a restart. A file that lists none is refused.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_CONFIG_TOKENS_FILE",
        conflicts_with_all = ["config_token", "config_url"]
    )]
    pub config_tokens_file: Option<PathBuf>,
    /// Versions of the embedded configuration service's audit trail to
    /// keep (`charon config log`, and what `config rollback` can restore);
    /// older rows are deleted as new commits are made. 0 keeps every one.
    #[arg(long, value_name = "N", env = "CHARON_AUDIT_KEEP", default_value_t = charon_config_service::DEFAULT_AUDIT_VERSIONS)]
    pub audit_keep: u64,
    /// The embedded configuration service's database: a SQLite file path
    /// or a `postgres://` URL.
    #[arg(
        long,
        value_name = "PATH|URL",
        default_value = "charon.db",
        env = "CHARON_DB"
    )]
    pub db: String,
    /// Run only the configuration service (on the HTTP address), no limiter.
    #[arg(long)]
    pub config_api_only: bool,
    /// gRPC address [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDR", env = "CHARON_LISTEN")]
    pub listen: Option<String>,
    /// HTTP address: /metrics, /healthz, /readyz, the simulator page and
    /// the embedded configuration API [default: 127.0.0.1:7071].
    #[arg(long, value_name = "ADDR", env = "CHARON_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Where state lives: `memory` (this process only),
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` (Redis
    /// over TLS), or a Redis Cluster through seed nodes,
    /// `redis+cluster://[user:password@]host:port,host:port`
    /// (`rediss+cluster://…` for TLS) [default: memory].
    #[arg(long, value_name = "URL", env = "CHARON_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Redis over TLS (`rediss://`): trust the CA certificates in this PEM
    /// file instead of the system's roots.
    #[arg(long, value_name = "FILE", env = "CHARON_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,
    /// Redis over TLS: present this PEM client certificate (mutual TLS,
    /// `tls-auth-clients yes`); with --redis-key.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_REDIS_CERT",
        requires = "redis_key"
    )]
    pub redis_cert: Option<PathBuf>,
    /// Redis over TLS: the PEM private key of --redis-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_REDIS_KEY",
        requires = "redis_cert"
    )]
    pub redis_key: Option<PathBuf>,
    /// Redis store: a server that stops renewing its liveness for this long
    /// (and a third more) is counted dead and the others remove its holds.
    /// It renews every third of it; from half of it without a renewal its
    /// copy operations get server errors until it renews again. It resigns
    /// (exit 3) only if the others removed its holds.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub liveness_ttl: Duration,
    /// Redis store: the time limit of each operation (then a server error).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub store_timeout: Duration,
    /// Redis store: the most rate decisions of one hash slot sent to Redis
    /// as one script call when they queue behind a call in flight (see
    /// docs/redis.md, "Batched decisions"); 1 sends every decision alone.
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub redis_max_batch: u16,
    /// Redis store: how long to keep trying to reach Redis at start-up.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub store_connect_timeout: Duration,
    /// A client that stops answering is detected, and its holds released,
    /// within about this long.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    pub keepalive: Duration,
    /// The longest a graceful shutdown (SIGTERM) may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// A parent lease server's gRPC URL (a tree of lease servers): share
    /// what it grants for each lease resource, asking it for this server's
    /// clients' wants in all, instead of the configured capacity.
    #[arg(long, value_name = "URL", env = "CHARON_LEASE_PARENT")]
    pub lease_parent: Option<String>,
    /// The limiting API's tokens (docs/security.md): a YAML list
    /// of `{name, secret | secret_file, namespaces: [ns…] | ["*"]}`. Every
    /// gRPC call then needs `authorization: Bearer SECRET`, allowed the
    /// resource's namespace (health and reflection stay open). Reloaded on
    /// SIGHUP and when it changes; a bad file keeps the previous tokens.
    #[arg(long, value_name = "FILE", env = "CHARON_API_TOKENS")]
    pub api_tokens: Option<PathBuf>,
    /// Export OpenTelemetry traces (a span per decision and per Redis
    /// script call) to this OTLP/gRPC collector, e.g.
    /// `http://127.0.0.1:4317`. Off by default.
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Boxed: the command enum stays small (clippy's
    /// `large_enum_variant`).
    #[command(flatten)]
    pub tls: Box<TlsFlags>,
    /// Write one JSON line per decision (time, resource, domain,
    /// operation, outcome, tier, counts) to this file, rotated, or to
    /// stdout (`-`). Decisions never wait for it: events that cannot be
    /// written at once are dropped and counted
    /// (`charon_events_dropped_total`). Also turns on `GET /v1/top`
    /// (`--events /dev/null` for that alone). See docs/events.md.
    #[arg(long, value_name = "PATH|-", env = "CHARON_EVENTS")]
    pub events: Option<PathBuf>,
    /// The share of decisions written as events, above 0 and at most 1.
    #[arg(long, value_name = "RATIO", default_value_t = 1.0, value_parser = parse_ratio)]
    pub events_sample: f64,
    /// The most events per second (after sampling); more are dropped
    /// (`reason="rate_cap"`). 0: no cap.
    #[arg(long, value_name = "N", default_value_t = charon_server::events::DEFAULT_MAX_PER_SECOND)]
    pub events_max_per_second: u32,
    /// Rotate the events file before it grows past this size (bytes, or
    /// with a K, M or G suffix: KiB, MiB, GiB); 0: never.
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = parse_size)]
    pub events_max_bytes: u64,
    /// Rotated events files kept: PATH.1 (the newest) … PATH.N.
    #[arg(long, value_name = "N", default_value_t = charon_server::events::DEFAULT_KEEP)]
    pub events_keep: u32,
    /// Events waiting for the writer at most; more are dropped
    /// (`reason="queue_full"`).
    #[arg(long, value_name = "N", default_value_t = charon_server::events::QUEUE_EVENTS as u32, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub events_queue: u32,
}

/// TLS flags of `charon serve` (docs/tls.md): the server's own
/// certificate on both listeners, and what it trusts and presents when it
/// calls a configuration service at an `https://` URL.
#[derive(Args, Debug)]
pub struct TlsFlags {
    /// Serve gRPC and HTTP over TLS with this PEM certificate chain
    /// (server certificate first); with --tls-key. Reloaded on SIGHUP and
    /// when the file changes; a file that cannot be used is refused and
    /// the previous certificate stays in force.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_TLS_CERT",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_TLS_KEY",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: require a client certificate signed by a CA in this
    /// PEM file, on both listeners (a client without one is refused at
    /// the handshake).
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_TLS_CLIENT_CA",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,
    /// With an `https://` --config-url: trust the CA certificates in this
    /// PEM file instead of the system's roots.
    #[arg(long, value_name = "FILE", env = "CHARON_CONFIG_CA")]
    pub config_ca: Option<PathBuf>,
    /// With an `https://` --config-url: present this PEM client
    /// certificate (a service that requires one); with --config-key.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_CONFIG_CERT",
        requires = "config_key"
    )]
    pub config_cert: Option<PathBuf>,
    /// The PEM private key of --config-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_CONFIG_KEY",
        requires = "config_cert"
    )]
    pub config_key: Option<PathBuf>,
    /// With an `https://` --lease-parent: trust the CA certificates in
    /// this PEM file instead of the system's roots.
    #[arg(long, value_name = "FILE", env = "CHARON_LEASE_PARENT_CA")]
    pub lease_parent_ca: Option<PathBuf>,
    /// With an `https://` --lease-parent: present this PEM client
    /// certificate (a parent run with --tls-client-ca); with
    /// --lease-parent-key.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_LEASE_PARENT_CERT",
        requires = "lease_parent_key"
    )]
    pub lease_parent_cert: Option<PathBuf>,
    /// The PEM private key of --lease-parent-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "CHARON_LEASE_PARENT_KEY",
        requires = "lease_parent_cert"
    )]
    pub lease_parent_key: Option<PathBuf>,
}

/// A ratio in (0, 1].
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err("a number above 0 and at most 1".to_owned()),
    }
}

/// A size in bytes: `1048576`, `512K`, `100M`, `1G` (binary multiples;
/// `KiB`, `MiB`, `GiB` too).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return Err("a size: bytes, or with K, M or G (binary)".to_owned()),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| "a size: bytes, or with K, M or G (binary)".to_owned())
}

impl ServeArgs {
    /// The settings these flags say.
    fn settings(self) -> Settings {
        let embedded = || EmbeddedService {
            db: self.db.clone(),
            tokens: self.config_token.clone(),
            tokens_file: self.config_tokens_file.clone(),
            audit_keep: self.audit_keep,
            refresh: self.config_refresh,
            cache: self.config_cache.clone(),
        };
        let source = match (&self.config, &self.config_url, self.config_api_only) {
            (Some(path), _, _) => ConfigSource::File(path.clone()),
            (None, Some(url), _) => ConfigSource::Service {
                url: url.clone(),
                token: self.config_token.clone(),
                refresh: self.config_refresh,
                cache: self.config_cache.clone(),
                tls: ClientTlsFiles {
                    ca: self.tls.config_ca.clone(),
                    cert: self.tls.config_cert.clone(),
                    key: self.tls.config_key.clone(),
                },
            },
            (None, None, true) => ConfigSource::ApiOnly(embedded()),
            (None, None, false) => ConfigSource::Embedded(embedded()),
        };
        // Settings this command has no flag for keep their defaults.
        let defaults = Settings::new(source);
        let tls = *self.tls;
        Settings {
            listen: self.listen,
            http_listen: self.http_listen,
            store: StoreSettings {
                url: self.store,
                liveness_ttl: self.liveness_ttl,
                op_timeout: self.store_timeout,
                connect_timeout: self.store_connect_timeout,
                redis_ca: self.redis_ca,
                redis_cert: self.redis_cert,
                redis_key: self.redis_key,
                max_batch: usize::from(self.redis_max_batch),
            },
            keepalive: self.keepalive,
            shutdown_grace: self.shutdown_grace,
            lease_parent: self.lease_parent,
            api_tokens: self.api_tokens,
            tls: tls
                .tls_cert
                .zip(tls.tls_key)
                .map(|(cert, key)| TlsSettings {
                    cert,
                    key,
                    client_ca: tls.tls_client_ca,
                }),
            lease_parent_tls: ClientTlsFiles {
                ca: tls.lease_parent_ca,
                cert: tls.lease_parent_cert,
                key: tls.lease_parent_key,
            },
            events: self.events.map(|path| {
                let sink = if path.as_os_str() == "-" {
                    EventSink::Stdout
                } else {
                    EventSink::File(path)
                };
                EventSettings {
                    sample: self.events_sample,
                    max_per_second: self.events_max_per_second,
                    max_bytes: self.events_max_bytes,
                    keep: self.events_keep,
                    queue: self.events_queue as usize,
                    ..EventSettings::new(sink)
                }
            }),
            ..defaults
        }
    }
}

/// Catches SIGHUP for the life of the process: `main` calls it first
/// thing for `charon serve`, before the command line is parsed, the
/// runtime built or a file read. SIGHUP's default disposition ends a
/// process, so a reload asked while the server starts (a certificate
/// rotation hook, `kill -HUP` of a whole fleet) would kill it; caught, it
/// is ignored until the server's own watches listen for it (the files it
/// would reload are being read anyway). Only the dynamic loader's first
/// milliseconds, before any of the program runs, remain uncovered.
pub fn catch_hangups() -> Result<(), String> {
    signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .map(drop)
    .map_err(|e| format!("cannot catch SIGHUP: {e}"))
}

/// Runs the server until SIGTERM or SIGINT (exit 0), a resignation from
/// the store (exit 3), or an error (exit 1, with the reason).
pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // SIGTERM and SIGINT are caught from here on: one that comes while the
    // server starts stops it cleanly.
    let shutdown = {
        let _in_runtime = runtime.enter();
        charon_server::terminated()
    };
    let telemetry = {
        let _in_runtime = runtime.enter();
        crate::telemetry::init(args.otlp_endpoint.as_deref())?
    };
    // The listeners are bound by `run` once the store is open (nothing
    // listens before it can answer), at the flags' or the file's addresses.
    let exit = runtime.block_on(charon_server::run(
        args.settings(),
        Listeners::AtSettings,
        shutdown,
    ));
    telemetry.shutdown();
    Ok(ExitCode::from(exit?.code()))
}
