use std::time::Duration;

/// How a [`crate::Client`] sends rate requests, charges and refunds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateTransport {
    /// On the client's one `Session` stream (the default): pipelined, many
    /// in flight at once, each reply matched to its call by id. A unary
    /// call pays for its own HTTP/2 headers and trailers; on the stream a
    /// decision costs one small message each way, which is what lets a
    /// server make several times more decisions per second.
    #[default]
    Session,
    /// One unary gRPC call per attempt (`Limiter.Request`, `Charge`,
    /// `Refund`): for servers or proxies that do not carry long-lived
    /// streams well.
    Unary,
}

/// How a [`crate::Client`] talks to Charon and behaves when it cannot.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The server's gRPC address, e.g. `http://127.0.0.1:7070`.
    pub endpoint: String,
    /// `base` of the back-off: after the i-th rejection, sleep about
    /// `base · 2^i` (paper §3.2; its default is one second).
    pub backoff_base: Duration,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long to wait for one answer before treating the server as
    /// unreachable. Waiting for a place in flight (see
    /// [`ClientOptions::max_in_flight`]) counts against it too, so a
    /// stalled server makes callers fail after this long rather than queue
    /// behind each other without end.
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive: a server that stops answering is noticed within
    /// about this long.
    pub keepalive: Duration,
    /// Degraded mode (paper §4.3): when the server cannot be reached or
    /// answers a server error, grant `min_copies` locally and mark the
    /// result as degraded instead of failing. On by default: Charon must
    /// never become a single point of failure.
    pub fail_open: bool,
    /// Session stream (default) or unary calls for rate requests, charges
    /// and refunds. Copy operations always use the session: their holds
    /// belong to it (SPEC §3).
    pub rate_transport: RateTransport,
    /// Back-pressure: at most this many operations of this client (and its
    /// clones) wait for an answer at once, on the session and in unary
    /// calls together; further callers wait for a place, within their
    /// `request_timeout`. It bounds what a burst of callers can pile up in
    /// memory and on the wire. The server reads at most its own
    /// `session_concurrency` (64 by default) of one stream at a time; the
    /// rest wait in the stream's HTTP/2 window, ready to be read as soon
    /// as one is answered, so a bound above the server's keeps it busy.
    /// Default 256; 0 counts as 1.
    pub max_in_flight: usize,
    /// TLS: what to trust and what to present. `None` with an `https://`
    /// endpoint trusts the system's roots; with an `http://` one, plain
    /// text.
    pub tls: Option<ClientTls>,
    /// The limiting API's bearer token (issue 16), sent as `authorization:
    /// Bearer TOKEN` metadata on every call, for a server started with
    /// `--api-tokens`. `None`: no token (a server without tokens needs
    /// none). Never printed by `Debug`.
    pub token: Option<Token>,
}

/// A bearer token: its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// TLS of a client's connection (a server run with `charon serve
/// --tls-cert`): the CA that signed the server's certificate and, for a
/// server that requires one (`--tls-client-ca`), a client certificate.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// PEM CA certificates to trust; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A PEM client certificate (chain) and its PEM private key.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry, when it is not the
    /// endpoint's host (a server reached through an IP address or a
    /// tunnel): the Python client's `server_name=`, the CLI's
    /// `--server-name`.
    pub server_name: Option<String>,
}

// By hand: no key material in logs.
impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("identity_pem", &self.identity_pem.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl ClientTls {
    /// Reads the PEM files: the CA to trust (`None`: the system's roots)
    /// and a client certificate with its key (both or neither).
    pub fn from_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> std::io::Result<Self> {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let identity_pem = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a client certificate needs its key, and a key its certificate",
                ));
            }
        };
        Ok(Self {
            ca_pem: ca.map(read).transpose()?,
            identity_pem,
            server_name: None,
        })
    }

    /// tonic's form of these settings (ALPN `h2`, ring).
    pub fn to_tonic(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// A tonic endpoint for `url` with `tls` (or the system's roots for an
/// `https://` URL without it), the same way [`crate::Client`] connects:
/// for other gRPC clients of a Charon server (benchmarks, a lease tree).
pub fn endpoint(
    url: &str,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Endpoint, crate::Error> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| settings(format!("the endpoint {url:?} is not a URL: {e}")))?;
    let tls = match tls {
        Some(t) => Some(t.to_tonic()),
        None if url.starts_with("https://") => Some(ClientTls::default().to_tonic()),
        None => None,
    };
    match tls {
        Some(t) => endpoint
            .tls_config(t)
            .map_err(|e| settings(format!("TLS settings for {url:?} cannot be used: {e}"))),
        None => Ok(endpoint),
    }
}

fn settings(message: String) -> crate::Error {
    crate::Error::new(crate::ErrorKind::Settings, message)
}

impl ClientOptions {
    /// These options with the bearer token `token`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(Token(token.into()));
        self
    }

    /// Options for `endpoint` with the defaults.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            backoff_base: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            keepalive: Duration::from_secs(20),
            fail_open: true,
            rate_transport: RateTransport::Session,
            max_in_flight: 256,
            tls: None,
            token: None,
        }
    }
}
