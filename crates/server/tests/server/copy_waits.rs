//! Waiting for a copy (SPEC §14) through a whole server in this process:
//! `wait_ms` on a session's reserve, the copy handed over on a release in
//! arrival order, `waited_ms`, `queue_full`, `result_ready` in
//! `wait_mode: shared_result`, the rejection at the deadline, and a waiter
//! whose client goes away leaving the queue (the copy goes to the next);
//! each on the in-memory store and on Redis (the queue in Redis).

use std::time::Duration;

use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_testkit::InProcessServer;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const LIMITS: &str = r#"
resources:
  - name: page
    kind: copy
    domain_limit: 5
    global_limit: 1
    queue_limit: 2
  - name: hot
    kind: copy
    domain_limit: 1
    wait_mode: shared_result
"#;

/// One session stream.
pub(super) struct Session {
    tx: mpsc::Sender<v1::SessionRequest>,
    rx: tonic::Streaming<v1::SessionReply>,
    next: u64,
}

impl Session {
    pub(super) async fn open(c: &mut LimiterClient<Channel>) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let rx = c
            .session(ReceiverStream::new(rx))
            .await
            .expect("a session")
            .into_inner();
        Self { tx, rx, next: 0 }
    }

    pub(super) async fn send(&mut self, op: Op) {
        self.next += 1;
        self.tx
            .send(v1::SessionRequest {
                id: self.next,
                op: Some(op),
            })
            .await
            .expect("sent");
    }

    pub(super) async fn reply(&mut self) -> Reply {
        self.try_reply().await.expect("a reply")
    }

    /// The next reply; `None` if the stream ended or failed (its server
    /// died).
    pub(super) async fn try_reply(&mut self) -> Option<Reply> {
        self.rx.next().await?.ok()?.result
    }

    pub(super) async fn call(&mut self, op: Op) -> Reply {
        self.send(op).await;
        self.reply().await
    }
}

pub(super) fn reserve(resource: &str, domain: &str, wait_ms: u64) -> Op {
    Op::Reserve(v1::ReserveRequest {
        resource: resource.to_owned(),
        domain: domain.to_owned(),
        copies: None,
        min_copies: None,
        wait_ms: Some(wait_ms),
    })
}

pub(super) fn release(resource: &str, domain: &str, result_ready: bool) -> Op {
    Op::Release(v1::ReleaseRequest {
        resource: resource.to_owned(),
        domain: domain.to_owned(),
        copies: 1,
        groups: vec![],
        result_ready,
    })
}

pub(super) fn reserved(r: Reply) -> v1::ReserveReply {
    match r {
        Reply::Reserve(r) => r,
        other => panic!("a reserve reply, not {other:?}"),
    }
}

/// Waits until `n` callers wait for `resource` on `server`.
async fn until_waiting(server: &InProcessServer, resource: &str, n: u64) {
    let mut now = 0;
    for _ in 0..400 {
        let lengths = server
            .limiter()
            .store()
            .queue_lengths()
            .await
            .expect("lengths");
        now = lengths
            .iter()
            .find(|(r, _)| r == resource)
            .map_or(0, |(_, l)| *l);
        if now == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} callers never waited for {resource} ({now} wait)");
}

/// Where a test's server keeps its counts and queues.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    /// A private Redis (the queue in Redis, as a fleet's).
    Redis,
}

/// Runs each named test, a function of the [`Backend`], on both stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$name(super::Backend::Memory).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$name(super::Backend::Redis).await;
                }
            }
        )*
    };
}

on_both_stores!(
    released_copies_go_to_waiters_in_arrival_order,
    a_waiter_is_rejected_at_its_deadline_and_a_gone_one_leaves,
    shared_result_answers_every_waiter_of_the_pair,
    a_session_waiting_for_a_copy_may_release_another_meanwhile,
    a_waiter_that_never_reads_its_wake_up_holds_up_nobody_and_leaks_nothing,
);

/// A server on [`LIMITS`] and a client of it (and its private Redis, if
/// any, to keep while it runs).
async fn start(
    backend: Backend,
) -> (
    InProcessServer,
    LimiterClient<Channel>,
    Option<charon_testkit::RedisServer>,
) {
    let (server, redis) = match backend {
        Backend::Memory => (InProcessServer::start(LIMITS).await, None),
        Backend::Redis => {
            let redis = charon_testkit::RedisServer::start();
            // A liveness ttl short enough for a quick start (the first
            // server on a new Redis waits half of it), long enough that a
            // busy machine never makes it miss a renewal (copy operations
            // wait for one after half of it).
            let server =
                InProcessServer::start_on_redis(LIMITS, &redis.url(), Duration::from_secs(6)).await;
            // It serves copies once a new Redis's rebuild window passed.
            let mut ready = false;
            for _ in 0..500 {
                if server.limiter().store().ping().await.is_ok() {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(ready, "the Redis store never got ready");
            (server, Some(redis))
        }
    };
    let c = LimiterClient::connect(server.endpoint())
        .await
        .expect("connect");
    (server, c, redis)
}

/// A new session holding one copy of `resource` for `domain`.
async fn holding(c: &mut LimiterClient<Channel>, resource: &str, domain: &str) -> Session {
    let mut s = Session::open(c).await;
    let r = reserved(s.call(reserve(resource, domain, 0)).await);
    assert_eq!((r.granted, r.waited_ms), (1, None), "{r:?}");
    s
}

async fn released_copies_go_to_waiters_in_arrival_order(backend: Backend) {
    let (server, mut c, _redis) = start(backend).await;
    let mut holder = holding(&mut c, "page", "a").await;

    let mut w1 = Session::open(&mut c).await;
    w1.send(reserve("page", "b", 60_000)).await;
    until_waiting(&server, "page", 1).await;
    let mut w2 = Session::open(&mut c).await;
    w2.send(reserve("page", "c", 60_000)).await;
    until_waiting(&server, "page", 2).await;

    // The queue holds its limit: a third would-be waiter is told at once.
    let mut w3 = Session::open(&mut c).await;
    let full = reserved(w3.call(reserve("page", "d", 60_000)).await);
    assert_eq!(
        (full.granted, full.queue_full, full.waited_ms),
        (0, true, Some(0))
    );
    // A reserve that may not wait is not served ahead of the waiters.
    let now = reserved(w3.call(reserve("page", "d", 0)).await);
    assert_eq!((now.granted, now.queue_full), (0, false));

    tokio::time::sleep(Duration::from_millis(30)).await;
    holder.call(release("page", "a", false)).await;
    let got = reserved(w1.reply().await);
    assert_eq!((got.granted, got.global_holds), (1, 1));
    assert!(got.waited_ms.expect("waited") >= 30, "{got:?}");
    // w1 goes away holding its copy: its session's end releases it, and the
    // copy goes on to w2.
    drop(w1);
    let got = reserved(w2.reply().await);
    assert_eq!(got.granted, 1);
    until_waiting(&server, "page", 0).await;
    server.stop().await;
}

async fn a_waiter_is_rejected_at_its_deadline_and_a_gone_one_leaves(backend: Backend) {
    let (server, mut c, _redis) = start(backend).await;
    let mut holder = holding(&mut c, "page", "a").await;
    let mut w = Session::open(&mut c).await;
    let r = reserved(w.call(reserve("page", "b", 50)).await);
    assert_eq!((r.granted, r.queue_full), (0, false));
    assert!(r.waited_ms.expect("waited") >= 50, "{r:?}");

    // A waiter whose client goes away leaves the queue: the released copy
    // goes to the one behind it.
    let mut gone = Session::open(&mut c).await;
    gone.send(reserve("page", "g", 60_000)).await;
    until_waiting(&server, "page", 1).await;
    let mut next = Session::open(&mut c).await;
    next.send(reserve("page", "n", 60_000)).await;
    until_waiting(&server, "page", 2).await;
    drop(gone);
    until_waiting(&server, "page", 1).await;
    holder.call(release("page", "a", false)).await;
    let got = reserved(next.reply().await);
    assert_eq!((got.granted, got.global_holds), (1, 1));
    server.stop().await;
}

async fn shared_result_answers_every_waiter_of_the_pair(backend: Backend) {
    let (server, mut c, _redis) = start(backend).await;
    let mut holder = holding(&mut c, "hot", "x").await;
    let mut waiters = Vec::new();
    for i in 1..=3 {
        let mut s = Session::open(&mut c).await;
        s.send(reserve("hot", "x", 60_000)).await;
        until_waiting(&server, "hot", i).await;
        waiters.push(s);
    }
    let released = holder.call(release("hot", "x", true)).await;
    assert!(matches!(released, Reply::Release(_)), "{released:?}");
    for s in &mut waiters {
        let r = reserved(s.reply().await);
        assert_eq!((r.granted, r.result_ready), (0, true), "{r:?}");
    }
    until_waiting(&server, "hot", 0).await;
    server.stop().await;
}

async fn a_session_waiting_for_a_copy_may_release_another_meanwhile(backend: Backend) {
    let (server, mut c, _redis) = start(backend).await;
    let mut s = holding(&mut c, "page", "a").await;
    // The same session waits for a second copy, then gives back its first:
    // the release is answered while the reserve waits, and frees the copy
    // the reserve then gets.
    s.send(reserve("page", "b", 60_000)).await;
    until_waiting(&server, "page", 1).await;
    // Both are answered, in either order: the reserve's answer may come
    // first (the release's reply and the waiter's wake-up race).
    s.send(release("page", "a", false)).await;
    let (mut released, mut got) = (None, None);
    for _ in 0..2 {
        match s.reply().await {
            Reply::Release(r) => released = Some(r),
            Reply::Reserve(r) => got = Some(r),
            other => panic!("{other:?}"),
        }
    }
    assert!(released.is_some(), "the release was answered");
    let got = got.expect("the reserve was answered");
    assert_eq!((got.granted, got.domain_holds), (1, 1));
    // Its end releases what the wait got.
    drop(s);
    let mut other = Session::open(&mut c).await;
    let mut granted = 0;
    for _ in 0..100 {
        granted = reserved(other.call(reserve("page", "z", 0)).await).granted;
        if granted == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(granted, 1, "the waited copy was released with the session");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_waiters_than_a_session_may_have_in_flight_still_let_the_release_through() {
    let options = charon_server::ServerOptions {
        session_concurrency: 4,
        ..charon_server::ServerOptions::default()
    };
    let server = InProcessServer::start_with_options(LIMITS, options).await;
    let mut c = LimiterClient::connect(server.endpoint())
        .await
        .expect("connect");
    let mut s = holding(&mut c, "hot", "x").await;
    // Ten waiters on the one session, more than its 4 in flight.
    for _ in 0..10 {
        s.send(reserve("hot", "x", 60_000)).await;
    }
    until_waiting(&server, "hot", 10).await;
    s.send(release("hot", "x", true)).await;
    let mut ready = 0;
    for _ in 0..11 {
        match s.reply().await {
            Reply::Reserve(r) if r.result_ready => ready += 1,
            Reply::Release(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(ready, 10);
    server.stop().await;
}

/// A waiter whose client never reads its replies: the copy handed over to
/// it is its session's (counted, not lost); its flood of further requests
/// is bounded by the stream's HTTP/2 window (the server stops reading it
/// when its replies are not read); every other session is served
/// meanwhile; and when the client dies (its process: here its runtime,
/// with its connection) its copy goes on to the next waiter. While its
/// connection lives, a client that stops reading keeps what it holds, as
/// any session does.
async fn a_waiter_that_never_reads_its_wake_up_holds_up_nobody_and_leaks_nothing(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let (server, mut c, _redis) = start(backend).await;
    let mut holder = holding(&mut c, "page", "a").await;
    // The deaf client: a process of its own (a runtime, its connection).
    let deaf = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let taken = Arc::new(AtomicU64::new(0));
    let (endpoint, counter) = (server.endpoint(), taken.clone());
    deaf.spawn(async move {
        let mut c = LimiterClient::connect(endpoint).await.expect("connect");
        let mut s = Session::open(&mut c).await;
        s.send(reserve("page", "deaf", 60_000)).await;
        // Then it floods its stream with requests whose replies it never
        // reads, as long as the server takes them.
        loop {
            s.send(reserve("hot", "flood", 0)).await;
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    until_waiting(&server, "page", 1).await;
    let mut next = Session::open(&mut c).await;
    next.send(reserve("page", "n", 60_000)).await;
    until_waiting(&server, "page", 2).await;

    holder.call(release("page", "a", false)).await;
    // Handed over to the deaf waiter: the next one still waits.
    until_waiting(&server, "page", 1).await;
    // Until the flood stalls: the bound below is the point, not how soon
    // it is reached (each request is a decision, on Redis a script, and a
    // busy machine takes a while to fill the window).
    let mut last = u64::MAX;
    let mut stalled_at = None;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = taken.load(Ordering::Relaxed);
        if now == last {
            stalled_at = Some(now);
            break;
        }
        last = now;
    }
    let stalled_at = stalled_at.expect("the server stopped taking the deaf stream's requests");
    assert!(stalled_at < 500_000, "{stalled_at} requests taken unread");
    // Everyone else is served meanwhile.
    let mut other = Session::open(&mut c).await;
    for _ in 0..20 {
        let r = reserved(other.call(reserve("hot", "other", 0)).await);
        assert_eq!(r.granted, 1);
        other.call(release("hot", "other", false)).await;
    }
    // The deaf client dies: its connection closes, its session ends, and
    // its copy goes on.
    deaf.shutdown_background();
    let got = reserved(next.reply().await);
    assert_eq!((got.granted, got.global_holds), (1, 1), "{got:?}");
    until_waiting(&server, "page", 0).await;
    println!("the server stopped reading the deaf stream after {stalled_at} requests");
    server.stop().await;
}
