//! A small HTTP client for the configuration service: what the feed and
//! `charon config apply/export` need.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, IF_MATCH};
use reqwest::{RequestBuilder, Response, Url};

use crate::wire::{Changes, ErrorBody, ImportOutcome};

/// Why a call to the configuration service failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not an `http(s)://` URL.
    #[error("invalid configuration service URL {url:?}: {message}")]
    BadUrl { url: String, message: String },
    /// No answer: refused, timed out, reset.
    #[error("the configuration service at {url} is unreachable: {message}")]
    Unreachable { url: String, message: String },
    /// An error answer from the service.
    #[error("the configuration service answered {status}: {}", body.message)]
    Api { status: u16, body: ErrorBody },
    /// An answer that is not what the API documents.
    #[error("unexpected answer from the configuration service: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
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
    ) -> Result<Self, ClientError> {
        let bad = |message: String| ClientError::BadUrl {
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
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self { http, base, token })
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    fn url(&self, path: &str) -> Result<Url, ClientError> {
        self.base
            .join(path)
            .map_err(|e| ClientError::Protocol(format!("bad path {path:?}: {e}")))
    }

    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(t) => request.header(AUTHORIZATION, format!("Bearer {t}")),
            None => request,
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<Response, ClientError> {
        let response =
            self.authorized(request)
                .send()
                .await
                .map_err(|e| ClientError::Unreachable {
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
        Err(ClientError::Api { status, body })
    }

    async fn json<T: serde::de::DeserializeOwned>(response: Response) -> Result<T, ClientError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ClientError::Protocol(error_chain(&e)))?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `GET /v1/changes?since=…&epoch=…`.
    pub async fn changes(&self, since: u64, epoch: Option<&str>) -> Result<Changes, ClientError> {
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
    pub async fn export_yaml(&self) -> Result<String, ClientError> {
        let mut url = self.url("v1/config")?;
        url.query_pairs_mut().append_pair("format", "yaml");
        let response = self.send(self.http.get(url)).await?;
        response
            .text()
            .await
            .map_err(|e| ClientError::Protocol(error_chain(&e)))
    }

    /// `PUT /v1/config`: replaces the whole configuration with `yaml` (or
    /// only computes the difference on a dry run). `if_match` is the
    /// version the difference was shown for.
    pub async fn import_yaml(
        &self,
        yaml: &str,
        dry_run: bool,
        if_match: Option<u64>,
    ) -> Result<ImportOutcome, ClientError> {
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
