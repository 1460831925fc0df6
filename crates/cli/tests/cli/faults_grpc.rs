//! Hostile and chatty gRPC input against real `charon serve` processes,
//! spoken in raw HTTP/2 (the `h2` crate), as a hand-written or non-Rust
//! client would: the Rust client always sends well-formed messages and
//! coalesces them into few DATA frames, which hides both problems.
//!
//! - Issue 9, defect 4: about 5,000 small operations pipelined on one
//!   session, one per DATA frame, made the server close the whole
//!   connection (`GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`), ending
//!   a bystander session on it and releasing its holds.
//! - Issue 9, defect 7: a request that could not be decoded got `INTERNAL`
//!   without `charon-error-class` (a server error: the client library then
//!   granted locally), and on a session stream it ended the stream with OK.
//!
//! `--nocapture` shows one `FAULT` line per case: what was injected, what
//! was expected and what was observed.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use crate::support::bin;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use charon_client::{Client, ClientOptions, Error};
use charon_proto::v1;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_testkit::{CharonProcess, RedisServer};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 1000000, window: 1s } ]
  - name: vm
    kind: copy
    domain_limit: 10
    global_limit: 100
"#;

/// The server's default `max_message_bytes`.
const MAX_MESSAGE: usize = 1 << 20;

/// gRPC status codes.
const OK: i32 = 0;
const INVALID_ARGUMENT: i32 = 3;
const RESOURCE_EXHAUSTED: i32 = 8;
const INTERNAL: i32 = 13;

// ---------------------------------------------------------------------
// A raw HTTP/2 client that counts the frames on the wire.

/// What the test client saw on the wire.
#[derive(Debug, Default)]
struct Wire {
    /// DATA frames sent, per stream.
    sent_data: HashMap<u32, usize>,
    /// DATA frames received, per stream.
    received_data: HashMap<u32, usize>,
    /// GOAWAY frames received: error code and debug data.
    goaways: Vec<(u32, String)>,
}

const DATA: u8 = 0;
const GOAWAY: u8 = 7;

/// Splits a byte stream into HTTP/2 frames (after `skip` bytes of
/// preface).
#[derive(Debug, Default)]
struct Frames {
    buf: Vec<u8>,
    skip: usize,
}

impl Frames {
    fn feed(&mut self, bytes: &[u8], mut frame: impl FnMut(u8, u32, &[u8])) {
        self.buf.extend_from_slice(bytes);
        let mut at = self.skip.min(self.buf.len());
        self.skip -= at;
        while self.buf.len() - at >= 9 {
            let h = &self.buf[at..at + 9];
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            if self.buf.len() - at < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            frame(h[3], stream, &self.buf[at + 9..at + 9 + len]);
            at += 9 + len;
        }
        self.buf.drain(..at);
    }
}

/// A TCP stream that records the frames going through it.
struct Counted {
    io: TcpStream,
    wire: Arc<Mutex<Wire>>,
    out: Frames,
    inbound: Frames,
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let wire = &this.wire;
        this.inbound
            .feed(&buf.filled()[before..], |kind, stream, payload| {
                let mut w = wire.lock().unwrap_or_else(PoisonError::into_inner);
                match kind {
                    DATA => *w.received_data.entry(stream).or_default() += 1,
                    GOAWAY if payload.len() >= 8 => {
                        let code =
                            u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                        let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                        w.goaways.push((code, debug));
                    }
                    _ => {}
                }
            });
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
        let wire = &this.wire;
        this.out.feed(&data[..n], |kind, stream, _| {
            if kind == DATA {
                let mut w = wire.lock().unwrap_or_else(PoisonError::into_inner);
                *w.sent_data.entry(stream).or_default() += 1;
            }
        });
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// One HTTP/2 connection to a server.
struct Conn {
    send: h2::client::SendRequest<Bytes>,
    wire: Arc<Mutex<Wire>>,
}

impl Conn {
    async fn open(port: u16) -> Self {
        let tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let wire = Arc::new(Mutex::new(Wire::default()));
        let io = Counted {
            io: tcp,
            wire: wire.clone(),
            // The client preface: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".
            out: Frames {
                buf: Vec::new(),
                skip: 24,
            },
            inbound: Frames::default(),
        };
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 24)
            .handshake(io)
            .await
            .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("the test connection ended: {e}");
            }
        });
        Self { send, wire }
    }

    fn wire<T>(&self, f: impl FnOnce(&Wire) -> T) -> T {
        f(&self.wire.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Starts a call of `method`; its request body is left open.
    async fn call(
        &self,
        method: &str,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), h2::Error> {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1/charon.v1.Limiter/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
        self.send
            .clone()
            .ready()
            .await?
            .send_request(request, false)
    }

    /// A unary `Request` whose gRPC body is exactly `body`.
    async fn unary_raw(&self, body: Bytes) -> Answer {
        let (response, mut send) = self.call("Request").await.expect("open a stream");
        send.send_data(body, true).expect("send");
        answer(response, |_| {}).await
    }

    /// A unary `Request` whose message is `message`.
    async fn unary(&self, message: &[u8]) -> Answer {
        self.unary_raw(grpc_frame(0, message)).await
    }

    async fn session(&self) -> RawSession {
        let (response, send) = self.call("Session").await.expect("open a stream");
        let (tx, replies) = mpsc::unbounded_channel();
        let end = tokio::spawn(answer(response, move |m| {
            let reply = v1::SessionReply::decode(m).expect("the server's reply decodes");
            let _ = tx.send(reply);
        }));
        RawSession { send, replies, end }
    }
}

/// A message in gRPC's framing: compression flag, length, bytes.
fn grpc_frame(flag: u8, message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(flag);
    b.put_u32(u32::try_from(message.len()).expect("small"));
    b.put_slice(message);
    b.freeze()
}

/// How a call ended: its gRPC status, message and SPEC §5 class.
#[derive(Debug, Clone, Default)]
struct Answer {
    status: Option<i32>,
    message: String,
    class: Option<String>,
    /// Set when the HTTP/2 stream itself broke.
    broken: Option<String>,
}

impl Answer {
    fn take(&mut self, headers: &http::HeaderMap) {
        let text = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
        if let Some(s) = text("grpc-status") {
            self.status = s.parse().ok();
        }
        if let Some(m) = text("grpc-message") {
            self.message = percent_decode(m);
        }
        if let Some(c) = text("charon-error-class") {
            self.class = Some(c.to_owned());
        }
    }

    fn is_client_error(&self, code: i32) -> bool {
        self.status == Some(code)
            && self.class.as_deref() == Some("client")
            && self.message.starts_with("malformed request")
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(b) = &self.broken {
            return write!(f, "stream broke: {b}");
        }
        write!(
            f,
            "grpc-status {} class {} {:?}",
            self.status.map_or("none".to_owned(), |s| s.to_string()),
            self.class.as_deref().unwrap_or("none"),
            self.message
        )
    }
}

fn percent_decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a call's answer, handing each gRPC message to `message`.
async fn answer(response: h2::client::ResponseFuture, mut message: impl FnMut(Bytes)) -> Answer {
    let mut a = Answer::default();
    let result: Result<(), h2::Error> = async {
        let response = response.await?;
        let (parts, mut body) = response.into_parts();
        a.take(&parts.headers);
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            let _ = body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                buf.advance(5);
                message(buf.split_to(len).freeze());
            }
        }
        if let Some(trailers) = body.trailers().await? {
            a.take(&trailers);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        a.broken = Some(e.to_string());
    }
    a
}

/// A `Session` stream.
struct RawSession {
    send: h2::SendStream<Bytes>,
    replies: mpsc::UnboundedReceiver<v1::SessionReply>,
    end: tokio::task::JoinHandle<Answer>,
}

impl RawSession {
    fn stream_id(&self) -> u32 {
        self.send.stream_id().into()
    }

    /// Sends one operation in its own DATA frame; false if the stream is
    /// gone.
    fn op(&mut self, id: u64, op: Op) -> bool {
        let m = v1::SessionRequest { id, op: Some(op) }.encode_to_vec();
        self.send.send_data(grpc_frame(0, &m), false).is_ok()
    }

    /// The next reply, if one comes within 30 s.
    async fn reply(&mut self) -> Option<v1::SessionReply> {
        tokio::time::timeout(Duration::from_secs(30), self.replies.recv())
            .await
            .ok()
            .flatten()
    }

    /// Sends `body` as is, ends the request, and returns how the stream
    /// ended with the replies that came before.
    async fn finish(mut self, body: Bytes) -> (Vec<v1::SessionReply>, Answer) {
        let _ = self.send.send_data(body, true);
        let end = tokio::time::timeout(Duration::from_secs(30), self.end)
            .await
            .expect("the stream ends within 30 s")
            .expect("reader task");
        let mut replies = Vec::new();
        while let Ok(r) = self.replies.try_recv() {
            replies.push(r);
        }
        (replies, end)
    }
}

fn reserve(domain: &str, copies: u64) -> Op {
    Op::Reserve(v1::ReserveRequest {
        resource: "vm".to_owned(),
        domain: domain.to_owned(),
        copies: Some(copies),
        min_copies: None,
        wait_ms: None,
    })
}

fn release(domain: &str, copies: u64) -> Op {
    Op::Release(v1::ReleaseRequest {
        resource: "vm".to_owned(),
        domain: domain.to_owned(),
        copies,
        groups: Vec::new(),
        result_ready: false,
    })
}

fn rate_request() -> Vec<u8> {
    v1::RateRequest {
        resource: "api".to_owned(),
        domain: "d".to_owned(),
        copies: None,
        min_copies: None,
        dry_run: false,
    }
    .encode_to_vec()
}

/// A `SessionRequest` whose rate request is the raw bytes `inner`.
fn session_request_around(id: u64, inner: &[u8]) -> Vec<u8> {
    let mut m = v1::SessionRequest { id, op: None }.encode_to_vec();
    m.push(0x12); // field 2 (request), length-delimited
    prost::encoding::encode_varint(inner.len() as u64, &mut m);
    m.extend_from_slice(inner);
    m
}

fn server(extra: &[&str]) -> CharonProcess {
    CharonProcess::start(bin(), LIMITS, extra)
}

// ---------------------------------------------------------------------
// Defect 7: malformed requests are client errors.

/// Protobuf that prost refuses, as a `RateRequest`.
fn malformed_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        // resource = "\xc3\x28"
        ("invalid UTF-8 in a string", vec![0x0a, 0x02, 0xc3, 0x28]),
        // copies = a varint whose last byte says "more follows"
        ("truncated varint", vec![0x18, 0xff, 0xff]),
        // resource (a string) sent as a 32-bit number
        ("wrong wire type", vec![0x0d, 1, 2, 3, 4]),
        // resource says 16 bytes, 1 follows
        ("length past the end", vec![0x0a, 0x10, b'a']),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_is_client_error() {
    let server = server(&[]);
    let conn = Conn::open(server.grpc_port).await;
    let mut failures = Vec::new();
    for (name, body) in malformed_bodies() {
        let unary = conn.unary(&body).await;
        println!(
            "FAULT malformed_protobuf_is_client_error/unary {name}: injected RateRequest {body:02x?}; \
             expected INVALID_ARGUMENT class client; observed {unary}"
        );
        if !unary.is_client_error(INVALID_ARGUMENT) {
            failures.push(format!("unary {name}: {unary}"));
        }

        // On a session: a good operation, then the bad one.
        let mut session = conn.session().await;
        assert!(session.op(1, reserve("d", 1)));
        let bad = session_request_around(2, &body);
        let (replies, end) = session.finish(grpc_frame(0, &bad)).await;
        let answered_first = replies.iter().any(|r| r.id == 1);
        println!(
            "FAULT malformed_protobuf_is_client_error/session {name}: injected a reserve, then \
             SessionRequest {bad:02x?}; expected the reserve answered, then the stream ended with \
             INVALID_ARGUMENT class client; observed {} replies (reserve answered: \
             {answered_first}), {end}",
            replies.len()
        );
        if !(answered_first && end.is_client_error(INVALID_ARGUMENT)) {
            failures.push(format!(
                "session {name}: first answered {answered_first}, {end}"
            ));
        }
    }
    // The server is still there, and a good request still works.
    let good = conn.unary(&rate_request()).await;
    assert_eq!(good.status, Some(OK), "{good}");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_grpc_framing_is_client_error() {
    let server = server(&[]);
    let conn = Conn::open(server.grpc_port).await;
    let good = rate_request();
    let mut cut = grpc_frame(0, &good).to_vec();
    cut.truncate(cut.len() - 3);
    let cases: Vec<(&str, Bytes)> = vec![
        ("a message cut short", Bytes::from(cut)),
        ("compression flag 7", grpc_frame(7, &good)),
        (
            "compressed flag without grpc-encoding",
            grpc_frame(1, &good),
        ),
        ("no message at all", Bytes::new()),
        (
            "a 3-byte body (not even a length)",
            Bytes::from_static(&[0, 0, 0]),
        ),
    ];
    let mut failures = Vec::new();
    for (name, body) in cases {
        let unary = conn.unary_raw(body.clone()).await;
        println!(
            "FAULT broken_grpc_framing_is_client_error/unary {name}: injected body {:02x?}; \
             expected INVALID_ARGUMENT class client; observed {unary}",
            &body[..body.len().min(16)]
        );
        if !unary.is_client_error(INVALID_ARGUMENT) {
            failures.push(format!("unary {name}: {unary}"));
        }
        if body.is_empty() {
            // A session may well have no message at all.
            continue;
        }
        let mut session = conn.session().await;
        assert!(session.op(1, reserve("d", 1)));
        let (replies, end) = session.finish(body).await;
        let answered_first = replies.iter().any(|r| r.id == 1);
        println!(
            "FAULT broken_grpc_framing_is_client_error/session {name}: injected a reserve, then \
             that body; expected the reserve answered, then INVALID_ARGUMENT class client; \
             observed reserve answered: {answered_first}, {end}"
        );
        if !(answered_first && end.is_client_error(INVALID_ARGUMENT)) {
            failures.push(format!(
                "session {name}: first answered {answered_first}, {end}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_message_is_client_error() {
    let server = server(&[]);
    let conn = Conn::open(server.grpc_port).await;
    let huge = v1::RateRequest {
        resource: "x".repeat(MAX_MESSAGE + 1),
        ..Default::default()
    }
    .encode_to_vec();
    let unary = conn.unary(&huge).await;
    println!(
        "FAULT oversized_message_is_client_error/unary: injected a {} byte RateRequest (limit \
         {MAX_MESSAGE}); expected RESOURCE_EXHAUSTED class client; observed {unary}",
        huge.len()
    );

    let mut session = conn.session().await;
    assert!(session.op(1, reserve("d", 1)));
    let first = session.reply().await;
    let big = session_request_around(2, &huge);
    let (_, end) = session.finish(grpc_frame(0, &big)).await;
    println!(
        "FAULT oversized_message_is_client_error/session: injected a reserve, then a {} byte \
         SessionRequest; expected the reserve answered, then RESOURCE_EXHAUSTED class client; \
         observed reserve answered: {}, {end}",
        big.len(),
        first.is_some()
    );
    assert!(unary.is_client_error(RESOURCE_EXHAUSTED), "{unary}");
    assert!(first.is_some_and(|r| r.id == 1));
    assert!(end.is_client_error(RESOURCE_EXHAUSTED), "{end}");
}

#[test]
fn random_bodies_never_get_internal() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = server(&[]);
    let conn = rt.block_on(Conn::open(server.grpc_port));
    let tally = Mutex::new(HashMap::<String, usize>::new());
    let mut runner = TestRunner::new(Config {
        cases: 500,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(any::<u8>(), 0..64), |body| {
        let (unary, session) = rt.block_on(async {
            let unary = conn.unary(&body).await;
            let session = conn.session().await;
            let (_, end) = session.finish(grpc_frame(0, &body)).await;
            (unary, end)
        });
        for (what, a) in [("unary", &unary), ("session", &session)] {
            let kind = match (a.status, a.class.as_deref()) {
                (Some(OK), _) => "OK".to_owned(),
                (Some(code), Some(class)) => format!("{code}/{class}"),
                (Some(code), None) => format!("{code}/no class"),
                (None, _) => "no status".to_owned(),
            };
            *tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(format!("{what} {kind}"))
                .or_default() += 1;
            prop_assert!(a.broken.is_none(), "{what} {body:02x?}: {a}");
            prop_assert!(a.status.is_some(), "{what} {body:02x?}: {a}");
            prop_assert_ne!(a.status, Some(INTERNAL), "{} {:02x?}: {}", what, body, a);
            if a.status != Some(OK) {
                prop_assert!(a.class.is_some(), "{what} {body:02x?}: {a}");
            }
            if a.message.starts_with("malformed") {
                prop_assert!(
                    a.is_client_error(INVALID_ARGUMENT),
                    "{what} {body:02x?}: {a}"
                );
            }
        }
        Ok(())
    });
    let mut tally: Vec<_> = tally
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_iter()
        .collect();
    tally.sort();
    println!(
        "FAULT random_bodies_never_get_internal: injected 500 random bodies (0-63 bytes) as a \
         unary RateRequest and as a SessionRequest; expected every answer OK or a status with \
         charon-error-class, undecodable ones INVALID_ARGUMENT class client, never INTERNAL; \
         observed (answer, count) {tally:?}; result {result:?}"
    );
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_library_does_not_degrade_on_a_refused_message() {
    let server = server(&[]);
    let client = Client::connect(ClientOptions::new(server.endpoint())).expect("client");
    let huge = "x".repeat(MAX_MESSAGE + 1);
    let reserve = client.reserve(huge.as_str(), "d").send().await;
    let request = client.request(huge.as_str(), "d").send().await;
    let stats = client.stats();
    println!(
        "FAULT client_library_does_not_degrade_on_a_refused_message: injected a reserve and a \
         request naming a {} byte resource (over the server's message limit), degraded mode \
         on; expected client errors, no degraded grant; observed reserve {:?}, request {:?}, \
         degraded grants {}",
        huge.len(),
        reserve
            .as_ref()
            .map(charon_client::Hold::copies)
            .map_err(short),
        request.as_ref().map(|g| g.granted).map_err(short),
        stats.degraded_grants
    );
    assert!(
        matches!(reserve, Err(ref e) if e.is_client()),
        "{:?}",
        reserve.map(|h| h.copies())
    );
    assert!(
        matches!(request, Err(ref e) if e.is_client()),
        "{:?}",
        request.map(|g| g.granted)
    );
    assert_eq!(stats.degraded_grants, 0);
    // The client goes on working with good requests.
    let hold = client.reserve("vm", "d").send().await.expect("reserve");
    assert!(!hold.is_degraded());
}

fn short(e: &Error) -> String {
    let s = e.to_string();
    s.chars().take(120).collect()
}

// ---------------------------------------------------------------------
// Defect 4: a pipelined flood on one session, one DATA frame per message.

const FLOOD: u64 = 20_000;

async fn pipelined_flood(store: &str, extra: &[&str]) {
    let server = server(extra);
    let conn = Conn::open(server.grpc_port).await;

    let mut bystander = conn.session().await;
    assert!(bystander.op(1, reserve("bystander", 3)));
    let held = bystander.reply().await.expect("the bystander's reserve");
    assert!(
        matches!(held.result, Some(Reply::Reserve(ref r)) if r.granted == 3),
        "{held:?}"
    );

    let mut flood = conn.session().await;
    let started = std::time::Instant::now();
    for id in 0..FLOOD {
        let op = if id % 2 == 0 {
            reserve("flood", 1)
        } else {
            release("flood", 1)
        };
        if !flood.op(id, op) {
            break;
        }
    }
    let mut answered = HashSet::new();
    let mut errors = Vec::new();
    while (answered.len() as u64) < FLOOD {
        let Some(r) = flood.reply().await else { break };
        if let Some(Reply::Error(e)) = &r.result {
            errors.push(e.message.clone());
        }
        answered.insert(r.id);
    }
    let took = started.elapsed();

    // The bystander's stream is alive and its 3 copies are still held.
    let sent_again = bystander.op(2, reserve("bystander", 1));
    let after = bystander.reply().await;
    let bystander_holds = match &after {
        Some(v1::SessionReply {
            result: Some(Reply::Reserve(r)),
            ..
        }) => Some(r.domain_holds),
        _ => None,
    };
    let (sent, received, goaways) = conn.wire(|w| {
        (
            w.sent_data.get(&flood.stream_id()).copied().unwrap_or(0),
            w.received_data
                .get(&flood.stream_id())
                .copied()
                .unwrap_or(0),
            w.goaways.clone(),
        )
    });
    println!(
        "FAULT pipelined_session_flood_keeps_bystander[{store}]: injected {FLOOD} operations \
         (reserve/release alternating) pipelined on one session, one per DATA frame, with a \
         bystander session holding 3 copies on the same connection; expected every operation \
         answered, no GOAWAY, the bystander alive with its copies; observed {} answered ({} \
         errors) in {took:.1?}, client DATA frames on the flood stream {sent}, server DATA \
         frames back {received} ({:.1} replies per frame), GOAWAY {goaways:?}, bystander stream open \
         {sent_again}, its domain holds after reserving 1 more {bystander_holds:?}",
        answered.len(),
        errors.len(),
        answered.len() as f64 / received.max(1) as f64,
    );
    assert!(goaways.is_empty(), "{goaways:?}");
    assert_eq!(answered.len() as u64, FLOOD, "every operation answered");
    assert!(errors.is_empty(), "{:?}", &errors[..errors.len().min(5)]);
    assert!(
        sent as u64 >= FLOOD,
        "the client really sent one DATA frame per operation ({sent})"
    );
    assert_eq!(bystander_holds, Some(4), "{after:?}");
    let (_, end) = flood.finish(Bytes::new()).await;
    assert_eq!(end.status, Some(OK), "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_session_flood_keeps_bystander_memory() {
    pipelined_flood("memory", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_session_flood_keeps_bystander_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    pipelined_flood("redis", &["--store", url.as_str()]).await;
}
