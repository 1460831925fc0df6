use std::time::Duration;

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
    /// unreachable.
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive: a server that stops answering is noticed within
    /// about this long.
    pub keepalive: Duration,
    /// Degraded mode (paper §4.3): when the server cannot be reached or
    /// answers a server error, grant `min_copies` locally and mark the
    /// result as degraded instead of failing. On by default: Charon must
    /// never become a single point of failure.
    pub fail_open: bool,
}

impl ClientOptions {
    /// Options for `endpoint` with the defaults.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            backoff_base: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            keepalive: Duration::from_secs(20),
            fail_open: true,
        }
    }
}
