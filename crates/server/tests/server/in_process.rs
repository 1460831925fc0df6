//! Whole servers in this process, started through [`charon_server::run`]
//! on loopback listeners and driven with tonic: every RPC of
//! `charon.v1.Limiter` (unary `Request`, `Charge`, `Refund`; `Session` with
//! reserve, release, transfer, seize, rate requests, charges and refunds), every error class, the HTTP side
//! (`/metrics`, `/healthz`, `/readyz`) and graceful shutdown; buckets,
//! windows and queues with `dry_run`, `Charge` and `Refund` (SPEC §7–§10).

use std::net::SocketAddr;
use std::time::Duration;

use charon_proto::codec::CLASS_KEY;
use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_server::{ConfigSource, Error, Exit, GrpcIncoming, Listeners, Settings};
use charon_testkit::InProcessServer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 10s } ]
  - name: vm
    kind: copy
    domain_limit: 3
    global_limit: 4
    groups: [ { name: probation, limit: 2, domains: [newbie] } ]
"#;

/// A server started by `run`, stopped by its shutdown future.
struct Running {
    grpc: SocketAddr,
    http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<Exit, Error>>,
    _dir: Option<tempfile::TempDir>,
}

impl Running {
    /// A server on `LIMITS` (a file) with `settings` changed by `change`,
    /// once it serves.
    async fn start(change: impl FnOnce(&mut Settings)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("limits.yaml");
        std::fs::write(&path, LIMITS).expect("write the configuration");
        let mut settings = Settings::new(ConfigSource::File(path));
        change(&mut settings);
        let server = Self::launch(settings, Some(dir)).await;
        server.until_serving().await
    }

    /// `self` once `/healthz` answers.
    async fn until_serving(self) -> Self {
        let server = self;
        // Serving once /healthz answers.
        for _ in 0..200 {
            if server.get("/healthz").await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the server did not start");
    }

    /// `run` with `settings` on bound loopback listeners, not waited for;
    /// `dir` is kept until the server is dropped.
    async fn launch(settings: Settings, dir: Option<tempfile::TempDir>) -> Self {
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc_addr = grpc.local_addr().expect("addr");
        Self::launch_on(settings, grpc_addr, Listeners::Bound { grpc, http }, dir)
    }

    /// `run` with `settings` on `listeners` (gRPC at `grpc_addr`).
    fn launch_on(
        settings: Settings,
        grpc_addr: SocketAddr,
        listeners: Listeners,
        dir: Option<tempfile::TempDir>,
    ) -> Self {
        let http_addr = match &listeners {
            Listeners::Bound { http, .. } | Listeners::Incoming { http, .. } => {
                http.local_addr().expect("addr")
            }
            Listeners::AtSettings => panic!("tests bind their listeners"),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(charon_server::run(settings, listeners, async move {
            let _ = stopped.await;
        }));
        Self {
            grpc: grpc_addr,
            http: http_addr,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    async fn client(&self) -> LimiterClient<Channel> {
        LimiterClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    async fn get(&self, path: &str) -> reqwest::Result<(u16, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.http)).await?;
        let status = response.status().as_u16();
        Ok((status, response.text().await?))
    }

    /// Resolves the shutdown future; what `run` returned.
    async fn stop(mut self) -> Result<Exit, Error> {
        if let Some(stop) = self.stop.take() {
            stop.send(()).expect("the server is running");
        }
        self.ended(Duration::from_secs(15)).await
    }

    /// What `run` returned by itself (nobody resolved the shutdown
    /// future), within `within`.
    async fn ended(mut self, within: Duration) -> Result<Exit, Error> {
        tokio::time::timeout(within, &mut self.task)
            .await
            .expect("run returns in time")
            .expect("the task")
    }
}

/// A `Session` stream with one operation at a time.
struct Session {
    tx: mpsc::Sender<v1::SessionRequest>,
    replies: tonic::Streaming<v1::SessionReply>,
    next_id: u64,
}

impl Session {
    async fn open(client: &mut LimiterClient<Channel>) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let replies = client
            .session(ReceiverStream::new(rx))
            .await
            .expect("a session")
            .into_inner();
        Self {
            tx,
            replies,
            next_id: 1,
        }
    }

    async fn call(&mut self, op: Op) -> Reply {
        let id = self.next_id;
        self.next_id += 1;
        self.tx
            .send(v1::SessionRequest { id, op: Some(op) })
            .await
            .expect("the session is open");
        let reply = tokio::time::timeout(Duration::from_secs(10), self.replies.next())
            .await
            .expect("a reply in time")
            .expect("the stream goes on")
            .expect("not a status");
        assert_eq!(reply.id, id, "replies in order");
        reply.result.expect("a result")
    }
}

fn rate(resource: &str, domain: &str, copies: Option<u64>) -> v1::RateRequest {
    v1::RateRequest {
        resource: resource.to_owned(),
        domain: domain.to_owned(),
        copies,
        min_copies: None,
        dry_run: false,
    }
}

fn reserve(domain: &str, copies: u64) -> Op {
    Op::Reserve(v1::ReserveRequest {
        resource: "vm".to_owned(),
        domain: domain.to_owned(),
        copies: Some(copies),
        min_copies: Some(1),
        wait_ms: None,
    })
}

fn class(status: &tonic::Status) -> &str {
    status
        .metadata()
        .get(CLASS_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
}

/// The error a unary rate request gets, checked to be of `want` (code,
/// class).
async fn request_error(
    c: &mut LimiterClient<Channel>,
    request: v1::RateRequest,
    want: (Code, &str),
) -> tonic::Status {
    let e = c.request(request).await.expect_err("an error");
    assert_error(&e, want);
    e
}

/// Checks that `e` is of `want` (code, class).
fn assert_error(e: &tonic::Status, want: (Code, &str)) {
    assert_eq!((e.code(), class(e)), want, "{e:?}");
}

fn release(domain: &str, copies: u64) -> Op {
    Op::Release(v1::ReleaseRequest {
        resource: "vm".to_owned(),
        domain: domain.to_owned(),
        copies,
        groups: vec![],
        result_ready: false,
    })
}

/// A server that cannot decide: a unary request and a session's reserve
/// are server errors (so clients may degrade), and it is not ready. The
/// body of `/readyz`.
async fn assert_cannot_decide(server: &Running, c: &mut LimiterClient<Channel>) -> String {
    request_error(c, rate("api", "d", None), (Code::Unavailable, "server")).await;
    let mut s = Session::open(c).await;
    let e = session_error(s.call(reserve("d", 1)).await);
    assert_eq!(e.class, v1::error::Class::Server as i32, "{e:?}");
    let (status, body) = server.get("/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{body}");
    body
}

fn session_error(reply: Reply) -> v1::Error {
    match reply {
        Reply::Error(e) => e,
        other => panic!("an error, not {other:?}"),
    }
}

#[tokio::test]
async fn unary_request_grants_up_to_the_tier_then_limits() {
    let server = Running::start(|_| {}).await;
    let mut c = server.client().await;
    let first = c
        .request(rate("api", "d", Some(3)))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!((first.granted, first.tier_limit), (3, Some(5)));
    let second = c
        .request(rate("api", "d", Some(3)))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(second.granted, 2, "{second:?}");
    let third = c
        .request(rate("api", "d", None))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(third.granted, 0, "{third:?}");
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test]
async fn a_session_reserves_releases_transfers_seizes_and_requests() {
    let server = Running::start(|_| {}).await;
    let mut c = server.client().await;
    let mut a = Session::open(&mut c).await;
    let Reply::Reserve(r) = a.call(reserve("d", 3)).await else {
        panic!("a reserve reply")
    };
    assert_eq!(
        (r.granted, r.domain_holds, r.domain_limit, r.global_limit),
        (3, 3, Some(3), Some(4))
    );
    let Reply::Release(r) = a.call(release("d", 1)).await else {
        panic!("a release reply")
    };
    assert_eq!((r.released, r.domain_holds), (1, 2));
    let Reply::Transfer(t) = a
        .call(Op::Transfer(v1::TransferRequest {
            resource: "vm".to_owned(),
            domain: "d".to_owned(),
            copies: 1,
            groups: vec![],
            ttl_ms: 10_000,
        }))
        .await
    else {
        panic!("a transfer reply")
    };
    assert_eq!(t.copies, 1);
    assert!(!t.transfer_id.is_empty());
    // Another session seizes the staged copy.
    let mut b = Session::open(&mut c).await;
    let Reply::Seize(s) = b
        .call(Op::Seize(v1::SeizeRequest {
            transfer_id: t.transfer_id.clone(),
        }))
        .await
    else {
        panic!("a seize reply")
    };
    assert_eq!(
        (s.resource.as_str(), s.domain.as_str(), s.copies),
        ("vm", "d", 1)
    );
    // A transfer is seized once.
    let again = session_error(
        b.call(Op::Seize(v1::SeizeRequest {
            transfer_id: t.transfer_id,
        }))
        .await,
    );
    assert_eq!(again.class, v1::error::Class::Client as i32, "{again:?}");
    // Rate requests on a session.
    let Reply::Request(r) = b.call(Op::Request(rate("api", "s", Some(2)))).await else {
        panic!("a rate reply")
    };
    assert_eq!(r.granted, 2);
    // Domain d holds 1 (a) + 1 (b) = 2: one more fits, not two.
    let Reply::Reserve(r) = b.call(reserve("d", 2)).await else {
        panic!("a reserve reply")
    };
    assert_eq!((r.granted, r.domain_holds), (1, 3));
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test]
async fn client_errors_are_classified_client() {
    let server = Running::start(|_| {}).await;
    let mut c = server.client().await;
    // Unknown resource.
    request_error(&mut c, rate("nope", "d", None), (Code::NotFound, "client")).await;
    // Invalid argument.
    let e = request_error(
        &mut c,
        rate("api", "d", Some(0)),
        (Code::InvalidArgument, "client"),
    )
    .await;
    assert!(e.message().contains("copies must be at least 1"), "{e:?}");
    // The wrong kind: a rate request on a copy resource.
    request_error(
        &mut c,
        rate("vm", "d", None),
        (Code::FailedPrecondition, "client"),
    )
    .await;
    // On a session: errors are replies, the session goes on.
    let mut s = Session::open(&mut c).await;
    let e = session_error(s.call(Op::Request(rate("nope", "d", None))).await);
    assert_eq!(e.class, v1::error::Class::Client as i32, "{e:?}");
    let e = session_error(s.call(release("d", 1)).await);
    assert_eq!(e.class, v1::error::Class::Client as i32, "not held: {e:?}");
    let Reply::Reserve(r) = s.call(reserve("d", 1)).await else {
        panic!("the session goes on")
    };
    assert_eq!(r.granted, 1);
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

/// Bytes sent as they are: a request no protobuf decoder accepts.
#[derive(Debug, Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

#[tokio::test]
async fn a_malformed_request_is_a_client_error() {
    let server = Running::start(|_| {}).await;
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    // Field 1 (resource), length-delimited, with a length running past the
    // end of the message.
    let e = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 0x7f, b'a']),
            tonic::codegen::http::uri::PathAndQuery::from_static("/charon.v1.Limiter/Request"),
            Raw,
        )
        .await
        .expect_err("malformed");
    assert_error(&e, (Code::InvalidArgument, "client"));
    assert!(e.message().contains("malformed"), "{e:?}");
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test]
async fn no_configuration_loaded_is_a_server_error_and_not_ready() {
    // A configuration service nobody answers at: no configuration ever
    // loaded, so every decision is a server error (the client may degrade).
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let server = Running::start(|s| {
        s.source = ConfigSource::Service {
            url,
            token: None,
            refresh: Duration::from_secs(60),
            cache: None,
            tls: Default::default(),
        };
    })
    .await;
    let mut c = server.client().await;
    let body = assert_cannot_decide(&server, &mut c).await;
    assert!(body.contains("no configuration loaded yet"), "{body}");
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_answer_is_a_server_error() {
    let redis = charon_testkit::RedisServer::start();
    let server = Running::start(|s| {
        s.store.url = Some(redis.url());
        s.store.op_timeout = Duration::from_millis(300);
    })
    .await;
    let mut c = server.client().await;
    let ok = c
        .request(rate("api", "d", None))
        .await
        .expect("Redis answers")
        .into_inner();
    assert_eq!(ok.granted, 1);
    redis.stop();
    assert_cannot_decide(&server, &mut c).await;
    redis.resume();
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = Running::start(|_| {}).await;
    assert_eq!(
        server.get("/healthz").await.expect("healthz"),
        (200, "ok\n".to_owned())
    );
    let (status, body) = server.get("/readyz").await.expect("readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready\nstore: memory\n"), "{body}");
    let mut c = server.client().await;
    c.request(rate("api", "m", None)).await.expect("granted");
    let mut s = Session::open(&mut c).await;
    let Reply::Reserve(r) = s.call(reserve("m", 2)).await else {
        panic!("a reserve reply")
    };
    assert_eq!(r.granted, 2);
    let (status, metrics) = server.get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for name in [
        "charon_sessions_open",
        "charon_copies_held",
        "charon_config_version",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert!(
        has_sample(&metrics, "charon_", &["resource=\"api\""]),
        "the Request RPC observed by resource:\n{metrics}"
    );
    assert_eq!(server.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_ends_sessions_and_releases_their_holds() {
    // Two servers on one Redis: what the stopped one's sessions held must
    // be free on the other at once.
    let redis = charon_testkit::RedisServer::start();
    let on_redis = |s: &mut Settings| {
        s.store.url = Some(redis.url());
        s.store.liveness_ttl = Duration::from_secs(2);
        s.shutdown_grace = Duration::from_secs(5);
    };
    let stopping = Running::start(on_redis).await;
    let other = Running::start(on_redis).await;
    let mut c = stopping.client().await;
    let mut held = Session::open(&mut c).await;
    // A new Redis generation opens copy reserves once its counts are
    // complete (server errors until then), on each server when it has seen
    // the gate open.
    async fn reserve_once_open(s: &mut Session, domain: &str, copies: u64) -> Option<u64> {
        for _ in 0..100 {
            match s.call(reserve(domain, copies)).await {
                Reply::Reserve(r) => return Some(r.granted),
                Reply::Error(e) if e.class == v1::error::Class::Server as i32 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!("a reserve reply, not {other:?}"),
            }
        }
        None
    }
    assert_eq!(
        reserve_once_open(&mut held, "d", 3).await,
        Some(3),
        "copy reserves opened within 10 s"
    );
    let mut probe_client = other.client().await;
    let mut probe = Session::open(&mut probe_client).await;
    assert_eq!(
        reserve_once_open(&mut probe, "e", 3).await,
        Some(1),
        "3 of 4 held"
    );
    let Reply::Release(_) = probe.call(release("e", 1)).await else {
        panic!("a release reply")
    };

    let http = stopping.http;
    assert_eq!(stopping.stop().await.expect("stops"), Exit::Stopped);
    // The session was ended by the server.
    let end = tokio::time::timeout(Duration::from_secs(5), held.replies.next())
        .await
        .expect("the stream ends");
    assert!(
        !matches!(end, Some(Ok(_))),
        "no further reply, the stream ended: {end:?}"
    );
    assert!(
        tokio::net::TcpStream::connect(http).await.is_err(),
        "nothing listens any more"
    );
    // Its 3 copies were released before `run` returned.
    let Reply::Reserve(r) = probe.call(reserve("d", 3)).await else {
        panic!("a reserve reply")
    };
    assert_eq!(r.granted, 3, "the stopped server's holds are free");
    assert_eq!(other.stop().await.expect("stops"), Exit::Stopped);
}

#[tokio::test]
async fn an_address_in_use_is_an_error_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, LIMITS).expect("write the configuration");
    let mut settings = Settings::new(ConfigSource::File(path));
    settings.listen = Some(addr.clone());
    settings.http_listen = Some("127.0.0.1:0".to_owned());
    let e = charon_server::run(settings, Listeners::AtSettings, std::future::pending())
        .await
        .expect_err("the address is taken");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot listen on {addr} (gRPC): ")),
        "{e}"
    );
}

#[tokio::test]
async fn an_invalid_configuration_file_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, "resources: [ { name: x, kind: nope } ]").expect("write");
    let e = charon_server::run(
        Settings::new(ConfigSource::File(path)),
        Listeners::AtSettings,
        std::future::pending(),
    )
    .await
    .expect_err("invalid");
    assert!(e.to_string().starts_with("invalid configuration:\n"), "{e}");
}

#[test]
fn exit_codes() {
    assert_eq!((Exit::Stopped.code(), Exit::Resigned.code()), (0, 3));
}

#[tokio::test]
async fn shutdown_releases_each_sessions_holds_before_serve_returns() {
    // The in-memory store outlives the server here, so what is checked is
    // the sessions' own release, not a store's clean-up on leaving.
    let (config, _) = charon_core::config::Config::from_yaml(LIMITS).expect("valid");
    let store = std::sync::Arc::new(charon_store::MemoryStore::new(std::sync::Arc::new(
        charon_store::SystemClock::new(),
    )));
    let limiter = charon_limiter::Limiter::new(config, store);
    let state =
        charon_server::ServerState::new(limiter.clone(), charon_server::ServerOptions::default());
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let grpc_addr = grpc.local_addr().expect("addr");
    let served = tokio::spawn(charon_server::serve(
        state.clone(),
        grpc,
        http,
        axum::Router::new(),
    ));
    let mut c = LimiterClient::connect(format!("http://{grpc_addr}"))
        .await
        .expect("connect");
    let mut sessions = Vec::new();
    for domain in ["d", "e"] {
        let mut s = Session::open(&mut c).await;
        let Reply::Reserve(r) = s.call(reserve(domain, 2)).await else {
            panic!("a reserve reply")
        };
        assert_eq!(r.granted, 2);
        sessions.push(s);
    }
    assert_eq!(state.shutdown.live_sessions(), 2);
    state.shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(15), served)
        .await
        .expect("stops within the grace period")
        .expect("the task")
        .expect("a clean stop");
    assert_eq!(state.shutdown.live_sessions(), 0);
    for s in &mut sessions {
        let end = s.replies.next().await;
        assert!(!matches!(end, Some(Ok(_))), "the stream ended: {end:?}");
    }
    let amount = charon_core::request::Amount::new(3, 3).expect("amount");
    let mut probe = limiter.session();
    let r = probe.reserve("vm", "x", amount).await.expect("reserve");
    assert_eq!(r.granted, 3, "global limit 4: the 4 held are free again");
}

async fn wait_for_status(url: &str, want: u16) -> String {
    for _ in 0..400 {
        if let Ok(r) = reqwest::get(url).await
            && r.status().as_u16() == want
        {
            return r.text().await.expect("body");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{url} never answered {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_configuration_service_feeds_the_limiter() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("charon.db").display().to_string();
    let mut service = charon_server::EmbeddedService::new(db.clone());
    service.tokens = Some("s3cret".to_owned());
    let server = Running::launch(Settings::new(ConfigSource::Embedded(service)), None).await;
    let body = wait_for_status(&format!("http://{}/readyz", server.http), 200).await;
    assert!(body.contains("config: service http://127.0.0.1:"), "{body}");
    // An empty configuration: every resource is unknown (a client error).
    let mut c = server.client().await;
    request_error(&mut c, rate("api", "d", None), (Code::NotFound, "client")).await;
    assert_eq!(server.stop().await.expect("a clean stop"), Exit::Stopped);
    assert!(
        !charon_server::token_file(&db).exists(),
        "tokens given: none made up"
    );
}

#[tokio::test]
async fn the_configuration_service_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("charon.db").display().to_string();
    let service = charon_server::EmbeddedService::new(db.clone());
    let server = Running::launch(Settings::new(ConfigSource::ApiOnly(service)), None).await;
    assert_eq!(
        wait_for_status(&format!("http://{}/healthz", server.http), 200).await,
        "ok\n"
    );
    assert!(
        tokio::net::TcpStream::connect(server.grpc).await.is_err(),
        "no gRPC: its listener was dropped"
    );
    let token = std::fs::read_to_string(charon_server::token_file(&db)).expect("a token made up");
    assert_eq!(token.trim().len(), 32, "{token:?}");
    assert_eq!(server.stop().await.expect("a clean stop"), Exit::Stopped);
}

/// Settings with `limits` (YAML) given by value.
fn inline(limits: &str) -> Settings {
    let (config, _) = charon_core::config::Config::from_yaml(limits).expect("valid");
    Settings::new(ConfigSource::Inline(config))
}

#[tokio::test]
async fn run_returns_stopped_when_its_shutdown_future_resolves() {
    let server = Running::launch(inline(LIMITS), None)
        .await
        .until_serving()
        .await;
    let (grpc, http) = (server.grpc, server.http);
    let mut c = server.client().await;
    c.request(rate("api", "d", None)).await.expect("granted");
    assert_eq!(server.stop().await.expect("a clean stop"), Exit::Stopped);
    for addr in [grpc, http] {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "nothing listens on {addr} any more"
        );
    }
}

#[tokio::test]
async fn run_fails_naming_the_grpc_side_when_its_listener_stops() {
    // The gRPC side's listener is this test: it accepts one connection and
    // hands it over, then goes away (the stream of connections ends), as a
    // listener whose socket was closed under the server would.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (conns, incoming) = mpsc::channel::<std::io::Result<tokio::net::TcpStream>>(1);
    let acceptor = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.expect("accept");
        conns.send(Ok(conn)).await.expect("the server takes it");
        // A failed accept is no reason to stop: the next connection is
        // served (it is taken only after the failure was).
        conns
            .send(Err(std::io::Error::other("a failed accept")))
            .await
            .expect("the server takes it");
        let (conn, _) = listener.accept().await.expect("accept");
        conns.send(Ok(conn)).await.expect("the server takes it");
        conns
    });
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let listeners = Listeners::Incoming {
        grpc: GrpcIncoming::new(addr, ReceiverStream::new(incoming)),
        http,
    };
    let server = Running::launch_on(inline(LIMITS), addr, listeners, None)
        .until_serving()
        .await;
    let http_addr = server.http;
    for connection in ["the first", "the one after the failed accept"] {
        let mut c = server.client().await;
        let r = c
            .request(rate("api", "d", None))
            .await
            .unwrap_or_else(|e| panic!("served on {connection} connection: {e:?}"))
            .into_inner();
        assert_eq!(r.granted, 1);
    }
    let conns = acceptor.await.expect("the acceptor");
    // A listener that is gone is a reason: `run` fails, naming the side.
    drop(conns);
    let e = server
        .ended(Duration::from_secs(15))
        .await
        .expect_err("a server that lost its gRPC listener fails");
    assert_eq!(
        e.to_string(),
        format!("the gRPC server on {addr} stopped: its listener stopped accepting connections")
    );
    assert!(
        tokio::net::TcpStream::connect(http_addr).await.is_err(),
        "the HTTP side was shut down as well"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_resigned_when_another_server_removes_its_membership() {
    let redis = charon_testkit::RedisServer::start();
    let ttl = Duration::from_secs(1);
    let server = Running::start(|s| {
        s.store.url = Some(redis.url());
        s.store.liveness_ttl = ttl;
    })
    .await;
    let mut raw = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("a raw connection");
    let registry: Vec<String> = redis::cmd("KEYS")
        .arg("*{%m}:servers")
        .query(&mut raw)
        .expect("KEYS");
    let [registry] = registry.as_slice() else {
        panic!("one membership registry: {registry:?}")
    };
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(registry)
        .query(&mut raw)
        .expect("SMEMBERS");
    assert_eq!(
        members.len(),
        1,
        "the server is the one member: {members:?}"
    );
    // What a server that fenced this one does first (fence.lua): the
    // member is no longer registered, its holds no longer count.
    let removed = std::time::Instant::now();
    let n: u64 = redis::cmd("SREM")
        .arg(registry)
        .arg(&members[0])
        .query(&mut raw)
        .expect("SREM");
    assert_eq!(n, 1);
    let exit = server
        .ended(ttl * 5)
        .await
        .expect("a resignation is no error");
    assert_eq!(exit, Exit::Resigned);
    let took = removed.elapsed();
    assert!(
        took < ttl * 2,
        "resigned at its next renewal (every ttl/3), took {took:?}"
    );
}

/// A TCP proxy in front of `upstream` that delivers every byte `delay`
/// after it arrived, in each direction: a slow network or a slow Redis
/// (every command answered `2 * delay` late), with no limit on throughput.
async fn delaying_proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(delay_line(client_read, server_write, delay));
            tokio::spawn(delay_line(server_read, client_write, delay));
        }
    });
    addr
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn delay_line(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (chunks, mut delayed) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((read_at, bytes)) = delayed.recv().await {
            tokio::time::sleep_until(read_at + delay).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if chunks
            .send((tokio::time::Instant::now(), buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(chunks);
    let _ = writer.await;
}

const FLOOD_LIMITS: &str = r#"
resources:
  - name: vm
    kind: copy
    domain_limit: 10
    global_limit: 200
"#;

/// Reserves of up to `copies` in `domain` on `s` until copy reserves are
/// open (a new Redis generation refuses them with server errors until its
/// counts are complete), for at most `within`; the reply.
async fn first_grant(
    s: &mut Session,
    domain: &str,
    copies: u64,
    within: Duration,
) -> v1::ReserveReply {
    let start = std::time::Instant::now();
    loop {
        match s.call(reserve(domain, copies)).await {
            Reply::Reserve(r) => return r,
            Reply::Error(e)
                if e.class == v1::error::Class::Server as i32 && start.elapsed() < within =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("a reserve reply, not {other:?}"),
        }
    }
}

/// `op` on `s`, its time added to `latencies`: the reply as a line
/// (`reserve 5`, `release 5`, or whatever came).
async fn timed(s: &mut Session, op: Op, latencies: &mut Vec<Duration>) -> String {
    let asked = std::time::Instant::now();
    let reply = s.call(op).await;
    latencies.push(asked.elapsed());
    match reply {
        Reply::Reserve(r) => format!("reserve {}", r.granted),
        Reply::Release(r) => format!("release {}", r.released),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_within_the_timeout_during_a_session_flood() {
    const SESSIONS: usize = 40;
    const ROUNDS: usize = 15;
    // Every Redis command answered 300 ms late: under a third of the
    // store's time limit per operation (1 s) and of the renewal's (ttl / 4).
    let one_way = Duration::from_millis(150);
    let redis = charon_testkit::RedisServer::start();
    let upstream: SocketAddr = ([127, 0, 0, 1], redis.port()).into();
    let proxy = delaying_proxy(upstream, one_way).await;
    let mut settings = inline(FLOOD_LIMITS);
    settings.store.url = Some(format!("redis://{proxy}"));
    settings.store.liveness_ttl = Duration::from_secs(4);
    let op_timeout = settings.store.op_timeout;
    let server = Running::launch(settings, None).await.until_serving().await;
    let client = server.client().await;
    let mut warm = Session::open(&mut client.clone()).await;
    let warmed = first_grant(&mut warm, "warm", 1, Duration::from_secs(15)).await;
    assert_eq!(warmed.granted, 1);
    let Reply::Release(_) = warm.call(release("warm", 1)).await else {
        panic!("a release reply")
    };

    // The flood: every session reserves its domain's share, checks it got
    // all of it (200 in all: a copy counted twice or never released would
    // leave someone short), releases it, again; the odd ones end holding
    // theirs (the server releases them when the stream ends).
    let started = std::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..SESSIONS {
        let mut c = client.clone();
        flood.spawn(async move {
            let domain = format!("d{i}");
            let mut s = Session::open(&mut c).await;
            let mut seen = Vec::new();
            let mut latencies = Vec::new();
            for round in 0..ROUNDS {
                seen.push(timed(&mut s, reserve(&domain, 5), &mut latencies).await);
                if round + 1 == ROUNDS && i % 2 == 1 {
                    break;
                }
                seen.push(timed(&mut s, release(&domain, 5), &mut latencies).await);
            }
            (i, seen, latencies)
        });
    }
    let mut unexpected = Vec::new();
    let mut latencies = Vec::new();
    while let Some(done) = flood.join_next().await {
        let (i, seen, took) = done.expect("a session task");
        latencies.extend(took);
        let wanted = |op: &str| op == "reserve 5" || op == "release 5";
        if let Some(bad) = seen.iter().find(|op| !wanted(op)) {
            unexpected.push(format!("session {i}: {bad}"));
        }
    }
    let flood_took = started.elapsed();
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let slowest = latencies.last().copied().unwrap_or_default();

    // What the sessions that ended holding had is free again: nobody
    // holds anything but the probe.
    let mut probe = Session::open(&mut client.clone()).await;
    let mut free = (0, 0);
    let back = std::time::Instant::now();
    while back.elapsed() < Duration::from_secs(10) {
        let r = first_grant(&mut probe, "probe", 10, Duration::from_secs(5)).await;
        free = (r.granted, r.global_holds);
        let Reply::Release(_) = probe.call(release("probe", r.granted)).await else {
            panic!("a release reply")
        };
        if free == (10, 10) {
            break;
        }
    }
    let (status, readyz) = server.get("/readyz").await.expect("readyz");
    println!(
        "FAULT redis_slow_session_flood: injected a proxy delaying every Redis command's round          trip by {:?} (store time limit {op_timeout:?}, liveness ttl 4 s) under {SESSIONS}          sessions each reserving and releasing 5 copies {ROUNDS} times (all 200 of the global          limit held at once at most), half of them ending while holding; expected no server          error, every reserve granted in full and every release exact, the held copies free          after the sessions ended, the server still a member; observed {} operations in          {flood_took:?} (median {median:?}, slowest {slowest:?}), {} unexpected replies {:?},          a new session granted 10 with {} held in all, /readyz {status}",
        one_way * 2,
        latencies.len(),
        unexpected.len(),
        unexpected.iter().take(3).collect::<Vec<_>>(),
        free.1,
    );
    assert!(unexpected.is_empty(), "{unexpected:?}");
    assert!(slowest < op_timeout * 4, "no hang: {slowest:?}");
    assert_eq!(
        free,
        (10, 10),
        "(granted, held in all): the copies of the ended sessions were released"
    );
    assert_eq!(status, 200, "still a ready member: {readyz}");
    assert_eq!(server.stop().await.expect("a clean stop"), Exit::Stopped);
}

const METERS: &str = r#"
resources:
  - name: b
    kind: bucket
    burst: 3
    count: 1
    period: 1h
    soft_limit: 60%
  - name: debt
    kind: bucket
    burst: 2
    count: 1
    period: 1h
  - name: q
    kind: queue
    rate: 1
    period: 1h
    size: 2
  - name: w
    kind: window
    algorithm: fixed
    limit: 1
    window: 24h
    ban: 1h
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 10s } ]
"#;

const HOUR: u64 = 3_600_000;

/// The servers decide on the real clock: a wait told `ms` after the
/// decision that set it is within this much of it.
fn about(got: Option<u64>, want: u64) -> bool {
    got.is_some_and(|g| g <= want && g + 10_000 > want)
}

async fn meter_client(server: &InProcessServer) -> LimiterClient<Channel> {
    LimiterClient::connect(server.endpoint())
        .await
        .expect("connect")
}

/// The server's `/metrics` text.
async fn scrape(server: &InProcessServer) -> String {
    reqwest::get(format!("http://{}/metrics", server.http))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body")
}

/// Whether `metrics` has a sample of `name` with every one of `labels`
/// and a value above zero (counters that alerts watch start at zero).
fn has_sample(metrics: &str, name: &str, labels: &[&str]) -> bool {
    metrics.lines().any(|l| {
        l.starts_with(name)
            && labels.iter().all(|label| l.contains(label))
            && l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
    })
}

fn charge(resource: &str, domain: &str, copies: u64) -> v1::ChargeRequest {
    v1::ChargeRequest {
        resource: resource.to_owned(),
        domain: domain.to_owned(),
        copies,
    }
}

#[tokio::test]
async fn a_bucket_bursts_then_rejects_with_retry_after_and_warns() {
    let server = InProcessServer::start(METERS).await;
    let mut c = meter_client(&server).await;
    let r = c
        .request(rate("b", "d", Some(3)))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!((r.granted, r.limit, r.remaining), (3, Some(3), Some(0)));
    assert!(r.warning, "3 of 3 used is over 60 %: {r:?}");
    assert_eq!(
        (r.tier_limit, r.tier, r.burst),
        (None, 0, false),
        "no tier fields"
    );
    let r = c
        .request(rate("b", "d", None))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!((r.granted, r.banned), (0, false), "{r:?}");
    assert!(about(r.retry_after_ms, HOUR), "{r:?}");
    assert!(about(r.reset_after_ms, 3 * HOUR), "{r:?}");
    assert_eq!(r.delay_ms, None);
    server.stop().await;
}

#[tokio::test]
async fn a_queue_delays_then_rejects_when_full() {
    let server = InProcessServer::start(METERS).await;
    let mut c = meter_client(&server).await;
    let mut replies = Vec::new();
    for _ in 0..3 {
        replies.push(
            c.request(rate("q", "d", None))
                .await
                .expect("answered")
                .into_inner(),
        );
    }
    assert_eq!((replies[0].granted, replies[0].delay_ms), (1, Some(0)));
    assert_eq!(replies[1].granted, 1);
    assert!(about(replies[1].delay_ms, HOUR), "{:?}", replies[1]);
    assert_eq!(replies[2].granted, 0, "the queue is full: {:?}", replies[2]);
    server.stop().await;
}

#[tokio::test]
async fn a_dry_run_records_nothing_and_a_charge_goes_into_debt_a_refund_pays_it() {
    let server = InProcessServer::start(METERS).await;
    let mut c = meter_client(&server).await;
    let dry = v1::RateRequest {
        dry_run: true,
        ..rate("debt", "d", Some(2))
    };
    for _ in 0..3 {
        let r = c.request(dry.clone()).await.expect("answered").into_inner();
        assert_eq!((r.granted, r.remaining), (2, Some(0)), "{r:?}");
    }
    // Charged 5 into a bucket of 2: a debt of 3 tokens, one more to wait for.
    let r = c
        .charge(charge("debt", "d", 5))
        .await
        .expect("charged")
        .into_inner();
    assert_eq!((r.granted, r.remaining), (5, Some(0)), "{r:?}");
    assert!(about(r.retry_after_ms, 4 * HOUR), "{r:?}");
    let r = c
        .request(rate("debt", "d", None))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(r.granted, 0, "in debt: {r:?}");
    let r = c
        .refund(charge("debt", "d", 4))
        .await
        .expect("refunded")
        .into_inner();
    assert_eq!((r.granted, r.remaining), (4, Some(1)), "{r:?}");
    let r = c
        .request(rate("debt", "d", None))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(r.granted, 1, "{r:?}");

    let metrics = scrape(&server).await;
    for operation in ["charge", "refund", "dry_run"] {
        let labels = [
            format!(r#"operation="{operation}""#),
            r#"resource="debt""#.to_owned(),
            r#"outcome="granted""#.to_owned(),
        ];
        let labels = labels.each_ref().map(String::as_str);
        assert!(
            has_sample(&metrics, "charon_decisions_total", &labels),
            "{operation} in {metrics}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_window_bans_and_refuses_refunds_kind_rate_charges_and_dry_runs() {
    let server = InProcessServer::start(METERS).await;
    let mut c = meter_client(&server).await;
    let r = c
        .request(rate("w", "d", None))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!((r.granted, r.limit, r.banned), (1, Some(1), false));
    for _ in 0..2 {
        let r = c
            .request(rate("w", "d", None))
            .await
            .expect("answered")
            .into_inner();
        assert_eq!((r.granted, r.banned), (0, true), "{r:?}");
        // The later of the ban's end and the window's.
        assert!(r.retry_after_ms.is_some_and(|t| t + 10_000 > HOUR), "{r:?}");
    }
    let e = c.refund(charge("w", "d", 1)).await.expect_err("no refunds");
    assert_error(&e, (Code::InvalidArgument, "client"));
    let e = c
        .charge(charge("w", "d", 0))
        .await
        .expect_err("charge of 0");
    assert_error(&e, (Code::InvalidArgument, "client"));

    let r = c
        .charge(charge("api", "d", 1))
        .await
        .expect("charged")
        .into_inner();
    assert_eq!(
        (r.granted, r.tier, r.tier_hits, r.limit),
        (1, 0, 0, Some(0)),
        "tier 0 keeps no hits"
    );
    let dry = v1::RateRequest {
        dry_run: true,
        ..rate("api", "d", None)
    };
    let r = c.request(dry).await.expect("answered").into_inner();
    assert_eq!(
        (r.granted, r.tier, r.tier_hits, r.burst),
        (1, 1, 1, true),
        "{r:?}"
    );
    let e = c.charge(charge("nope", "d", 1)).await.expect_err("unknown");
    assert_error(&e, (Code::NotFound, "client"));
    // Kind rate answers with its own fields and the reply context; the
    // dry run recorded nothing (this is still a burst into tier 1).
    let r = c
        .request(rate("api", "d", None))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!(
        (
            r.granted,
            r.burst,
            r.tier_limit,
            r.limit,
            r.remaining,
            r.retry_after_ms
        ),
        (1, true, Some(5), Some(5), Some(4), Some(0))
    );

    let metrics = scrape(&server).await;
    assert!(
        has_sample(&metrics, "charon_banned_total", &[r#"resource="w""#]),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_session_charges_refunds_and_dry_runs() {
    let server = InProcessServer::start(METERS).await;
    let mut c = meter_client(&server).await;
    let mut s = Session::open(&mut c).await;
    let dry = v1::RateRequest {
        dry_run: true,
        ..rate("debt", "s", Some(2))
    };
    match s.call(Op::Request(dry)).await {
        Reply::Request(r) => assert_eq!((r.granted, r.remaining), (2, Some(0)), "{r:?}"),
        other => panic!("a request reply, not {other:?}"),
    }
    match s.call(Op::Charge(charge("debt", "s", 3))).await {
        Reply::Charge(r) => assert_eq!((r.granted, r.remaining), (3, Some(0)), "{r:?}"),
        other => panic!("a charge reply, not {other:?}"),
    }
    match s.call(Op::Refund(charge("debt", "s", 2))).await {
        Reply::Refund(r) => assert_eq!((r.granted, r.remaining), (2, Some(1)), "{r:?}"),
        other => panic!("a refund reply, not {other:?}"),
    }
    let e = session_error(s.call(Op::Refund(charge("q", "s", 1))).await);
    assert_eq!(e.class, v1::error::Class::Client as i32, "{e:?}");
    // The session goes on.
    match s.call(Op::Request(rate("debt", "s", None))).await {
        Reply::Request(r) => assert_eq!(r.granted, 1, "{r:?}"),
        other => panic!("a request reply, not {other:?}"),
    }
    server.stop().await;
}

const TIERS_BAN: &str = r#"
resources:
  - name: up
    kind: rate
    soft_limit: 50%
    ban: 1h
    tiers: [ { limit: 2, window: 24h } ]
"#;

/// SPEC §10 on `kind: rate` through gRPC, unary and on the session stream:
/// the reply context, a warning, a dry run that would ban and records
/// nothing, a ban, and a charge during it.
#[tokio::test]
async fn burst_tiers_warn_ban_dry_run_and_charge_over_grpc() {
    const DAY: u64 = 24 * HOUR;
    let server = InProcessServer::start(TIERS_BAN).await;
    let mut c = meter_client(&server).await;
    let r = c
        .request(rate("up", "d", None))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!(
        (r.granted, r.tier, r.limit, r.remaining, r.retry_after_ms),
        (1, 1, Some(2), Some(1), Some(0)),
        "{r:?}"
    );
    assert_eq!((r.warning, r.banned), (true, false), "1 of 2 is 50 %");
    let dry = v1::RateRequest {
        dry_run: true,
        min_copies: Some(2),
        ..rate("up", "d", Some(2))
    };
    let r = c.request(dry).await.expect("answered").into_inner();
    assert_eq!((r.granted, r.banned), (0, true), "it would ban: {r:?}");
    // Nothing was recorded: neither the ban nor a hit.
    let r = c
        .request(rate("up", "d", None))
        .await
        .expect("granted")
        .into_inner();
    assert_eq!((r.granted, r.banned, r.tier_hits), (1, false, 2), "{r:?}");
    let r = c
        .request(rate("up", "d", None))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!((r.granted, r.banned), (0, true), "{r:?}");
    // The window outlasts the ban: back when the first hit leaves it.
    assert!(
        r.retry_after_ms
            .is_some_and(|t| t <= DAY + 1 && t + 60_000 > DAY),
        "{r:?}"
    );
    let mut s = Session::open(&mut c).await;
    match s.call(Op::Charge(charge("up", "d", 3))).await {
        Reply::Charge(r) => assert_eq!(
            (r.granted, r.tier_hits, r.banned, r.remaining),
            (3, 5, true, Some(0)),
            "{r:?}"
        ),
        other => panic!("a charge reply, not {other:?}"),
    }
    match s.call(Op::Request(rate("up", "d", None))).await {
        Reply::Request(r) => assert_eq!((r.granted, r.banned), (0, true), "{r:?}"),
        other => panic!("a request reply, not {other:?}"),
    }
    let e = c
        .refund(charge("up", "d", 1))
        .await
        .expect_err("no refunds");
    assert_error(&e, (Code::InvalidArgument, "client"));
    let metrics = scrape(&server).await;
    for name in ["charon_banned_total", "charon_warnings_total"] {
        assert!(
            has_sample(&metrics, name, &[r#"resource="up""#]),
            "{name}: {metrics}"
        );
    }
    server.stop().await;
}
