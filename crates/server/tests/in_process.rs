//! Whole servers in this process, started through [`charon_server::run`]
//! on loopback listeners and driven with tonic: every RPC of
//! `charon.v1.Limiter` (unary `Request`; `Session` with reserve, release,
//! transfer, seize and rate requests), every error class, the HTTP side
//! (`/metrics`, `/healthz`, `/readyz`) and graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use charon_proto::codec::CLASS_KEY;
use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_server::{ConfigSource, Error, Exit, Listeners, Settings};
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
    _dir: tempfile::TempDir,
}

impl Running {
    /// A server on `LIMITS` (a file) with `settings` changed by `change`.
    async fn start(change: impl FnOnce(&mut Settings)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("limits.yaml");
        std::fs::write(&path, LIMITS).expect("write the configuration");
        let mut settings = Settings::new(ConfigSource::File(path));
        change(&mut settings);
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (grpc_addr, http_addr) = (
            grpc.local_addr().expect("addr"),
            http.local_addr().expect("addr"),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(charon_server::run(
            settings,
            Listeners::Bound { grpc, http },
            async move {
                let _ = stopped.await;
            },
        ));
        let server = Self {
            grpc: grpc_addr,
            http: http_addr,
            stop: Some(stop),
            task,
            _dir: dir,
        };
        // Serving once /healthz answers.
        for _ in 0..200 {
            if server.get("/healthz").await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the server did not start");
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
        tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .expect("run returns within the grace period")
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
    }
}

fn reserve(domain: &str, copies: u64) -> Op {
    Op::Reserve(v1::ReserveRequest {
        resource: "vm".to_owned(),
        domain: domain.to_owned(),
        copies: Some(copies),
        min_copies: Some(1),
    })
}

fn class(status: &tonic::Status) -> &str {
    status
        .metadata()
        .get(CLASS_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
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
    let Reply::Release(r) = a
        .call(Op::Release(v1::ReleaseRequest {
            resource: "vm".to_owned(),
            domain: "d".to_owned(),
            copies: 1,
            groups: vec![],
        }))
        .await
    else {
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
    let e = c
        .request(rate("nope", "d", None))
        .await
        .expect_err("unknown");
    assert_eq!((e.code(), class(&e)), (Code::NotFound, "client"), "{e:?}");
    // Invalid argument.
    let e = c
        .request(rate("api", "d", Some(0)))
        .await
        .expect_err("invalid");
    assert_eq!(
        (e.code(), class(&e)),
        (Code::InvalidArgument, "client"),
        "{e:?}"
    );
    assert!(e.message().contains("copies must be at least 1"), "{e:?}");
    // The wrong kind: a rate request on a copy resource.
    let e = c
        .request(rate("vm", "d", None))
        .await
        .expect_err("wrong kind");
    assert_eq!(
        (e.code(), class(&e)),
        (Code::FailedPrecondition, "client"),
        "{e:?}"
    );
    // On a session: errors are replies, the session goes on.
    let mut s = Session::open(&mut c).await;
    let e = session_error(s.call(Op::Request(rate("nope", "d", None))).await);
    assert_eq!(e.class, v1::error::Class::Client as i32, "{e:?}");
    let e = session_error(
        s.call(Op::Release(v1::ReleaseRequest {
            resource: "vm".to_owned(),
            domain: "d".to_owned(),
            copies: 1,
            groups: vec![],
        }))
        .await,
    );
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
    assert_eq!(
        (e.code(), class(&e)),
        (Code::InvalidArgument, "client"),
        "{e:?}"
    );
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
        };
    })
    .await;
    let mut c = server.client().await;
    let e = c
        .request(rate("api", "d", None))
        .await
        .expect_err("no configuration");
    assert_eq!(
        (e.code(), class(&e)),
        (Code::Unavailable, "server"),
        "{e:?}"
    );
    let mut s = Session::open(&mut c).await;
    let e = session_error(s.call(reserve("d", 1)).await);
    assert_eq!(e.class, v1::error::Class::Server as i32, "{e:?}");
    let (status, body) = server.get("/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{body}");
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
    let e = c
        .request(rate("api", "d", None))
        .await
        .expect_err("Redis stopped");
    assert_eq!(
        (e.code(), class(&e)),
        (Code::Unavailable, "server"),
        "{e:?}"
    );
    let mut s = Session::open(&mut c).await;
    let e = session_error(s.call(reserve("d", 1)).await);
    assert_eq!(e.class, v1::error::Class::Server as i32, "{e:?}");
    let (status, body) = server.get("/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{body}");
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
        metrics
            .lines()
            .any(|l| l.starts_with("charon_") && l.contains("resource=\"api\"")),
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
    // complete (server errors until then).
    let mut granted = None;
    for _ in 0..100 {
        match held.call(reserve("d", 3)).await {
            Reply::Reserve(r) => {
                granted = Some(r.granted);
                break;
            }
            Reply::Error(e) if e.class == v1::error::Class::Server as i32 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("a reserve reply, not {other:?}"),
        }
    }
    assert_eq!(granted, Some(3), "copy reserves opened within 10 s");
    let mut probe_client = other.client().await;
    let mut probe = Session::open(&mut probe_client).await;
    let Reply::Reserve(r) = probe.call(reserve("e", 3)).await else {
        panic!("a reserve reply")
    };
    assert_eq!(r.granted, 1, "3 of 4 held");
    let Reply::Release(_) = probe
        .call(Op::Release(v1::ReleaseRequest {
            resource: "vm".to_owned(),
            domain: "e".to_owned(),
            copies: 1,
            groups: vec![],
        }))
        .await
    else {
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

/// A server with `source` on bound loopback listeners, stopped by the
/// returned sender.
async fn start_with(
    source: ConfigSource,
) -> (
    SocketAddr,
    SocketAddr,
    oneshot::Sender<()>,
    JoinHandle<Result<Exit, Error>>,
) {
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addrs = (
        grpc.local_addr().expect("addr"),
        http.local_addr().expect("addr"),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(charon_server::run(
        Settings::new(source),
        Listeners::Bound { grpc, http },
        async move {
            let _ = stopped.await;
        },
    ));
    (addrs.0, addrs.1, stop, task)
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
    let (grpc, http, stop, task) = start_with(ConfigSource::Embedded(service)).await;
    let body = wait_for_status(&format!("http://{http}/readyz"), 200).await;
    assert!(body.contains("config: service http://127.0.0.1:"), "{body}");
    // An empty configuration: every resource is unknown (a client error).
    let mut c = LimiterClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let e = c
        .request(rate("api", "d", None))
        .await
        .expect_err("unknown");
    assert_eq!((e.code(), class(&e)), (Code::NotFound, "client"), "{e:?}");
    stop.send(()).expect("running");
    let exit = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("stops")
        .expect("the task");
    assert_eq!(exit.expect("a clean stop"), Exit::Stopped);
    assert!(
        !charon_server::token_file(&db).exists(),
        "tokens given: none made up"
    );
}

#[tokio::test]
async fn the_configuration_service_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("charon.db").display().to_string();
    let (grpc, http, stop, task) = start_with(ConfigSource::ApiOnly(
        charon_server::EmbeddedService::new(db.clone()),
    ))
    .await;
    assert_eq!(
        wait_for_status(&format!("http://{http}/healthz"), 200).await,
        "ok\n"
    );
    assert!(
        tokio::net::TcpStream::connect(grpc).await.is_err(),
        "no gRPC: its listener was dropped"
    );
    let token = std::fs::read_to_string(charon_server::token_file(&db)).expect("a token made up");
    assert_eq!(token.trim().len(), 32, "{token:?}");
    stop.send(()).expect("running");
    let exit = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("stops")
        .expect("the task");
    assert_eq!(exit.expect("a clean stop"), Exit::Stopped);
}
