//! The server throttler as a [`tower::Layer`]: it sits in front of one service,
//! embedded in its binary (axum, tonic, hyper) or in `charon sidecar`, and
//! decides for each incoming request whether it starts now, waits its
//! turn, or is rejected with the time to come back, so that the service
//! protects itself even from callers that never ask Charon.
//!
//! ```no_run
//! # async fn demo() {
//! use charon_core::throttle::{Discipline, ThrottleConfig};
//! use charon_throttle::ThrottleLayer;
//!
//! // 1500 CPU-ms of work per second, 3000 CPU-ms waiting at most.
//! let layer = ThrottleLayer::new(ThrottleConfig::new(Discipline::Cost, 1500, 3000));
//! let app: axum::Router = axum::Router::new()
//!     .route("/render", axum::routing::post(|| async { "done" }))
//!     .layer(layer);
//! # let _ = app;
//! # }
//! ```
//!
//! - The decision rules (the FIFO queue before a leaky bucket over units,
//!   eviction by criticality, retry times, the cost predictor) are
//!   `charon-core`'s [`charon_core::throttle`], the machine `charon
//!   simulate` replays.
//! - Criticality comes from the `charon-criticality` header (gRPC
//!   metadata alike): `CRITICAL` or `NOT_CRITICAL`, else
//!   [`Builder::criticality_by`]'s function, else the configured
//!   default.
//! - A request's class is its method and route template (axum's
//!   `MatchedPath`; a gRPC path is its own template; elsewhere the path),
//!   or [`Builder::class_by`]'s function.
//! - Its cost is measured around the inner service ([`cost`]) and teaches
//!   its class's estimate: every request of a class until the class has 16
//!   measurements, then one request in four (reading a thread's CPU clock
//!   is a system call).
//! - Rejections ([`reject`]) say when to retry: HTTP 429/503 with
//!   `Retry-After`, a 307 redirect, or gRPC `RESOURCE_EXHAUSTED` with
//!   `google.rpc.RetryInfo`.
//! - Per-client limits ([`clients`]) are checked before the queue.

#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod clients;
pub mod cost;
pub mod metrics;
pub mod reject;
mod throttler;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use charon_core::config::Config;
use charon_core::throttle::{Criticality, Reject, ThrottleConfig};
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{Either, Full};

pub use clients::{ClientLimits, PeerAddr};
pub use cost::CostClock;
pub use reject::{Reason, Rejection};
pub use throttler::{MEASURE_ALL_UNTIL, MEASURE_EVERY, Throttler, Ticket};

/// The header (gRPC metadata) that carries a request's criticality.
pub const CRITICALITY_HEADER: &str = "charon-criticality";

/// A function that says how critical a request is (`None`: the default).
pub type CriticalityFn = dyn Fn(&Parts) -> Option<Criticality> + Send + Sync;
/// A function that names a request's class (for cost prediction).
pub type ClassFn = dyn Fn(&Parts) -> String + Send + Sync;

/// What the layer's clones share.
struct Shared {
    throttler: Throttler,
    reject: ArcSwap<Reject>,
    default_criticality: ArcSwap<Criticality>,
    clients: ArcSwap<ClientLimits>,
    criticality_by: Option<Box<CriticalityFn>>,
    class_by: Option<Box<ClassFn>>,
    cost_clock: CostClock,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("throttler", &self.throttler)
            .field("cost_clock", &self.cost_clock)
            .finish_non_exhaustive()
    }
}

/// The throttler as a tower layer; its clones (and the services it makes)
/// share one throttler.
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    shared: Arc<Shared>,
}

/// How a [`ThrottleLayer`] is built beyond its configuration.
pub struct Builder {
    config: ThrottleConfig,
    limits: Option<Config>,
    criticality_by: Option<Box<CriticalityFn>>,
    class_by: Option<Box<ClassFn>>,
    cost_clock: CostClock,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// The resources that per-client limits (`clients[].resource`) name,
    /// decided in this process.
    pub fn limits(mut self, limits: Config) -> Self {
        self.limits = Some(limits);
        self
    }

    /// A function that says how critical a request without the
    /// `charon-criticality` header is.
    pub fn criticality_by(
        mut self,
        f: impl Fn(&Parts) -> Option<Criticality> + Send + Sync + 'static,
    ) -> Self {
        self.criticality_by = Some(Box::new(f));
        self
    }

    /// A function that names a request's class, instead of its method and
    /// route template.
    pub fn class_by(mut self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.class_by = Some(Box::new(f));
        self
    }

    /// How costs are measured (thread CPU time by default).
    pub fn cost_clock(mut self, clock: CostClock) -> Self {
        self.cost_clock = clock;
        self
    }

    /// The layer; an error if a global limit's server URL cannot be used.
    pub fn build(self) -> Result<ThrottleLayer, String> {
        let clients = ClientLimits::new(
            self.config.clients.clone(),
            self.limits,
            self.config.charon.as_ref(),
        )?;
        Ok(ThrottleLayer {
            shared: Arc::new(Shared {
                reject: ArcSwap::from_pointee(self.config.reject.clone()),
                default_criticality: ArcSwap::from_pointee(self.config.default_criticality),
                clients: ArcSwap::from_pointee(clients),
                throttler: Throttler::new(self.config),
                criticality_by: self.criticality_by,
                class_by: self.class_by,
                cost_clock: self.cost_clock,
            }),
        })
    }
}

impl ThrottleLayer {
    /// A layer for `config` (without per-client limits that name local
    /// resources; see [`ThrottleLayer::builder`]).
    ///
    /// # Panics
    /// If `config` names a global limit whose server URL is not a URL
    /// (use [`ThrottleLayer::builder`] to get the error instead).
    pub fn new(config: ThrottleConfig) -> Self {
        match Self::builder(config).build() {
            Ok(l) => l,
            Err(e) => panic!("throttle configuration: {e}"),
        }
    }

    /// A builder, for classifiers, local limits and the cost clock.
    pub fn builder(config: ThrottleConfig) -> Builder {
        Builder {
            config,
            limits: None,
            criticality_by: None,
            class_by: None,
            cost_clock: CostClock::default(),
        }
    }

    /// The throttler (its queue, for readiness and tests).
    pub fn throttler(&self) -> &Throttler {
        &self.shared.throttler
    }

    /// Puts a new configuration in force (a reload): the queue, the bucket
    /// and the estimates are kept; per-client limits start afresh.
    pub fn reconfigure(
        &self,
        config: ThrottleConfig,
        limits: Option<Config>,
    ) -> Result<(), String> {
        let clients = ClientLimits::new(config.clients.clone(), limits, config.charon.as_ref())?;
        self.shared.clients.store(Arc::new(clients));
        self.shared.reject.store(Arc::new(config.reject.clone()));
        self.shared
            .default_criticality
            .store(Arc::new(config.default_criticality));
        self.shared.throttler.reconfigure(config);
        Ok(())
    }
}

impl<S> tower::Layer<S> for ThrottleLayer {
    type Service = ThrottleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ThrottleService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// A service behind the throttler.
#[derive(Debug, Clone)]
pub struct ThrottleService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The response body: the service's own, or a rejection's.
pub type ThrottleBody<B> = Either<B, Full<Bytes>>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<Request<B>> for ThrottleService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<ThrottleBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The instance that was made ready goes with this request; a clone
        // stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let criticality = criticality_of(&shared, &parts);
            let grpc = reject::is_grpc(&parts.headers);
            let clients = shared.clients.load();
            if !clients.is_empty()
                && let Err(r) = clients.check(&parts).await
            {
                shared
                    .throttler
                    .rejected_before_queue(criticality, r.reason);
                return Ok(rejected(&shared, r, grpc));
            }
            drop(clients);
            let class = class_of(&shared, &parts);
            let ticket = match shared.throttler.admit(class, criticality).await {
                Ok(t) => t,
                Err(r) => return Ok(rejected(&shared, r, grpc)),
            };
            let req = Request::from_parts(parts, body);
            if !ticket.measure {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            }
            let (result, cost) = cost::measured(shared.cost_clock, || inner.call(req)).await;
            shared.throttler.finish(&ticket, cost);
            result.map(|r| r.map(Either::Left))
        })
    }
}

fn rejected<RB>(shared: &Shared, r: Rejection, grpc: bool) -> Response<ThrottleBody<RB>> {
    reject::response(r, grpc, &shared.reject.load()).map(Either::Right)
}

fn criticality_of(shared: &Shared, parts: &Parts) -> Criticality {
    parts
        .headers
        .get(CRITICALITY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(Criticality::parse)
        .or_else(|| shared.criticality_by.as_ref().and_then(|f| f(parts)))
        .unwrap_or(**shared.default_criticality.load())
}

/// The class of a request: the classifier's, else its method and route
/// template.
fn class_of(shared: &Shared, parts: &Parts) -> String {
    if let Some(f) = &shared.class_by {
        return f(parts);
    }
    let path = parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| parts.uri.path(), axum::extract::MatchedPath::as_str);
    let mut class = String::with_capacity(parts.method.as_str().len() + 1 + path.len());
    class.push_str(parts.method.as_str());
    class.push(' ');
    class.push_str(path);
    class
}
