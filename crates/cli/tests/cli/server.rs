//! The real server (`charon serve` processes on real TCP ports) driven
//! through the client library, raw gRPC, signals and killed processes.

use crate::support::{assert_percentiles_ordered, bench_json, bin, holder, strict_client, within};

use std::time::{Duration, Instant};

use charon_client::{Client, ClientOptions, Source};
use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_testkit::CharonProcess;
use serde_json::json;
use tokio_stream::StreamExt;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 10s } ]
  - name: slow
    kind: rate
    tiers: [ { limit: 1, window: 60s } ]
  - name: bench
    kind: rate
    tiers: [ { limit: 5, window: 1s } ]
  - name: vm
    kind: copy
    domain_limit: 3
    global_limit: 4
    groups: [ { name: probation, limit: 2, domains: [newbie] } ]
"#;

fn start(extra: &[&str]) -> CharonProcess {
    CharonProcess::start(bin(), LIMITS, extra)
}

async fn reserve_granted(c: &Client, domain: &str, copies: u64) -> u64 {
    let hold = c
        .reserve("vm", domain)
        .copies(copies)
        .send()
        .await
        .expect("reserve");
    let n = hold.copies();
    hold_forever(hold);
    n
}

/// How long until domain `d` can hold all 3 copies of `vm` again (the
/// copies a vanished holder had), if within `limit`.
async fn copies_come_back(probe: &Client, limit: Duration) -> Option<Duration> {
    within(limit, async || {
        let h = probe
            .reserve("vm", "d")
            .copies(3)
            .send()
            .await
            .expect("reserve");
        h.copies() == 3
    })
    .await
}

/// Keeps a hold alive for the rest of the test (its session still ends
/// with the client).
fn hold_forever(hold: charon_client::Hold) {
    std::mem::forget(hold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_where_it_listens_and_serves_health_and_reflection() {
    let server = start(&[]);
    let log = server.log();
    let line = format!(
        "charon listening on 127.0.0.1:{} (gRPC) and 127.0.0.1:{} (HTTP), store memory",
        server.grpc_port, server.http_port
    );
    assert_eq!(log.matches("charon listening").count(), 1, "{log}");
    assert!(log.contains(&line), "{log}");
    assert_eq!(server.http_get("/healthz").map(|r| r.0), Some(200));

    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "charon.v1.Limiter".into(),
        })
        .await
        .expect("health check")
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let reply = replies.next().await.expect("a reply").expect("ok");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"charon.v1.Limiter"), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_through_the_client_library() {
    let server = start(&[]);
    let a = strict_client(&server);
    let b = strict_client(&server);
    let g = a
        .request("api", "t")
        .copies(4)
        .send()
        .await
        .expect("request");
    assert_eq!((g.granted, g.source), (4, Source::Server));
    let r = g.reply.expect("reply");
    assert_eq!(
        (r.tier, r.tier_limit, r.tier_hits, r.burst),
        (1, Some(5), 4, true)
    );
    let g = a
        .request("api", "t")
        .copies(4)
        .min_copies(2)
        .send()
        .await
        .expect("request");
    assert_eq!(g.granted, 0, "only 1 left, 2 needed");
    // SPEC §10 on burst tiers: back when the first hits leave the 10 s
    // window; a dry run of the one left records nothing.
    assert!(
        g.retry_after()
            .is_some_and(|w| w > Duration::from_secs(8) && w <= Duration::from_millis(10_001)),
        "{g:?}"
    );
    let g = a
        .request("api", "t")
        .dry_run(true)
        .send()
        .await
        .expect("dry run");
    let r = g.reply.expect("reply");
    assert_eq!(
        (g.granted, r.remaining, r.tier_hits),
        (1, Some(0), 5),
        "as if granted"
    );
    let g = a.request("api", "t").send().await.expect("request");
    assert_eq!(g.granted, 1, "the dry run recorded nothing");

    let mut hold = a
        .reserve("vm", "newbie")
        .copies(3)
        .send()
        .await
        .expect("reserve");
    assert_eq!(hold.copies(), 2, "probation allows 2");
    assert_eq!(hold.groups(), ["probation"]);
    let reply = hold.reply().expect("reply").clone();
    assert_eq!(
        (
            reply.domain_limit,
            reply.global_limit,
            reply.groups[0].holds
        ),
        (Some(3), Some(4), 2)
    );
    hold.release(1).await.expect("release one");
    let id = hold
        .transfer(1, Duration::from_secs(30))
        .await
        .expect("transfer");
    assert_eq!(hold.copies(), 0);
    let seized = b.seize(&id).await.expect("seize");
    assert_eq!(
        (seized.copies(), seized.groups(), seized.domain()),
        (1, &["probation".to_owned()][..], "newbie")
    );
    assert!(
        matches!(b.seize(&id).await, Err(ref e) if e.is_client()),
        "seized once"
    );
    drop(seized);

    // A transfer that is not seized within its ttl is released: seizing it
    // afterwards is a client error.
    let mut h = a
        .reserve("vm", "x")
        .copies(2)
        .send()
        .await
        .expect("reserve");
    let id = h
        .transfer(2, Duration::from_millis(300))
        .await
        .expect("transfer");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(b.seize(&id).await, Err(ref e) if e.is_client()));
    let full = a
        .reserve("vm", "y")
        .copies(3)
        .send()
        .await
        .expect("reserve");
    assert_eq!(
        full.copies(),
        3,
        "the expired transfer gave its copies back"
    );
    drop(full);

    assert!(
        matches!(a.request("nope", "t").send().await, Err(ref e) if e.is_client() && e.message().contains("unknown resource"))
    );
    assert!(
        matches!(a.reserve("api", "t").send().await, Err(ref e) if e.is_client() && e.message().contains("rate-limited"))
    );
    assert!(matches!(
        a.request("api", "t").copies(0).send().await,
        Err(ref e) if e.is_client()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_client_error_on_that_request_alone() {
    let server = start(&[]);
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut grpc = LimiterClient::new(channel);
    let op = |id, op| v1::SessionRequest { id, op: Some(op) };
    let reserve = |resource: &str, copies| {
        Op::Reserve(v1::ReserveRequest {
            resource: resource.into(),
            domain: "d".into(),
            copies: Some(copies),
            min_copies: None,
            wait_ms: None,
        })
    };
    let requests = vec![
        op(1, reserve("nope", 1)),
        op(2, reserve("vm", 0)),
        op(
            3,
            Op::Release(v1::ReleaseRequest {
                resource: "vm".into(),
                domain: "d".into(),
                copies: 1,
                groups: vec![],
                result_ready: false,
            }),
        ),
        op(
            4,
            Op::Seize(v1::SeizeRequest {
                transfer_id: "no-such-transfer".into(),
            }),
        ),
        v1::SessionRequest { id: 5, op: None },
        op(6, reserve(&"x".repeat(2_000), 1)),
        op(
            7,
            Op::Transfer(v1::TransferRequest {
                resource: "vm".into(),
                domain: "d".into(),
                copies: 1,
                groups: vec![],
                ttl_ms: 0,
            }),
        ),
        op(8, reserve("vm", 2)),
    ];
    let mut replies = grpc
        .session(tokio_stream::iter(requests))
        .await
        .expect("session")
        .into_inner();
    let mut got = std::collections::BTreeMap::new();
    while got.len() < 8 {
        let r = replies.next().await.expect("a reply").expect("ok");
        got.insert(r.id, r.result.expect("result"));
    }
    for id in 1..=7 {
        match &got[&id] {
            Reply::Error(e) => {
                assert_eq!(e.class, v1::error::Class::Client as i32, "op {id}: {e:?}");
            }
            other => panic!("op {id}: expected a client error, got {other:?}"),
        }
    }
    let Reply::Reserve(r) = &got[&8] else {
        panic!("{:?}", got[&8])
    };
    assert_eq!(r.granted, 2, "the session went on after the bad operations");

    // An oversize unary message is refused alone; the next one is served.
    let huge = v1::RateRequest {
        resource: "api".into(),
        domain: "d".repeat(2 << 20),
        copies: None,
        min_copies: None,
        dry_run: false,
    };
    let e = grpc.request(huge).await.expect_err("too large");
    assert_eq!(
        (
            e.code(),
            e.metadata()
                .get("charon-error-class")
                .and_then(|v| v.to_str().ok())
        ),
        (tonic::Code::ResourceExhausted, Some("client")),
        "{e:?}"
    );
    let ok = grpc
        .request(v1::RateRequest {
            resource: "api".into(),
            domain: "d".into(),
            copies: None,
            min_copies: None,
            dry_run: false,
        })
        .await;
    assert_eq!(ok.expect("served").into_inner().granted, 1);
    let e = grpc
        .request(v1::RateRequest {
            resource: "nope".into(),
            domain: "d".into(),
            copies: None,
            min_copies: None,
            dry_run: false,
        })
        .await
        .expect_err("unknown");
    assert_eq!(
        (
            e.code(),
            e.metadata()
                .get("charon-error-class")
                .and_then(|v| v.to_str().ok())
        ),
        (tonic::Code::NotFound, Some("client"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_client_killed_with_sigkill_come_back() {
    let server = start(&["--keepalive", "2s"]);
    let mut holder = holder(&server, "vm", "d", 3);
    let probe = strict_client(&server);
    assert_eq!(
        reserve_granted(&probe, "e", 3).await,
        1,
        "global limit 4: only 1 left"
    );
    holder.kill().expect("SIGKILL");
    holder.wait().expect("the client exits");
    let back = copies_come_back(&probe, Duration::from_secs(5)).await;
    assert!(
        back.is_some(),
        "the killed client's copies came back:\n{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_client_that_went_silent_come_back_within_the_keepalive_bound() {
    let server = start(&["--keepalive", "2s"]);
    let mut holder = holder(&server, "vm", "d", 3);
    // SIGSTOP: the process keeps its connection open but answers nothing,
    // like a host that vanished from the network.
    charon_testkit::signal(holder.id(), "STOP");
    let probe = strict_client(&server);
    let started = Instant::now();
    let back = copies_come_back(&probe, Duration::from_secs(10)).await;
    charon_testkit::signal(holder.id(), "KILL");
    holder.wait().expect("the client exits");
    let took = back.unwrap_or_else(|| panic!("copies never came back:\n{}", server.log()));
    assert!(
        took <= Duration::from_secs(5),
        "detected after {took:?} (bound 2 s + slack), started {started:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_off_gives_up_after_max_wait_with_the_last_rejection() {
    let server = start(&[]);
    let c = strict_client(&server);
    assert!(
        c.request("slow", "d")
            .send()
            .await
            .expect("first")
            .is_granted()
    );
    let started = Instant::now();
    let g = c
        .request("slow", "d")
        .max_wait(Duration::from_millis(800))
        .send()
        .await
        .expect("request");
    let took = started.elapsed();
    assert!(!g.is_granted());
    assert_eq!(g.reply.expect("the last rejection").tier_hits, 1);
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(1_500),
        "{took:?}"
    );
    assert_eq!(c.stats().rejections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_mode_when_the_server_is_stopped_and_the_kill_switch() {
    let mut server = start(&[]);
    let mut options = ClientOptions::new(server.endpoint());
    options.request_timeout = Duration::from_millis(500);
    let c = Client::connect(options).expect("client");
    assert_eq!(
        c.request("slow", "d").send().await.expect("ok").source,
        Source::Server
    );
    // The kill switch turns the next rejection into a grant.
    c.set_kill_switch(true);
    let g = c
        .request("slow", "d")
        .copies(3)
        .min_copies(2)
        .send()
        .await
        .expect("ok");
    assert_eq!((g.granted, g.source), (2, Source::KillSwitch));
    assert_eq!(g.reply.expect("the server's rejection").granted, 0);
    c.set_kill_switch(false);
    server.signal("TERM");
    assert!(
        server
            .wait_exit(Duration::from_secs(10))
            .expect("exits")
            .success()
    );
    let g = c
        .request("api", "d")
        .copies(5)
        .min_copies(2)
        .send()
        .await
        .expect("degraded, not an error");
    assert_eq!((g.granted, g.source), (2, Source::Degraded));
    let h = c
        .reserve("vm", "d")
        .copies(3)
        .send()
        .await
        .expect("degraded, not an error");
    assert!(h.is_degraded() && h.copies() == 1);
    let s = c.stats();
    assert_eq!((s.degraded_grants, s.kill_switch_grants), (2, 1));
    assert!(s.server_errors >= 2);
    // With degraded mode off, the same failure is an error.
    let mut strict = ClientOptions::new(server.endpoint());
    strict.fail_open = false;
    strict.request_timeout = Duration::from_millis(500);
    let strict = Client::connect(strict).expect("client");
    assert!(matches!(
        strict.request("api", "d").send().await,
        Err(ref e) if e.is_server()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_of_a_valid_and_an_invalid_configuration_while_requests_flow() {
    let server = start(&[]);
    let c = strict_client(&server);
    let flowing = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut errors = 0;
            for i in 0..2_000u32 {
                if c.request("api", format!("d{}", i % 50))
                    .send()
                    .await
                    .is_err()
                {
                    errors += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            errors
        })
    };
    let tier_limit = async |c: &Client| {
        c.request("api", "probe")
            .send()
            .await
            .expect("ok")
            .reply
            .and_then(|r| r.tier_limit)
    };
    assert_eq!(tier_limit(&c).await, Some(5));
    std::fs::write(
        server.config_path(),
        LIMITS.replace("limit: 5, window: 10s", "limit: 3, window: 10s"),
    )
    .expect("write");
    let applied = within(Duration::from_secs(5), async || {
        tier_limit(&c).await == Some(3)
    })
    .await;
    assert!(
        applied.is_some(),
        "the file change was applied:\n{}",
        server.log()
    );
    std::fs::write(
        server.config_path(),
        "resources: [ { name: api, kind: rate, tiers: [ { limit: 1, window: 1x } ] } ]",
    )
    .expect("write");
    let refused = within(Duration::from_secs(5), async || {
        server.log().contains("configuration refused")
    })
    .await;
    assert!(refused.is_some(), "{}", server.log());
    assert!(
        server
            .log()
            .contains("resources[0].tiers[0].window: \"1x\" is not a duration"),
        "{}",
        server.log()
    );
    assert_eq!(
        tier_limit(&c).await,
        Some(3),
        "the old configuration stays in force"
    );
    // SIGHUP reloads too (the file is fixed meanwhile, without a watch event
    // needed).
    std::fs::write(
        server.config_path(),
        LIMITS.replace("limit: 5, window: 10s", "limit: 7, window: 10s"),
    )
    .expect("write");
    server.signal("HUP");
    let applied = within(Duration::from_secs(5), async || {
        tier_limit(&c).await == Some(7)
    })
    .await;
    assert!(applied.is_some(), "{}", server.log());
    assert_eq!(
        flowing.await.expect("task"),
        0,
        "no request failed during the reloads"
    );
    let metrics = server.http_get("/metrics").expect("metrics").1;
    assert!(
        metrics.contains("charon_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_sessions_releases_holds_and_exits_zero() {
    // Two servers on one Redis: what the stopped one held must be free on
    // the other at once, not after its liveness lapsed.
    let redis = charon_testkit::RedisServer::start();
    let url = redis.url();
    let mut server = start(&["--shutdown-grace", "5s", "--store", url.as_str()]);
    let other = start(&["--store", url.as_str()]);
    let mut holder = holder(&server, "vm", "d", 2);
    let c = strict_client(&server);
    let held = c
        .reserve("vm", "e")
        .copies(1)
        .send()
        .await
        .expect("reserve");
    assert!(held.is_granted());
    let probe = strict_client(&other);
    assert_eq!(reserve_granted(&probe, "f", 3).await, 1, "3 of 4 held");
    let started = Instant::now();
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(8))
        .expect("exits within the grace period");
    assert!(status.success(), "{}", server.log());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(server.log().contains("SIGTERM: shutting down"));
    // Its sessions' 3 copies were released before it exited: the other
    // server can hand them out right away.
    let mut freed = probe
        .reserve("vm", "d")
        .copies(3)
        .send()
        .await
        .expect("reserve");
    assert_eq!(freed.copies(), 3, "{}", server.log());
    freed.release_all().await.expect("release");
    // The holder process itself is unharmed, waiting for its signal.
    assert!(holder.try_wait().expect("status").is_none());
    holder.kill().expect("SIGKILL the holder");
    holder.wait().expect("the holder exits");
    drop(held);
}

/// The threads of process `pid` right now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count)
}

/// A SIGHUP while `charon serve` starts leaves it running (it used to
/// kill it within its first ~10 ms: the default disposition was still in
/// force until the configuration watch began). 50 starts of the embedded
/// default (a new SQLite database each), each signalled at another moment
/// of its start-up: from when its own code runs (the first worker thread
/// of its runtime is there; before that only the dynamic loader and
/// Rust's start-up run, which no program can cover), a little later at
/// each start, until after it listens. The runtime's thread is watched
/// for every 20 µs (a 25 ms poll saw it only once the server listened on a
/// quiet machine, where start-up takes 15–30 ms), and the step is a
/// fiftieth of one and a half start-ups as measured here first (the
/// fastest of three), so that most signals come before listening on a
/// quiet machine and a busy one alike. Each keeps running, starts and
/// exits 0 on SIGTERM.
#[test]
fn a_sighup_while_the_server_starts_leaves_it_running() {
    use rustix::process::{Pid, Signal, kill_process};
    let dir = tempfile::tempdir().expect("temp dir");
    // The fastest of three: on a busy machine one start may take ten
    // times another, and a step fitted to that one would leave few
    // signals before listening.
    let start_up = (0..3)
        .map(|i| start_up_time(dir.path(), i))
        .min()
        .expect("three starts");
    let step = (start_up * 3 / 2 / 50).max(Duration::from_micros(20));
    let mut before_listening = 0;
    for i in 0..50u32 {
        let (mut child, log_path) = spawn_serve(dir.path(), &format!("serve-{i}"));
        let pid = Pid::from_child(&child);
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let runs = closely_until(|| threads(child.id()) >= 2);
        assert!(runs, "start {i}: no runtime: {}", log());
        let at = Instant::now() + step * i;
        while Instant::now() < at {
            std::hint::spin_loop();
        }
        if !log().contains("charon listening on") {
            before_listening += 1;
        }
        kill_process(pid, Signal::HUP).expect("SIGHUP");
        let started = charon_testkit::wait_until(Duration::from_secs(10), || {
            log().contains("charon listening on")
        });
        assert_eq!(
            child.try_wait().expect("status"),
            None,
            "start {i}: a SIGHUP {:?} into its start-up killed it: {}",
            step * i,
            log()
        );
        assert!(started, "start {i}: {}", log());
        kill_process(pid, Signal::TERM).expect("SIGTERM");
        let status = child.wait().expect("exit status");
        assert!(status.success(), "start {i}: {status:?}: {}", log());
    }
    assert!(
        before_listening >= 10,
        "only {before_listening} of the 50 signals came before the server listened \
         (start-up measured at {start_up:?}, a signal every {step:?})"
    );
    println!(
        "{before_listening} of 50 SIGHUPs before listening (start-up {start_up:?}, a signal every {step:?})"
    );
}

/// Whether `ready` holds within 10 s, looked at every 20 µs: a start-up
/// is over within a few milliseconds, so the usual 25 ms poll would see
/// it only once it is over.
fn closely_until(ready: impl FnMut() -> bool) -> bool {
    charon_testkit::poll_until(Duration::from_secs(10), Duration::from_micros(20), ready)
}

/// Starts `charon serve` on its embedded default in `dir` (database
/// `NAME.db`, any free ports), its log in `NAME.log`.
fn spawn_serve(dir: &std::path::Path, name: &str) -> (std::process::Child, std::path::PathBuf) {
    let log_path = dir.join(format!("{name}.log"));
    let child = std::process::Command::new(bin())
        .current_dir(dir)
        .args(["serve", "--db", &format!("{name}.db")])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .spawn()
        .expect("spawn charon serve");
    (child, log_path)
}

/// How long `charon serve` (the embedded default) takes here from its
/// runtime's first worker thread to listening.
fn start_up_time(dir: &std::path::Path, i: u32) -> Duration {
    use rustix::process::{Pid, Signal, kill_process};
    let (mut child, log_path) = spawn_serve(dir, &format!("probe-{i}"));
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let runs = closely_until(|| threads(child.id()) >= 2);
    assert!(runs, "probe {i}: no runtime: {}", log());
    let from = Instant::now();
    let listens = closely_until(|| log().contains("charon listening on"));
    let took = from.elapsed();
    assert!(listens, "probe {i}: {}", log());
    kill_process(Pid::from_child(&child), Signal::TERM).expect("SIGTERM");
    let status = child.wait().expect("exit status");
    assert!(status.success(), "probe {i}: {status:?}: {}", log());
    took
}

/// A SIGTERM while the server waits for its store (nothing listens at
/// the Redis address: it would keep trying for --store-connect-timeout)
/// stops it at once and cleanly, exit 0: the handler was there from the
/// start, and the start watches it.
#[test]
fn a_sigterm_while_the_store_is_awaited_stops_the_start_cleanly() {
    let nowhere = format!("redis://127.0.0.1:{}", charon_testkit::free_port());
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("serve.log");
    let mut child = std::process::Command::new(bin())
        .current_dir(dir.path())
        .args([
            "serve",
            "--store",
            &nowhere,
            "--store-connect-timeout",
            "60s",
        ])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .spawn()
        .expect("spawn charon serve");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        charon_testkit::wait_until(Duration::from_secs(10), || log()
            .contains("cannot use Redis at")),
        "{}",
        log()
    );
    charon_testkit::signal(child.id(), "TERM");
    let exited = charon_testkit::wait_until(Duration::from_secs(10), || {
        child.try_wait().ok().flatten().is_some()
    });
    assert!(exited, "still starting after SIGTERM: {}", log());
    let status = child.wait().expect("exit status");
    assert!(status.success(), "{status:?}: {}", log());
    assert!(
        log().contains("stopped before it started serving"),
        "{}",
        log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_decisions_latency_sessions_and_holds() {
    let server = start(&[]);
    let c = strict_client(&server);
    c.request("api", "d").copies(2).send().await.expect("ok");
    assert!(matches!(
        c.request("nope", "d").send().await,
        Err(ref e) if e.is_client()
    ));
    let hold = c.reserve("vm", "d").copies(2).send().await.expect("ok");
    let metrics = server.http_get("/metrics").expect("metrics").1;
    for want in [
        "charon_decisions_total{operation=\"request\",resource=\"api\",outcome=\"granted\"} 1",
        "charon_decisions_total{operation=\"request\",resource=\"(unknown)\",outcome=\"client_error\"} 1",
        "charon_decisions_total{operation=\"reserve\",resource=\"vm\",outcome=\"granted\"} 1",
        "charon_errors_total{operation=\"request\",class=\"client\"} 1",
        "charon_decision_duration_seconds_bucket{operation=\"request\",le=\"0.001\"}",
        "charon_sessions_open 1",
        "charon_copies_held 2",
        "charon_transfers_staged_copies 0",
    ] {
        assert!(metrics.contains(want), "missing {want}:\n{metrics}");
    }
    drop(hold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_throughput_and_percentiles() {
    let server = start(&[]);
    // 10 domains of 5 hits a second: whatever the machine's speed, the
    // measured second sees grants (the warm-up's hits leave their 1 s
    // windows inside it) and rejections (more than 50 calls a second).
    let v = bench_json(
        &server.endpoint(),
        &[
            "--resource",
            "bench",
            "--domains",
            "10",
            "--connections",
            "2",
            "--concurrency",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert!(v["requests"].as_u64().is_some_and(|n| n > 100), "{v}");
    assert!(
        v["granted"].as_u64().is_some_and(|n| n > 0)
            && v["rejected"].as_u64().is_some_and(|n| n > 0),
        "{v}"
    );
    assert_eq!(v["errors"], 0, "{v}");
    assert_percentiles_ordered(&v);
    let adds_up = |v: &serde_json::Value| {
        let n = |k: &str| v[k].as_u64().unwrap_or(u64::MAX / 4);
        n("granted") + n("rejected") + n("errors") == n("requests")
    };
    // The warm-up counts on neither side.
    assert!(adds_up(&v), "granted + rejected + errors = requests: {v}");
    let v = bench_json(
        &server.endpoint(),
        &[
            "--resource",
            "api",
            "--rate",
            "500",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    let n = v["requests"].as_u64().unwrap_or(0);
    assert!((400..=520).contains(&n), "open loop at 500/s for 1 s: {v}");
    assert!(adds_up(&v), "granted + rejected + errors = requests: {v}");
}

/// `charon bench --envoy DOMAIN` through the binary, against a real `charon
/// serve` with an `envoy:` section: the run exits 0, its JSON counts
/// decisions, and the server's own metrics count exactly the calls the
/// bench says it made (so the load really went through `ShouldRateLimit`,
/// and every reply was a decision). The limit is small (5 per hour for each
/// of 10 clients) so that both answers are exercised and the grants are
/// exact: 50 however long the run.
#[test]
fn bench_envoy_drives_should_rate_limit() {
    const ENVOY: &str = r#"
resources:
  - { name: bench/api, kind: bucket, burst: 5, count: 5, period: 1h }
envoy:
  domains:
    - domain: bench
      descriptors:
        - key: client
          resource: bench/api
"#;
    let server = CharonProcess::start(bin(), ENVOY, &[]);
    let v = bench_json(
        &server.endpoint(),
        &[
            "--envoy",
            "bench",
            "--domains",
            "10",
            "--connections",
            "1",
            "--concurrency",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    let (granted, rejected) = (count("granted"), count("rejected"));
    assert!(count("requests") > 0, "{v}");
    assert_eq!(count("errors"), 0, "{v}");
    assert!(
        v["mode"].as_str().is_some_and(|m| m.contains("Envoy")),
        "{v}"
    );
    // 10 clients `bench-N` (the value-less key `client`), 5 each.
    assert_eq!(granted, 50, "{v}");
    assert!(rejected > 0, "{v}");
    let metrics = server.http_get("/metrics").expect("metrics").1;
    let calls = |code: &str| {
        crate::support::metric_in(
            &metrics,
            &format!("charon_envoy_calls_total{{domain=\"bench\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(calls("ok"), Some(granted), "{metrics}");
    assert_eq!(calls("over_limit"), Some(rejected), "{metrics}");
    assert_eq!(
        crate::support::metric_in(
            &metrics,
            "charon_envoy_descriptors_total{domain=\"bench\",node=\"envoy/bench/client\"}"
        ),
        Some(granted + rejected),
        "{metrics}"
    );
}

/// `charon bench --mode lease` drives `Capacity.GetCapacity`: 20 clients
/// refreshing leases on one resource, every call answered, and the leases
/// page shows the 20 clients holding no more than the capacity.
#[test]
fn bench_lease_drives_get_capacity() {
    const LEASES: &str = r#"
resources:
  - { name: bench/lease, kind: lease, capacity: 50, algorithm: fair_share,
      lease_length: 1m, refresh_interval: 10s, learning_mode: 0s }
"#;
    let server = CharonProcess::start(bin(), LEASES, &[]);
    let v = bench_json(
        &server.endpoint(),
        &[
            "--mode",
            "lease",
            "--resource",
            "bench/lease",
            "--domains",
            "20",
            "--concurrency",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    assert!(count("requests") > 20, "{v}");
    assert_eq!(count("errors"), 0, "{v}");
    assert_eq!(v["transport"], "lease", "{v}");
    let (_, page) = server.http_get("/v1/leases").expect("the leases page");
    let page: serde_json::Value = serde_json::from_str(&page).expect("JSON");
    let r = &page["resources"][0];
    assert_eq!(r["clients"], 20, "{r}");
    // Clients want 1 to 8 each (82 in all): 50 shared, never more.
    assert!(r["leased"].as_f64().is_some_and(|l| l <= 50.0), "{r}");
    assert_eq!(r["wanted"], 82, "{r}");
}

/// `charon bench --mode copies` reserves a copy and releases it on session
/// streams, over two resources taking turns: with a domain limit of one
/// copy and one domain, a copy never released would turn every later
/// reserve into a rejection; and once the bench ends no copy is held.
#[test]
fn bench_copies_reserves_and_releases_over_two_resources() {
    const COPIES: &str = r#"
resources:
  - { name: c/a, kind: copy, domain_limit: 1 }
  - { name: c/b, kind: copy, domain_limit: 1 }
"#;
    let server = CharonProcess::start(bin(), COPIES, &[]);
    let v = bench_json(
        &server.endpoint(),
        &[
            "--mode",
            "copies",
            "--resource",
            "c/a,c/b",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    assert!(count("requests") > 10, "{v}");
    assert_eq!(count("errors"), 0, "{v}");
    assert_eq!(count("granted"), count("requests"), "{v}");
    assert_eq!(v["transport"], "copies", "{v}");
    let (_, metrics) = server.http_get("/metrics").expect("/metrics");
    // Both resources took turns: each granted reserves and released them.
    for resource in ["c/a", "c/b"] {
        for operation in ["reserve", "release"] {
            let series = format!(
                "charon_decisions_total{{operation=\"{operation}\",resource=\"{resource}\",outcome=\"granted\"}}"
            );
            let n: Option<u64> = crate::support::metric_in(&metrics, &series);
            assert!(n.is_some_and(|n| n > 5), "{series}: {metrics}");
        }
    }
    assert_eq!(
        crate::support::metric_in::<f64>(&metrics, "charon_copies_held"),
        Some(0.0),
        "{metrics}"
    );
}

/// `charon client request --dry-run`, `charon client charge` and `charon
/// client refund` against a real server: the reply context printed as
/// `charon simulate` prints it.
#[test]
fn client_commands_dry_run_charge_and_refund() {
    const TOKENS: &str = r#"
resources:
  - { name: tokens, kind: bucket, burst: 10, count: 10, period: 1h }
  - { name: q, kind: queue, rate: 1, period: 1h, size: 5 }
  - { name: api, kind: rate, tiers: [ { limit: 1, window: 1h } ] }
"#;
    let server = CharonProcess::start(bin(), TOKENS, &[]);
    let endpoint = server.endpoint();
    let client = |args: &[&str]| -> (serde_json::Value, Option<i32>) {
        let out = std::process::Command::new(bin())
            .arg("client")
            .args(args)
            .args(["--server", endpoint.as_str()])
            .output()
            .expect("run charon client");
        let line = String::from_utf8_lossy(&out.stdout);
        let v =
            serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {line:?}"));
        (v, out.status.code())
    };
    let (dry, code) = client(&["request", "--dry-run", "--copies", "4", "tokens", "d"]);
    assert_eq!(code, Some(0), "{dry}");
    assert_eq!(
        (dry["granted"].as_u64(), dry["remaining"].as_u64()),
        (Some(4), Some(6)),
        "{dry}"
    );
    assert_eq!(dry["limit"], 10);
    assert_eq!(dry["source"], "server");
    let (charged, _) = client(&["charge", "--copies", "12", "tokens", "d"]);
    assert_eq!(
        (charged["granted"].as_u64(), charged["remaining"].as_u64()),
        (Some(12), Some(0)),
        "the dry run recorded nothing; the charge is never rejected: {charged}"
    );
    assert_eq!(charged["banned"], false);
    let (refunded, _) = client(&["refund", "--copies", "5", "tokens", "d"]);
    assert_eq!(
        (refunded["granted"].as_u64(), refunded["remaining"].as_u64()),
        (Some(5), Some(3)),
        "{refunded}"
    );
    let (queued, _) = client(&["request", "q", "d"]);
    assert_eq!(queued["delay_ms"], 0, "{queued}");
    let (bad, code) = client(&["refund", "q", "d"]);
    assert_eq!(code, Some(1), "a client error: {bad}");
    assert_eq!(bad["error"], "client", "{bad}");
    // Burst tiers: their own fields, then the reply context.
    let (tiers, _) = client(&["request", "api", "d"]);
    assert_eq!(
        (
            &tiers["granted"],
            &tiers["tier"],
            &tiers["tier_limit"],
            &tiers["burst"]
        ),
        (&json!(1), &json!(1), &json!(1), &json!(true)),
        "{tiers}"
    );
    assert_eq!(
        (&tiers["limit"], &tiers["remaining"]),
        (&json!(1), &json!(0)),
        "{tiers}"
    );
    let (dry, _) = client(&["request", "--dry-run", "api", "d"]);
    assert_eq!(
        (&dry["granted"], &dry["source"]),
        (&json!(0), &json!("server")),
        "{dry}"
    );
    assert!(
        dry["retry_after_ms"]
            .as_u64()
            .is_some_and(|t| t > 3_000_000),
        "{dry}"
    );
    let (charged, _) = client(&["charge", "api", "d"]);
    assert_eq!(
        (&charged["granted"], &charged["tier_hits"]),
        (&json!(1), &json!(2)),
        "{charged}"
    );
}
