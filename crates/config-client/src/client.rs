//! A small HTTP client for the configuration service: what the feed and
//! `charon config apply/export` need.

use std::time::Duration;

use charon_config_wire::{AuditEntry, AuditLog, Changes, ErrorBody, ImportOutcome};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, IF_MATCH};
use reqwest::{RequestBuilder, Response, Url};

/// Why a call to the configuration service failed.
///
/// Not `ClientError`: that name is `charon_core::ClientError`, the caller's
/// fault class of SPEC §5, and a server imports both crates; this one is
/// the failure of one call by a [`ConfigClient`], whoever is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigClientError {
    /// The base URL is not an `http(s)://` URL.
    #[error("invalid configuration service URL {url:?}: {message}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why it is not usable.
        message: String,
    },
    /// No answer: refused, timed out, reset.
    #[error("the configuration service at {url} is unreachable: {message}")]
    Unreachable {
        /// The service's base URL.
        url: String,
        /// The transport error and its causes, on one line.
        message: String,
    },
    /// An error answer from the service.
    #[error("the configuration service answered {status}: {}", body.message)]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error body (made up from the status and the text when the
        /// answer was not the API's JSON).
        body: ErrorBody,
    },
    /// An answer that is not what the API documents.
    #[error("unexpected answer from the configuration service: {0}")]
    Protocol(String),
}

impl ConfigClientError {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ConfigClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// TLS of the calls to a configuration service at an `https://` URL:
/// which certificates to trust and which to present. The default trusts
/// the built-in web roots and presents none.
#[derive(Clone, Default)]
pub struct ConfigTls {
    /// PEM CA certificates to trust instead of the built-in roots (a
    /// private CA).
    pub ca_pem: Option<Vec<u8>>,
    /// A PEM client certificate (chain) and its PEM private key, for a
    /// service that requires one (mutual TLS).
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// A whole rustls client configuration instead of the two above: the
    /// embedded service's feed, which trusts exactly its own server's
    /// certificate.
    pub rustls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

// By hand: no key material in logs.
impl std::fmt::Debug for ConfigTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("identity_pem", &self.identity_pem.is_some())
            .field("rustls", &self.rustls.is_some())
            .finish()
    }
}

impl ConfigTls {
    /// The client's TLS settings on `builder`.
    fn apply(&self, mut builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder, String> {
        if let Some(config) = &self.rustls {
            return Ok(builder.use_preconfigured_tls(rustls::ClientConfig::clone(config)));
        }
        if let Some(pem) = &self.ca_pem {
            let cas = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("the CA file is not PEM certificates: {e}"))?;
            if cas.is_empty() {
                return Err("the CA file holds no certificate".to_owned());
            }
            builder = builder.tls_built_in_root_certs(false);
            for ca in cas {
                builder = builder.add_root_certificate(ca);
            }
        }
        if let Some((cert, key)) = &self.identity_pem {
            let mut pem = cert.clone();
            pem.push(b'\n');
            pem.extend_from_slice(key);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("the client certificate or key cannot be used: {e}"))?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }
}

/// A client of one configuration service.
#[derive(Debug, Clone)]
pub struct ConfigClient {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl ConfigClient {
    /// A client of the service at `base_url` (`http://host:port`, or with a
    /// path prefix where the API is mounted). `token` is sent as a bearer
    /// token; `timeout` bounds each call.
    pub fn new(
        base_url: &str,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<Self, ConfigClientError> {
        Self::with_tls(base_url, token, timeout, &ConfigTls::default())
    }

    /// [`ConfigClient::new`], with `tls` for an `https://` URL.
    pub fn with_tls(
        base_url: &str,
        token: Option<String>,
        timeout: Duration,
        tls: &ConfigTls,
    ) -> Result<Self, ConfigClientError> {
        let bad = |message: String| ConfigClientError::BadUrl {
            url: base_url.to_owned(),
            message,
        };
        let mut base = Url::parse(base_url).map_err(|e| bad(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(bad("expected http:// or https://".to_owned()));
        }
        // Make `join` append to the prefix instead of replacing its last
        // segment.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        let http = tls
            .apply(builder)
            .map_err(&bad)?
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self { http, base, token })
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    fn url(&self, path: &str) -> Result<Url, ConfigClientError> {
        self.base
            .join(path)
            .map_err(|e| ConfigClientError::Protocol(format!("bad path {path:?}: {e}")))
    }

    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(t) => request.header(AUTHORIZATION, format!("Bearer {t}")),
            None => request,
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<Response, ConfigClientError> {
        let response =
            self.authorized(request)
                .send()
                .await
                .map_err(|e| ConfigClientError::Unreachable {
                    url: self.base.to_string(),
                    message: error_chain(&e),
                })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str::<ErrorBody>(&text).unwrap_or_else(|_| ErrorBody {
            error: "http".to_owned(),
            message: if text.is_empty() {
                format!("HTTP {status}")
            } else {
                text
            },
            problems: Vec::new(),
            current_version: None,
        });
        Err(ConfigClientError::Api { status, body })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        response: Response,
    ) -> Result<T, ConfigClientError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ConfigClientError::Protocol(error_chain(&e)))?;
        serde_json::from_slice(&bytes).map_err(|e| ConfigClientError::Protocol(e.to_string()))
    }

    /// `GET /v1/changes?since=…&epoch=…`.
    pub async fn changes(
        &self,
        since: u64,
        epoch: Option<&str>,
    ) -> Result<Changes, ConfigClientError> {
        let mut url = self.url("v1/changes")?;
        url.query_pairs_mut()
            .append_pair("since", &since.to_string());
        if let Some(e) = epoch {
            url.query_pairs_mut().append_pair("epoch", e);
        }
        let response = self.send(self.http.get(url)).await?;
        Self::json(response).await
    }

    /// `GET /v1/config?format=yaml`: the whole configuration as SPEC §6
    /// YAML.
    pub async fn export_yaml(&self) -> Result<String, ConfigClientError> {
        let mut url = self.url("v1/config")?;
        url.query_pairs_mut().append_pair("format", "yaml");
        let response = self.send(self.http.get(url)).await?;
        response
            .text()
            .await
            .map_err(|e| ConfigClientError::Protocol(error_chain(&e)))
    }

    /// `PUT /v1/config`: replaces the whole configuration with `yaml` (or
    /// only computes the difference on a dry run). `if_match` is the
    /// version the difference was shown for.
    pub async fn import_yaml(
        &self,
        yaml: &str,
        dry_run: bool,
        if_match: Option<u64>,
    ) -> Result<ImportOutcome, ConfigClientError> {
        let mut url = self.url("v1/config")?;
        if dry_run {
            url.query_pairs_mut().append_pair("dry_run", "true");
        }
        let mut request = self
            .http
            .put(url)
            .header(CONTENT_TYPE, "application/yaml")
            .body(yaml.to_owned());
        if let Some(v) = if_match {
            request = request.header(IF_MATCH, format!("\"{v}\""));
        }
        let response = self.send(request).await?;
        Self::json(response).await
    }

    /// `GET /v1/audit?limit=…&before=…`: a page of the audit trail, newest
    /// first.
    pub async fn audit(
        &self,
        limit: u64,
        before: Option<u64>,
    ) -> Result<AuditLog, ConfigClientError> {
        let mut url = self.url("v1/audit")?;
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        if let Some(b) = before {
            url.query_pairs_mut().append_pair("before", &b.to_string());
        }
        let response = self.send(self.http.get(url)).await?;
        Self::json(response).await
    }

    /// `GET /v1/audit/{version}`: one commit with the whole configuration
    /// it left (normalized YAML in `config`).
    pub async fn audit_entry(&self, version: u64) -> Result<AuditEntry, ConfigClientError> {
        let url = self.url(&format!("v1/audit/{version}"))?;
        let response = self.send(self.http.get(url)).await?;
        Self::json(response).await
    }
}

/// An error and its causes on one line ("error sending request: connection
/// refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
