//! `--ca`, `--cert`, `--key`: the TLS flags of every command that talks
//! to a server (`charon client …`, `charon bench`, `charon config
//! apply/export`), named after `charon serve`'s `--redis-ca`,
//! `--redis-cert` and `--redis-key`.

use std::path::PathBuf;

use clap::Args;

/// What a client trusts and presents over TLS.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// TLS: trust the CA certificates in this PEM file (the server's
    /// `--tls-cert` was signed by one of them) instead of the system's
    /// roots. Implies TLS, also with an `http://` address.
    #[arg(long, value_name = "FILE", env = "CHARON_CA")]
    pub ca: Option<PathBuf>,
    /// TLS: present this PEM client certificate (a server run with
    /// `--tls-client-ca`); with --key.
    #[arg(long, value_name = "FILE", env = "CHARON_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// TLS: the PEM private key of --cert.
    #[arg(long, value_name = "FILE", env = "CHARON_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// TLS: the name the server's certificate must carry, when it is not
    /// the address's host (a server reached by IP address or through a
    /// tunnel). Implies TLS.
    #[arg(long, value_name = "NAME", env = "CHARON_SERVER_NAME")]
    pub server_name: Option<String>,
}

impl TlsArgs {
    /// Whether any TLS flag was given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.server_name.is_some()
    }

    /// The client library's TLS settings, or `None` when no flag was given
    /// (an `https://` address then trusts the system's roots).
    pub fn client(&self) -> anyhow::Result<Option<charon_client::ClientTls>> {
        if !self.any() {
            return Ok(None);
        }
        let mut tls = charon_client::ClientTls::from_files(
            self.ca.as_deref(),
            self.cert.as_deref(),
            self.key.as_deref(),
        )?;
        tls.server_name.clone_from(&self.server_name);
        Ok(Some(tls))
    }

    /// `url` as the client connects to it: `https://` once a TLS flag is
    /// given, so `--ca` alone is enough with the default address.
    pub fn url(&self, url: &str) -> String {
        match url.strip_prefix("http://") {
            Some(rest) if self.any() => format!("https://{rest}"),
            _ => url.to_owned(),
        }
    }

    /// The configuration client's TLS settings.
    pub fn config(&self) -> anyhow::Result<charon_config_client::ConfigTls> {
        if self.server_name.is_some() {
            anyhow::bail!(
                "--server-name is for the gRPC port; the configuration API's URL must name a host \
                 its certificate carries"
            );
        }
        let read = |p: &PathBuf| -> anyhow::Result<Vec<u8>> {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
        };
        Ok(charon_config_client::ConfigTls {
            ca_pem: self.ca.as_ref().map(read).transpose()?,
            identity_pem: match (&self.cert, &self.key) {
                (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                _ => None,
            },
            rustls: None,
        })
    }
}

/// Which server to ask, and how: its address, TLS and bearer token (the
/// flags of `charon client …` and `charon bench`).
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The server's gRPC address.
    #[arg(
        long,
        value_name = "URL",
        default_value = "http://127.0.0.1:7070",
        env = "CHARON_SERVER"
    )]
    pub server: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The limiting API's bearer token, for a server started with
    /// `--api-tokens` (prefer the environment variable: command lines are
    /// visible to other users).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CHARON_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl ServerArgs {
    /// Options of a strict client (no degraded grants: the CLI shows what
    /// the server says) of this server.
    pub fn options(&self) -> anyhow::Result<charon_client::ClientOptions> {
        let mut options = charon_client::ClientOptions::new(self.url());
        options.fail_open = false;
        options.tls = self.tls.client()?;
        if let Some(t) = &self.token {
            options = options.with_token(t);
        }
        Ok(options)
    }

    /// A strict client of this server.
    pub fn connect(&self) -> anyhow::Result<charon_client::Client> {
        Ok(charon_client::Client::connect(self.options()?)?)
    }

    /// The address as the client connects to it (`https://` once a TLS
    /// flag is given).
    pub fn url(&self) -> String {
        self.tls.url(&self.server)
    }

    /// What adds the bearer token to the calls of a plain gRPC client of
    /// this server (`charon bench`'s unary clients).
    pub fn bearer(&self) -> anyhow::Result<charon_client::Bearer> {
        Ok(charon_client::Bearer::new(
            self.token.clone().map(charon_client::Token).as_ref(),
        )?)
    }
}
