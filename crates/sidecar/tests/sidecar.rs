//! `charon sidecar` in process, in front of real upstreams on loopback:
//! HTTP/1.1 and HTTP/2 with streamed bodies, gRPC, WebSocket upgrades,
//! throttling with Retry-After, reloads, /readyz and /metrics, and the
//! faults: an upstream that stalls or resets, a client that goes away
//! while queued, a flood of queued requests, slowloris headers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use charon_sidecar::{Listeners, Settings};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// A sidecar running in this process; stopped when dropped.
struct Sidecar {
    proxy: SocketAddr,
    admin: SocketAddr,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
    config: PathBuf,
}

async fn sidecar(yaml: &str, upstream: &str, tune: impl FnOnce(&mut Settings)) -> Sidecar {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("sidecar.yaml");
    std::fs::write(&config, yaml).expect("write config");
    let mut settings = Settings::new(&config, upstream);
    tune(&mut settings);
    let proxy = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (proxy_addr, admin_addr) = (
        proxy.local_addr().expect("addr"),
        admin.local_addr().expect("addr"),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        charon_sidecar::run(settings, Listeners { proxy, admin }, async {
            let _ = stopped.await;
        })
        .await
        .expect("sidecar runs");
    });
    let s = Sidecar {
        proxy: proxy_addr,
        admin: admin_addr,
        _stop: stop,
        _dir: dir,
        config,
    };
    // Ready once the admin listener answers.
    for _ in 0..200 {
        if TcpStream::connect(s.admin).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s
}

async fn upstream(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn echo_app() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/headers",
            get(|headers: http::HeaderMap| async move {
                format!("{:?}", headers.get("x-forwarded-for"))
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::disable())
}

/// A sidecar of `yaml` in front of the echo upstream.
async fn echo_sidecar(yaml: &str, tune: impl FnOnce(&mut Settings)) -> Sidecar {
    let up = upstream(echo_app()).await;
    sidecar(yaml, &up, tune).await
}

/// Sends a first request, which the throttler admits (its bucket is then
/// busy).
async fn first_admitted(client: &HttpClient, s: &Sidecar) {
    assert_eq!(
        send(client, get_req(s.proxy, "/hello")).await.0,
        StatusCode::OK
    );
}

const QPS: &str = "resources: []\nthrottle: { discipline: qps, rate: 100000, queue: 100 }\n";

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn http1() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn http2() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

async fn send(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let resp = client.request(req).await.expect("the sidecar answers");
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.expect("body").to_bytes(),
    )
}

fn get_req(addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .body(Full::default())
        .expect("request")
}

#[tokio::test]
async fn http1_and_http2_are_proxied_with_bodies_streamed_whole() {
    let s = echo_sidecar(QPS, |_| {}).await;
    let big = Bytes::from(vec![7u8; 3 << 20]);
    for client in [http1(), http2()] {
        let (code, _, body) = send(&client, get_req(s.proxy, "/hello")).await;
        assert_eq!((code, &body[..]), (StatusCode::OK, &b"hello"[..]));
        let req = Request::post(format!("http://{}/echo", s.proxy))
            .body(Full::new(big.clone()))
            .expect("request");
        let (code, _, body) = send(&client, req).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body.len(), big.len());
        assert_eq!(body, big);
        let (_, _, body) = send(&client, get_req(s.proxy, "/headers")).await;
        assert_eq!(
            &body[..],
            &b"Some(\"127.0.0.1\")"[..],
            "X-Forwarded-For is added"
        );
    }
}

#[tokio::test]
async fn grpc_goes_through_and_is_throttled_with_retry_info() {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let s = sidecar(
        "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 0 }\n",
        &format!("http://{addr}"),
        |_| {},
    )
    .await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.proxy))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let ask = || tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    let ok = client.check(ask()).await.expect("proxied to the upstream");
    assert_eq!(ok.into_inner().status, 1, "SERVING");
    let refused = client.check(ask()).await.expect_err("throttled");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    let delay = charon_throttle::reject::retry_delay_of(&base64(refused.details()));
    assert!(delay.is_some_and(|d| d > Duration::ZERO), "{delay:?}");
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn a_websocket_upgrade_is_passed_through_and_joined() {
    // An upstream that accepts any upgrade and then echoes bytes.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            c.read_exact(&mut byte).await.expect("read");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.contains("upgrade: websocket"), "{head}");
        c.write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        loop {
            let n = c.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            c.write_all(&buf[..n]).await.expect("echo");
        }
    });
    let s = sidecar(QPS, &format!("http://{addr}"), |_| {}).await;
    let mut c = TcpStream::connect(s.proxy).await.expect("connect");
    c.write_all(b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.read_exact(&mut byte).await.expect("read the 101");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    c.write_all(b"ping through the sidecar")
        .await
        .expect("write");
    let mut echoed = [0u8; 24];
    c.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(&echoed, b"ping through the sidecar");
}

#[tokio::test]
async fn throttled_requests_get_429_with_retry_after_and_metrics_count_them() {
    let s = echo_sidecar(
        "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 0 }\n",
        |_| {},
    )
    .await;
    let client = http1();
    first_admitted(&client, &s).await;
    let (code, headers, _) = send(&client, get_req(s.proxy, "/hello")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    let (_, _, metrics) = send(&client, get_req(s.admin, "/metrics")).await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("charon_throttle_requests_total{criticality=\"CRITICAL\",outcome=\"rejected\",reason=\"queue_full\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE charon_throttle_wait_seconds histogram"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_upstream_that_stalls_gets_504_and_one_that_resets_gets_502() {
    // Accepts and never answers.
    let stall = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let stall_addr = stall.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = stall.accept().await {
            held.push(c);
        }
    });
    let s = sidecar(QPS, &format!("http://{stall_addr}"), |s| {
        s.upstream_timeout = Duration::from_millis(300);
    })
    .await;
    let (code, _, body) = send(&http1(), get_req(s.proxy, "/x")).await;
    assert_eq!(code, StatusCode::GATEWAY_TIMEOUT, "{body:?}");
    assert!(String::from_utf8_lossy(&body).contains("sent no response within"));

    // Accepts, reads a little and resets the connection.
    let reset = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let reset_addr = reset.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = reset.accept().await {
            let mut buf = [0u8; 16];
            let _ = c.read(&mut buf).await;
            // Closed with unread data: the peer sees a reset.
            drop(c);
        }
    });
    let s = sidecar(QPS, &format!("http://{reset_addr}"), |_| {}).await;
    let (code, _, body) = send(&http1(), get_req(s.proxy, "/x")).await;
    assert_eq!(code, StatusCode::BAD_GATEWAY, "{body:?}");
    // And nothing listening at all.
    let s = sidecar(QPS, "http://127.0.0.1:1", |_| {}).await;
    assert_eq!(
        send(&http1(), get_req(s.proxy, "/x")).await.0,
        StatusCode::BAD_GATEWAY
    );
    let (code, _, body) = send(&http1(), get_req(s.admin, "/readyz")).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("\"reachable\":false"));
}

async fn queued(s: &Sidecar) -> u64 {
    let (_, _, body) = send(&http1(), get_req(s.admin, "/readyz")).await;
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    v["throttle"]["queued"].as_u64().expect("queued")
}

#[tokio::test]
async fn clients_that_go_away_while_queued_leave_the_queue() {
    let s = echo_sidecar(
        "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 50, max_wait: 1h }\n",
        |_| {},
    )
    .await;
    first_admitted(&http1(), &s).await;
    let mut conns = Vec::new();
    for _ in 0..5 {
        let mut c = TcpStream::connect(s.proxy).await.expect("connect");
        c.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        conns.push(c);
    }
    while queued(&s).await < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(conns);
    // The connections' ends are seen by the sidecar; each request leaves.
    while queued(&s).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_flood_of_queued_requests_is_bounded_by_the_queue_and_the_rest_told_to_retry() {
    let s = echo_sidecar(
        "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 1000, max_wait: 1h }\n",
        |_| {},
    )
    .await;
    let client = http2();
    first_admitted(&client, &s).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..3000u32 {
        let client = client.clone();
        let req = Request::post(format!("http://{}/echo", s.proxy))
            .body(Full::new(Bytes::from(i.to_string())))
            .expect("request");
        tasks.spawn(async move { client.request(req).await.map(|r| r.status()) });
    }
    // One starts a second (the first of them at 1 s): every request is
    // answered 429 at once, or waits, or started; never more than 1000 wait.
    let (mut rejected, mut admitted) = (0, 0);
    loop {
        let waiting = queued(&s).await;
        assert!(waiting <= 1000, "{waiting} waiting");
        if rejected + admitted + waiting == 3000 {
            break;
        }
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(50), tasks.join_next()).await
        {
            match r.expect("joined").expect("answered") {
                StatusCode::TOO_MANY_REQUESTS => rejected += 1,
                StatusCode::OK => admitted += 1,
                other => panic!("{other}"),
            }
        }
    }
    assert!(
        rejected >= 1990,
        "the queue holds 1000; the others are refused at once: {rejected}"
    );
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(client);
    while queued(&s).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn slowloris_headers_are_cut_off() {
    let s = echo_sidecar(QPS, |s| s.header_timeout = Duration::from_millis(200)).await;
    let mut c = TcpStream::connect(s.proxy).await.expect("connect");
    c.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .expect("write");
    // Never finishes the headers: the sidecar closes the connection (a
    // 408 first, or straight EOF).
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut rest)).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(read.is_ok(), "still open after 30 s");
    assert!(
        rest.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    // Others are served meanwhile and after.
    first_admitted(&http1(), &s).await;
}

#[tokio::test]
async fn the_throttle_section_is_reloaded_and_a_bad_file_is_refused() {
    let s = echo_sidecar(QPS, |_| {}).await;
    let readyz = || async {
        let (_, _, body) = send(&http1(), get_req(s.admin, "/readyz")).await;
        serde_json::from_slice::<serde_json::Value>(&body).expect("json")
    };
    assert_eq!(readyz().await["throttle"]["rate"], 100000);
    std::fs::write(
        &s.config,
        "resources: []\nthrottle: { discipline: cost, rate: 250, queue: 10 }\n",
    )
    .expect("write");
    while readyz().await["throttle"]["rate"] != 250 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(readyz().await["throttle"]["discipline"], "cost");
    std::fs::write(
        &s.config,
        "resources: []\nthrottle: { discipline: cost, rate: -1, queue: 10 }\n",
    )
    .expect("write");
    while readyz().await["config"]["problem"].is_null() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        readyz().await["throttle"]["rate"],
        250,
        "the one in force stays"
    );
}

#[tokio::test]
async fn a_file_without_a_throttle_section_or_a_bad_upstream_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("c.yaml");
    let bind = || async {
        Listeners {
            proxy: TcpListener::bind("127.0.0.1:0").await.expect("bind"),
            admin: TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        }
    };
    std::fs::write(&config, "resources: []\n").expect("write");
    let e = charon_sidecar::run(
        Settings::new(&config, "http://127.0.0.1:1"),
        bind().await,
        async {},
    )
    .await
    .expect_err("refused");
    assert!(e.contains("no `throttle:` section"), "{e}");
    std::fs::write(&config, QPS).expect("write");
    let e = charon_sidecar::run(
        Settings::new(&config, "https://example.com"),
        bind().await,
        async {},
    )
    .await
    .expect_err("refused");
    assert!(e.contains("https is not supported"), "{e}");
    std::fs::write(&config, "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 1, clients: [{key: ip, resource: nope}] }\n")
        .expect("write");
    let e = charon_sidecar::run(
        Settings::new(&config, "http://127.0.0.1:1"),
        bind().await,
        async {},
    )
    .await
    .expect_err("refused");
    assert!(
        e.contains("throttle.clients[0].resource: no resource \"nope\""),
        "{e}"
    );
}
