//! What a server is told before it starts ([`Settings`]): where its limits
//! come from ([`ConfigSource`]), where state lives ([`StoreSettings`]) and
//! the TLS files it reads; plain data, resolved by `charon serve` from
//! flags, environment and defaults, or built by hand in tests.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use charon_config_client::ConfigTls;
use charon_core::config::Config;

use crate::ServerOptions;
use crate::tls::TlsSettings;

/// Everything a server needs to know before it starts, resolved from flags,
/// environment and defaults (plain data: `charon serve` builds it from its
/// arguments, tests by hand).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the limits come from.
    pub source: ConfigSource,
    /// The gRPC address; `None`: the file's `server.listen`, else
    /// [`DEFAULT_LISTEN`](super::DEFAULT_LISTEN). Used only with [`Listeners::AtSettings`](super::Listeners::AtSettings).
    pub listen: Option<String>,
    /// The HTTP address; `None`: the file's `server.http_listen`, else
    /// [`DEFAULT_HTTP_LISTEN`](super::DEFAULT_HTTP_LISTEN). Used only with [`Listeners::AtSettings`](super::Listeners::AtSettings).
    pub http_listen: Option<String>,
    /// Where state lives.
    pub store: StoreSettings,
    /// A client that stops answering is detected, and its holds released,
    /// within about this long.
    pub keepalive: Duration,
    /// The longest a graceful shutdown may take.
    pub shutdown_grace: Duration,
    /// The largest gRPC message accepted (see [`ServerOptions`]).
    pub max_message_bytes: usize,
    /// Operations of one session stream in flight at once (see
    /// [`ServerOptions`]).
    pub session_concurrency: usize,
    /// The gRPC URL of a parent lease server (SPEC §12 tree): lease
    /// resources share what it grants instead of their configured
    /// capacity. `None`: this server is a root.
    pub lease_parent: Option<String>,
    /// TLS (and, with a client CA, mutual TLS) on both listeners, the
    /// certificate reloaded on SIGHUP and when its files change; `None`:
    /// plain text.
    pub tls: Option<TlsSettings>,
    /// What this server trusts and presents when it calls its lease
    /// parent over `https://`.
    pub lease_parent_tls: ClientTlsFiles,
    /// The limiting API's tokens file (issue 16, see [`crate::api_auth`]):
    /// every call then needs a token of it, allowed the resource's
    /// namespace. `None`: the limiting API is open.
    pub api_tokens: Option<PathBuf>,
    /// The decision stream (`--events`): `None`, none.
    pub events: Option<crate::events::EventSettings>,
}

impl Settings {
    /// Settings with `source` and every other value at `charon serve`'s
    /// defaults (the in-memory store).
    pub fn new(source: ConfigSource) -> Self {
        let options = ServerOptions::default();
        Self {
            source,
            listen: None,
            http_listen: None,
            store: StoreSettings::default(),
            keepalive: options.keepalive,
            shutdown_grace: options.shutdown_grace,
            max_message_bytes: options.max_message_bytes,
            session_concurrency: options.session_concurrency,
            lease_parent: None,
            tls: None,
            lease_parent_tls: ClientTlsFiles::default(),
            api_tokens: None,
            events: None,
        }
    }

    /// The network behaviour these settings ask for.
    pub(super) fn server_options(&self) -> ServerOptions {
        ServerOptions {
            keepalive: self.keepalive,
            shutdown_grace: self.shutdown_grace,
            max_message_bytes: self.max_message_bytes,
            session_concurrency: self.session_concurrency,
            tls: None,
        }
    }
}

/// Where the limits come from.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// A configuration file (SPEC §6 YAML, with an optional `server:`
    /// section that the settings override), reloaded on SIGHUP and when it
    /// changes.
    File(PathBuf),
    /// The configuration service at `url`.
    Service {
        /// The service's base URL.
        url: String,
        /// The bearer token to read with, if it needs one.
        token: Option<String>,
        /// How often to ask for changes.
        refresh: Duration,
        /// Where to keep the last view, so a server that starts while the
        /// service is down still has limits.
        cache: Option<PathBuf>,
        /// TLS of an `https://` URL: the CA to trust, the client
        /// certificate to present.
        tls: ClientTlsFiles,
    },
    /// A configuration given by value, never reloaded (tests and embedders
    /// that change it through the limiter).
    Inline(Config),
    /// A configuration service in this process, on the HTTP address.
    Embedded(EmbeddedService),
    /// Only the embedded configuration service (on the HTTP address): no
    /// limiter, no gRPC, no store.
    ApiOnly(EmbeddedService),
}

/// The PEM files of a TLS client: what this server trusts and presents
/// when it calls a configuration service or a lease parent at an
/// `https://` URL. Read at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA certificates to trust instead of the built-in roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (chain) to present (mutual TLS); with `key`.
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    pub key: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// The files' contents, for the configuration client.
    pub(super) fn read(&self) -> anyhow::Result<ConfigTls> {
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
        let identity_pem = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            _ => anyhow::bail!("a client certificate needs its key, and a key its certificate"),
        };
        Ok(ConfigTls {
            ca_pem: self.ca.as_ref().map(read).transpose()?,
            identity_pem,
            rustls: None,
        })
    }
}

/// The embedded configuration service.
#[derive(Debug, Clone)]
pub struct EmbeddedService {
    /// Its database: a SQLite file path or a `postgres://` URL.
    pub db: String,
    /// The tokens it accepts (`write:S,read:S`; a bare S is a write token);
    /// `None`: a write token made up and kept in [`token_file`](super::token_file).
    pub tokens: Option<String>,
    /// A file of the tokens it accepts instead (the same list, one per
    /// line or comma-separated), re-read on SIGHUP and when it changes.
    pub tokens_file: Option<PathBuf>,
    /// Audit rows kept (0: every one).
    pub audit_keep: u64,
    /// How often the limiter asks it for changes.
    pub refresh: Duration,
    /// Where the limiter keeps its last view.
    pub cache: Option<PathBuf>,
}

impl EmbeddedService {
    /// The service on `db` with `charon serve`'s defaults.
    pub fn new(db: impl Into<String>) -> Self {
        Self {
            db: db.into(),
            tokens: None,
            tokens_file: None,
            audit_keep: charon_config_service::DEFAULT_AUDIT_VERSIONS,
            refresh: Duration::from_secs(2),
            cache: None,
        }
    }
}

/// Where state lives, and how the Redis store behaves.
#[derive(Clone)]
pub struct StoreSettings {
    /// `memory`, `redis://[user:password@]host:port[/db]` or
    /// `rediss://…` (TLS); `None`: the file's `server.store`, else
    /// `memory`. It may hold a password: it is shown only through
    /// [`charon_store::redacted`].
    pub url: Option<String>,
    /// Redis: a server that stops renewing its liveness for this long is
    /// counted dead (see `charon serve --help`).
    pub liveness_ttl: Duration,
    /// Redis: the time limit of each operation.
    pub op_timeout: Duration,
    /// Redis: how long to keep trying to reach it at start-up.
    pub connect_timeout: Duration,
    /// Redis over TLS (`rediss://`): a PEM file of the CA certificates to
    /// trust instead of the system's roots.
    pub redis_ca: Option<PathBuf>,
    /// Redis over TLS: a PEM file with this server's client certificate
    /// (chain), for a Redis that requires one (mutual TLS); with
    /// `redis_key`.
    pub redis_cert: Option<PathBuf>,
    /// Redis over TLS: the PEM private key of `redis_cert`.
    pub redis_key: Option<PathBuf>,
    /// Redis: the most decisions of one hash slot sent as one script call
    /// when they queue behind a call in flight (1: every decision alone).
    pub max_batch: usize,
}

// By hand: the derived form would print the URL's password.
impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &self.url.as_deref().map(charon_store::redacted))
            .field("liveness_ttl", &self.liveness_ttl)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("redis_ca", &self.redis_ca)
            .field("redis_cert", &self.redis_cert)
            .field("redis_key", &self.redis_key)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: None,
            liveness_ttl: Duration::from_secs(10),
            op_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(30),
            redis_ca: None,
            redis_cert: None,
            redis_key: None,
            max_batch: charon_store::RedisOptions::default().max_batch,
        }
    }
}
