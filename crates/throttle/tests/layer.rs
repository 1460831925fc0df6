//! The throttler as a tower layer in front of real axum and tonic
//! services: admission, queueing and release, rejections that say when to
//! retry (HTTP 429/503, 307, gRPC RESOURCE_EXHAUSTED with RetryInfo),
//! eviction by criticality, callers that go away while queued, cost
//! learning, and per-client limits in process and on a Charon server.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use charon_core::config::Config;
use charon_core::fields::Path;
use charon_core::throttle::ThrottleConfig;
use charon_throttle::{CostClock, ThrottleLayer, cost, reject};
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

fn config(v: serde_json::Value) -> ThrottleConfig {
    ThrottleConfig::from_value(&v, &Path::root().key("throttle")).expect("valid throttle section")
}

fn app(layer: &ThrottleLayer) -> Router {
    Router::new()
        .route("/fast", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow"
            }),
        )
        .route(
            "/burn",
            get(|| async {
                // At least 2 ms of this thread's CPU, however loaded the
                // machine is.
                let start = cost::thread_cpu();
                while cost::thread_cpu() - start < Duration::from_millis(2) {
                    std::hint::black_box(0u64);
                }
                "burnt"
            }),
        )
        .layer(layer.clone())
}

fn get_req(path: &str, critical: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(c) = critical {
        b = b.header("charon-criticality", c);
    }
    b.body(Body::empty()).expect("request")
}

async fn status(app: &Router, req: Request<Body>) -> (StatusCode, http::HeaderMap) {
    let r = app.clone().oneshot(req).await.expect("infallible");
    (r.status(), r.headers().clone())
}

#[tokio::test(start_paused = true)]
async fn qps_starts_queues_releases_at_the_rate_and_rejects_with_retry_after() {
    let layer = ThrottleLayer::new(config(json!({"discipline": "qps", "rate": 10, "queue": 1})));
    let app = app(&layer);
    assert_eq!(status(&app, get_req("/fast", None)).await.0, StatusCode::OK);
    // The bucket is busy for 100 ms: the next waits, the one after is refused.
    let queued = tokio::spawn({
        let app = app.clone();
        async move { status(&app, get_req("/fast", None)).await.0 }
    });
    tokio::task::yield_now().await;
    assert_eq!(layer.throttler().queue(), (1, 1.0));
    let (code, headers) = status(&app, get_req("/fast", None)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["charon-retry-after-ms"], "100");
    assert_eq!(headers["charon-throttle"], "queue_full");
    let t0 = tokio::time::Instant::now();
    assert_eq!(queued.await.expect("joined"), StatusCode::OK);
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(100),
        "released at the rate"
    );
    assert_eq!(layer.throttler().queue(), (0, 0.0));
}

#[tokio::test(start_paused = true)]
async fn a_critical_request_evicts_a_queued_not_critical_one_which_is_told_when_to_retry() {
    let layer = ThrottleLayer::new(config(
        json!({"discipline": "qps", "rate": 10, "queue": 1, "reject": {"status": 503}}),
    ));
    let app = app(&layer);
    status(&app, get_req("/fast", None)).await;
    let evicted = tokio::spawn({
        let app = app.clone();
        async move { status(&app, get_req("/fast", Some("NOT_CRITICAL"))).await }
    });
    tokio::task::yield_now().await;
    // Another NOT_CRITICAL is simply refused; a CRITICAL one takes the place.
    let (code, _) = status(&app, get_req("/fast", Some("not_critical"))).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    let critical = tokio::spawn({
        let app = app.clone();
        async move { status(&app, get_req("/fast", Some("CRITICAL"))).await.0 }
    });
    let (code, headers) = evicted.await.expect("joined");
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["charon-throttle"], "evicted");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(critical.await.expect("joined"), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_caller_gone_while_queued_leaves_the_queue_at_once() {
    let layer = ThrottleLayer::new(config(json!({"discipline": "qps", "rate": 1, "queue": 5})));
    let app = app(&layer);
    status(&app, get_req("/fast", None)).await;
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { status(&app, get_req("/fast", None)).await })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(layer.throttler().queue().0, 3);
    for w in &waiting {
        w.abort();
    }
    for w in waiting {
        assert!(w.await.expect_err("aborted").is_cancelled());
    }
    assert_eq!(
        layer.throttler().queue(),
        (0, 0.0),
        "their units are given back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_expires_after_max_wait() {
    let layer = ThrottleLayer::new(config(
        json!({"discipline": "qps", "rate": 1, "queue": 5, "max_wait": "300ms"}),
    ));
    let app = app(&layer);
    status(&app, get_req("/fast", None)).await;
    let (code, headers) = status(&app, get_req("/fast", None)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["charon-throttle"], "expired");
    // It would start at once when the bucket is empty, at 1 s.
    assert_eq!(headers["charon-retry-after-ms"], "700");
}

#[tokio::test(start_paused = true)]
async fn a_redirect_sends_rejected_requests_elsewhere() {
    let layer = ThrottleLayer::new(config(json!({"discipline": "qps", "rate": 1, "queue": 0,
        "reject": {"redirect": "https://busy.example/"}})));
    let app = app(&layer);
    status(&app, get_req("/fast", None)).await;
    let (code, headers) = status(&app, get_req("/fast", None)).await;
    assert_eq!(code, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(headers["location"], "https://busy.example/");
    assert_eq!(headers["retry-after"], "1");
}

#[tokio::test(start_paused = true)]
async fn a_grpc_rejection_is_resource_exhausted_with_retry_info() {
    let layer = ThrottleLayer::new(config(json!({"discipline": "qps", "rate": 4, "queue": 0})));
    let app = app(&layer);
    status(&app, get_req("/fast", None)).await;
    let req = Request::post("/fast")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .expect("request");
    let (code, headers) = status(&app, req).await;
    assert_eq!(code, StatusCode::OK, "gRPC errors travel in headers");
    assert_eq!(headers["grpc-status"], "8");
    let details = headers["grpc-status-details-bin"].to_str().expect("ascii");
    assert_eq!(
        reject::retry_delay_of(details),
        Some(Duration::from_millis(250))
    );
}

#[tokio::test]
async fn the_cost_of_a_class_is_learnt_from_the_cpu_time_it_burns() {
    let layer = ThrottleLayer::builder(config(
        json!({"discipline": "cost", "rate": 100000, "queue": 1000, "default_cost": "50ms"}),
    ))
    .cost_clock(CostClock::ThreadCpu)
    .build()
    .expect("layer");
    let app = app(&layer);
    assert_eq!(layer.throttler().estimate("GET /burn").1, 50_000);
    for _ in 0..3 {
        assert_eq!(status(&app, get_req("/burn", None)).await.0, StatusCode::OK);
    }
    let (class, estimate) = layer.throttler().estimate("GET /burn");
    assert_eq!(class, "GET /burn", "the route template is the class");
    assert!(
        (2_000..50_000).contains(&estimate),
        "{estimate} µs: at least the 2 ms of CPU each burnt, and no longer the cold guess"
    );
}

#[tokio::test(start_paused = true)]
async fn per_client_limits_are_decided_in_process_by_key() {
    let (limits, _) = Config::from_yaml(
        "resources:\n  - { name: edge/per-user, kind: bucket, burst: 2, count: 2, period: 1s }\n",
    )
    .expect("limits");
    let layer = ThrottleLayer::builder(config(
        json!({"discipline": "qps", "rate": 100000, "queue": 10,
        "clients": [{"key": "header", "name": "x-user", "resource": "edge/per-user"}]}),
    ))
    .limits(limits)
    .build()
    .expect("layer");
    let app = app(&layer);
    let user = |u: &str| {
        Request::get("/fast")
            .header("x-user", u)
            .body(Body::empty())
            .expect("request")
    };
    assert_eq!(status(&app, user("a")).await.0, StatusCode::OK);
    assert_eq!(status(&app, user("a")).await.0, StatusCode::OK);
    let (code, headers) = status(&app, user("a")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["charon-throttle"], "client_limit");
    // The bucket refills a token every 500 ms (on the system clock, which
    // moved a little since the first request).
    let retry: u64 = headers["charon-retry-after-ms"]
        .to_str()
        .unwrap_or("")
        .parse()
        .unwrap_or(0);
    assert!((1..=500).contains(&retry), "{retry}");
    assert_eq!(
        status(&app, user("b")).await.0,
        StatusCode::OK,
        "another client"
    );
}

#[tokio::test]
async fn a_global_limit_is_asked_of_charon_and_degrades_when_it_is_gone() {
    let server = charon_testkit::InProcessServer::start(
        "resources:\n  - { name: api/users, kind: window, algorithm: fixed, limit: 1, window: 1h }\n",
    )
    .await;
    let section = |degraded: &str| {
        config(json!({"discipline": "qps", "rate": 100000, "queue": 10,
            "clients": [{"key": "cookie", "name": "session", "global": "api/users"}],
            "charon": {"server": format!("http://{}", server.grpc), "degraded": degraded}}))
    };
    let layer = ThrottleLayer::new(section("optimistic"));
    let app = app(&layer);
    let session = |s: &str| {
        Request::get("/fast")
            .header("cookie", format!("theme=dark; session={s}"))
            .body(Body::empty())
            .expect("request")
    };
    assert_eq!(status(&app, session("s1")).await.0, StatusCode::OK);
    let (code, headers) = status(&app, session("s1")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["charon-throttle"], "global_limit");
    assert_eq!(status(&app, session("s2")).await.0, StatusCode::OK);

    // The server goes away: optimistic admits, pessimistic refuses with
    // a retry time.
    let pessimistic = app_for(&ThrottleLayer::new(section("pessimistic")));
    drop(server);
    assert_eq!(status(&app, session("s1")).await.0, StatusCode::OK);
    let (code, headers) = status(&pessimistic, session("s3")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["charon-throttle"], "global_unavailable");
    assert_eq!(headers["retry-after"], "1");
}

fn app_for(layer: &ThrottleLayer) -> Router {
    app(layer)
}

#[tokio::test]
async fn a_tonic_service_behind_the_layer_answers_resource_exhausted_with_retry_info() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let layer = ThrottleLayer::new(config(json!({"discipline": "qps", "rate": 1, "queue": 0})));
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer.clone())
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the first is admitted");
    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect_err("the second is throttled");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    let details = status.metadata().get("grpc-status-details-bin");
    assert!(
        details.is_some() || !status.details().is_empty(),
        "RetryInfo travels"
    );
    let delay = reject::retry_delay_of(&base64_of(status.details()));
    assert!(
        delay.is_some_and(|d| d > Duration::ZERO && d <= Duration::from_secs(1)),
        "{delay:?}"
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

/// Resident memory of this process, bytes (Linux).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_100000_queued_requests_is_bounded_and_each_gets_a_clear_answer() {
    let layer = ThrottleLayer::new(config(
        json!({"discipline": "qps", "rate": 1000, "queue": 50000, "max_wait": "1h"}),
    ));
    let app = app(&layer);
    let before = rss();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100_000u32 {
        let app = app.clone();
        tasks.spawn(async move {
            let req = Request::get("/fast")
                .body(Body::from(i.to_string()))
                .expect("request");
            status(&app, req).await.0
        });
    }
    // Until every request waits or was answered (time stands still: this
    // loop never lets the runtime idle).
    let (mut answered, mut rejected) = (0, 0);
    loop {
        while let Some(r) = tasks.try_join_next() {
            let code = r.expect("joined");
            assert!(
                code == StatusCode::TOO_MANY_REQUESTS || code == StatusCode::OK,
                "{code}"
            );
            answered += 1;
            rejected += usize::from(code == StatusCode::TOO_MANY_REQUESTS);
        }
        let waiting = layer.throttler().queue().0;
        assert!(waiting <= 50_000);
        if waiting + answered == 100_000 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        layer.throttler().queue().0,
        50_000,
        "the queue holds what it may, no more"
    );
    assert_eq!(
        rejected, 49_999,
        "the rest are refused at once (one started)"
    );
    let grown = rss().saturating_sub(before);
    eprintln!("resident memory grew by {grown} bytes for 50,000 waiting requests");
    // About 400 MB in a debug build for the flood's 100,000 tasks at once
    // (the test's tasks and axum's futures, about 4 KB each); the
    // throttler keeps one queue entry per waiting request and nothing for
    // a refused one.
    assert!(grown < 1 << 30, "{grown} bytes for 50,000 waiting requests");
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    assert_eq!(
        layer.throttler().queue(),
        (0, 0.0),
        "every caller gone, every place given back"
    );
}

#[tokio::test]
async fn a_global_lease_is_spent_locally_without_a_call_per_request() {
    let server = charon_testkit::InProcessServer::start(
        "resources:\n  - { name: api/all, kind: lease, capacity: 1, algorithm: fair_share, lease_length: 60s, refresh_interval: 30s, learning_mode: 0s }\n",
    )
    .await;
    let layer = ThrottleLayer::new(config(
        json!({"discipline": "qps", "rate": 100000, "queue": 10,
        "charon": {"server": format!("http://{}", server.grpc), "degraded": "pessimistic",
                   "lease": {"resource": "api/all", "wants": 1}}}),
    ));
    let app = app(&layer);
    // One request a second: the first is admitted, the next at once is
    // refused and told to come back in a second.
    assert_eq!(status(&app, get_req("/fast", None)).await.0, StatusCode::OK);
    let (code, headers) = status(&app, get_req("/fast", None)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["charon-throttle"], "global_limit");
    assert_eq!(headers["charon-retry-after-ms"], "1000");
}
