//! The reverse proxy: each request that the throttler admits is sent to
//! the upstream as it came (method, path, headers less the hop-by-hop
//! ones, body streamed both ways), with `X-Forwarded-For` added.
//!
//! - HTTP/1.1 requests go to the upstream over HTTP/1.1 and HTTP/2
//!   requests (gRPC) over HTTP/2 without TLS (prior knowledge), unless
//!   [`UpstreamHttp2`] says otherwise.
//! - A WebSocket (any HTTP/1.1 `Upgrade`) is passed through: the
//!   upstream's `101 Switching Protocols` goes back to the client and the
//!   two connections are then joined byte for byte.
//! - An upstream that cannot be reached or resets the connection gets
//!   `502 Bad Gateway`; one that sends no response headers within the
//!   upstream timeout gets `504 Gateway Timeout` (a body that stalls after
//!   its headers is the upstream's stream, passed on as it comes).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics::counter;
use tracing::{debug, warn};

use charon_throttle::PeerAddr;

/// How requests travel to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamHttp2 {
    /// HTTP/2 requests over HTTP/2, HTTP/1.1 requests over HTTP/1.1.
    #[default]
    Auto,
    /// Every request over HTTP/2 (the upstream speaks only h2c).
    Always,
    /// Every request over HTTP/1.1.
    Never,
}

/// The upstream and the clients that reach it.
#[derive(Debug)]
pub struct Upstream {
    base: Uri,
    http1: Client<HttpConnector, Incoming>,
    http2: Client<HttpConnector, Incoming>,
    mode: UpstreamHttp2,
    timeout: Duration,
}

impl Upstream {
    /// The upstream at `url` (`http://host:port`, optionally with a path
    /// prefix).
    pub fn new(url: &str, mode: UpstreamHttp2, timeout: Duration) -> Result<Self, String> {
        let base: Uri = url
            .parse()
            .map_err(|e| format!("--upstream {url:?} is not a URL: {e}"))?;
        match base.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "--upstream {url:?}: https is not supported; the upstream of a sidecar is on the same host (http://127.0.0.1:PORT)"
                ));
            }
            _ => return Err(format!("--upstream {url:?} must start with http://")),
        }
        if base.authority().is_none() {
            return Err(format!("--upstream {url:?} has no host"));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        let http1 = Client::builder(TokioExecutor::new()).build(connector.clone());
        let http2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        Ok(Self {
            base,
            http1,
            http2,
            mode,
            timeout,
        })
    }

    /// `host:port` of the upstream, for the readiness check.
    pub fn authority(&self) -> String {
        let a = self.base.authority().map_or("", |a| a.as_str());
        if a.contains(':') {
            a.to_owned()
        } else {
            format!("{a}:80")
        }
    }

    /// The upstream URL.
    pub fn url(&self) -> String {
        self.base.to_string()
    }
}

/// The body of a proxied response: the upstream's, or the proxy's own.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// The proxy as a tower service (behind the throttle layer).
#[derive(Debug, Clone)]
pub struct Proxy {
    upstream: Arc<Upstream>,
}

impl Proxy {
    /// A proxy to `upstream`.
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

impl tower::Service<Request<Incoming>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let upstream = self.upstream.clone();
        Box::pin(async move { Ok(forward(&upstream, req).await) })
    }
}

/// The hop-by-hop headers (RFC 9110 §7.6.1), never forwarded as they are.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

async fn forward(up: &Upstream, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let upgrade = is_upgrade(&req);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
    let http2 = match up.mode {
        UpstreamHttp2::Auto => req.version() == Version::HTTP_2,
        UpstreamHttp2::Always => true,
        UpstreamHttp2::Never => false,
    } && !upgrade;
    let (mut parts, body) = req.into_parts();
    // The upstream's address, the request's path and query.
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let prefix = up.base.path().trim_end_matches('/');
    let uri = format!(
        "{}://{}{prefix}{path}",
        up.base.scheme_str().unwrap_or("http"),
        up.base.authority().map_or("", |a| a.as_str())
    );
    parts.uri = match uri.parse() {
        Ok(u) => u,
        Err(e) => {
            return own(
                StatusCode::BAD_REQUEST,
                &format!("cannot forward {path:?}: {e}"),
            );
        }
    };
    strip_hop_by_hop(&mut parts.headers, upgrade);
    if let Some(peer) = peer {
        let ip = peer.ip().to_string();
        let value = match parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
        {
            Some(before) => format!("{before}, {ip}"),
            None => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            parts
                .headers
                .insert(HeaderName::from_static("x-forwarded-for"), v);
        }
    }
    if http2 {
        parts.version = Version::HTTP_2;
        parts.headers.remove(header::HOST);
    } else {
        parts.version = Version::HTTP_11;
    }
    let req = Request::from_parts(parts, body);
    let client = if http2 { &up.http2 } else { &up.http1 };
    let mut resp = match tokio::time::timeout(up.timeout, client.request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            counter!("charon_sidecar_upstream_errors_total", "kind" => "unreachable").increment(1);
            let why = chain(&e);
            warn!(upstream = %up.base, "upstream failed: {why}");
            return own(
                StatusCode::BAD_GATEWAY,
                &format!("the upstream {} failed: {why}", up.base),
            );
        }
        Err(_) => {
            counter!("charon_sidecar_upstream_errors_total", "kind" => "timeout").increment(1);
            return own(
                StatusCode::GATEWAY_TIMEOUT,
                &format!(
                    "the upstream {} sent no response within {:?}",
                    up.base, up.timeout
                ),
            );
        }
    };
    if let Some(client_upgrade) = client_upgrade
        && resp.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((client, upstream)) => {
                    let mut client = TokioIo::new(client);
                    let mut upstream = TokioIo::new(upstream);
                    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                    {
                        debug!("upgraded connection ended: {e}");
                    }
                }
                Err(e) => debug!("upgrade failed: {e}"),
            }
        });
    } else {
        strip_hop_by_hop(resp.headers_mut(), false);
    }
    resp.map(Either::Left)
}

/// An error and its causes, as one line: `client error (Connect): tcp
/// connect error: Connection refused (os error 111)`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes the hop-by-hop headers and those the `Connection` header
/// names; an upgrade keeps `Connection: upgrade` and `Upgrade`.
fn strip_hop_by_hop(headers: &mut http::HeaderMap, upgrade: bool) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty() && t != "upgrade")
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in HOP_BY_HOP {
        if upgrade && name == "connection" {
            continue;
        }
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// A response of the proxy itself.
fn own(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "{message}\n"
    )))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
