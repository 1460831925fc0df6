//! The Rust client's session stream against a `charon serve` process that
//! is stopped (SIGSTOP: operations stay in flight, unanswered) and killed
//! or let go: what in-flight callers get, that the next call opens a new
//! session, and that the bound on operations in flight holds while the
//! server does not answer. Also `charon bench --mode session`.

use crate::support::{assert_percentiles_ordered, bench_json, bin};

use std::time::{Duration, Instant};

use charon_client::{Client, ClientOptions, Error, RateGrant, Source};
use charon_testkit::CharonProcess;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 1000, window: 1h } ]
"#;

fn client(server: &CharonProcess, fail_open: bool, max_in_flight: usize) -> Client {
    let mut o = ClientOptions::new(server.endpoint());
    o.fail_open = fail_open;
    // Longer than the test needs: a caller that fails did not time out.
    o.request_timeout = Duration::from_secs(60);
    o.max_in_flight = max_in_flight;
    Client::connect(o).expect("client")
}

/// Starts `n` requests of one hit each from `n` tasks.
fn start_requests(
    c: &Client,
    domain: &str,
    n: usize,
) -> tokio::task::JoinSet<Result<RateGrant, Error>> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (c, domain) = (c.clone(), domain.to_owned());
        set.spawn(async move { c.request("api", domain).send().await });
    }
    set
}

/// Waits until `c` has `n` operations in flight.
async fn until_in_flight(c: &Client, n: u64, server: &CharonProcess) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.stats().in_flight != n {
        assert!(
            Instant::now() < deadline,
            "never {n} in flight: {:?}; the server (pid {}): {:?}",
            c.stats(),
            server.pid(),
            std::fs::read_to_string(format!("/proc/{}/stat", server.pid())),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_mid_flight_fails_its_callers_and_the_next_call_reopens() {
    let mut server = CharonProcess::start(bin(), LIMITS, &[]);
    let strict = client(&server, false, 256);
    let open = client(&server, true, 256);
    // Both sessions are open and decide.
    for c in [&strict, &open] {
        let g = c.request("api", "d").send().await.expect("answer");
        assert_eq!((g.granted, g.source), (1, Source::Server));
    }
    // The server stops answering with 20 requests of each client on the
    // wire, then dies.
    server.signal("STOP");
    let mut strict_calls = start_requests(&strict, "d", 20);
    let mut open_calls = start_requests(&open, "d", 20);
    until_in_flight(&strict, 20, &server).await;
    until_in_flight(&open, 20, &server).await;
    tokio::task::block_in_place(|| server.kill());
    // Every in-flight caller hears of it: a server error (not a time-out),
    // or a degraded grant when failing open. None is sent again.
    while let Some(r) = strict_calls.join_next().await {
        match r.expect("a task") {
            Err(e) if e.is_server() => assert!(!e.message().contains("in time"), "{e}"),
            other => panic!("a server error, not {other:?}"),
        }
    }
    while let Some(r) = open_calls.join_next().await {
        let g = r.expect("a task").expect("degraded");
        assert_eq!((g.granted, g.source), (1, Source::Degraded));
    }
    assert_eq!(strict.stats().server_errors, 20);
    assert_eq!(open.stats().degraded_grants, 20);
    assert_eq!(strict.stats().in_flight, 0);
    // The server comes back (a fresh in-memory store): the next call opens
    // a new session and is decided by the server.
    tokio::task::block_in_place(|| server.restart());
    for c in [&strict, &open] {
        let g = c
            .request("api", "d")
            .copies(3)
            .send()
            .await
            .expect("answer");
        assert_eq!((g.granted, g.source), (3, Source::Server));
    }
    // Pipelined again: 100 at once, every one decided exactly.
    let mut calls = start_requests(&strict, "e", 100);
    let mut granted = 0;
    while let Some(r) = calls.join_next().await {
        let g = r.expect("a task").expect("answer");
        assert_eq!(g.source, Source::Server);
        granted += g.granted;
    }
    assert_eq!(granted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_on_operations_in_flight_holds_while_the_server_is_stopped() {
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let c = client(&server, false, 4);
    assert!(c.request("api", "d").send().await.expect("ok").is_granted());
    server.signal("STOP");
    let mut calls = start_requests(&c, "d", 40);
    until_in_flight(&c, 4, &server).await;
    // Give the 36 others every chance to get on the wire: none does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = c.stats();
    assert_eq!((stats.in_flight, stats.peak_in_flight), (4, 4), "{stats:?}");
    server.signal("CONT");
    let mut granted = 0;
    while let Some(r) = calls.join_next().await {
        granted += r.expect("a task").expect("answer").granted;
    }
    assert_eq!(granted, 40);
    assert_eq!(c.stats().peak_in_flight, 4);
}

#[test]
fn bench_drives_session_streams() {
    const BENCH: &str = r#"
resources:
  - { name: bench/api, kind: rate, tiers: [ { limit: 300, window: 1h } ] }
"#;
    let server = CharonProcess::start(bin(), BENCH, &[]);
    let pid = server.pid().to_string();
    let v = bench_json(
        &server.endpoint(),
        &[
            "--mode",
            "session",
            "--domains",
            "1",
            "--connections",
            "2",
            "--concurrency",
            "8",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--server-pid",
            &pid,
        ],
    );
    assert_eq!(v["transport"], "session", "{v}");
    assert!(v["requests"].as_u64().is_some_and(|n| n > 300), "{v}");
    // One domain, 300 hits an hour: the warm-up took some, and no more
    // than 300 in all were granted.
    let granted = v["granted"].as_u64().expect("granted");
    assert!(granted <= 300, "{v}");
    assert!(v["rejected"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_percentiles_ordered(&v);
    // The server used some CPU on them; no Redis was asked about.
    assert!(
        v["server_cpu_us_per_decision"]
            .as_f64()
            .is_some_and(|us| us > 0.0),
        "{v}"
    );
    assert!(v["redis_commands_per_decision"].is_null(), "{v}");
    // --envoy is unary only.
    let refused = std::process::Command::new(bin())
        .args(["bench", "--server", &server.endpoint(), "--mode", "session"])
        .args(["--envoy", "x", "--duration", "1s"])
        .output()
        .expect("run bench");
    assert!(!refused.status.success());
}

#[test]
fn bench_reports_redis_commands_and_cpu_per_decision() {
    const BENCH: &str = r#"
resources:
  - { name: bench/api, kind: rate, tiers: [ { limit: 1000000, window: 1h } ] }
"#;
    let redis = charon_testkit::RedisServer::start();
    let url = redis.url();
    let server = CharonProcess::start(bin(), BENCH, &["--store", url.as_str()]);
    for mode in ["unary", "session"] {
        let v = bench_json(
            &server.endpoint(),
            &[
                "--mode",
                mode,
                "--domains",
                "10",
                "--concurrency",
                "4",
                "--duration",
                "1s",
                "--warmup",
                "200ms",
                "--redis",
                url.as_str(),
            ],
        );
        assert_eq!(v["transport"], mode, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        assert!(v["granted"].as_u64().is_some_and(|n| n > 100), "{v}");
        // Every decision is at least one script call on Redis. (The
        // server's own background commands, membership and the like, are
        // counted too: at the few hundred decisions a second of a debug
        // build they weigh, so there is no upper bound to check here.)
        let per = v["redis_commands_per_decision"].as_f64().expect("measured");
        assert!(per >= 1.0, "{v}");
        assert!(
            v["redis_cpu_us_per_decision"]
                .as_f64()
                .is_some_and(|us| us >= 0.0),
            "{v}"
        );
        assert!(v["server_cpu_us_per_decision"].is_null(), "{v}");
    }
}

/// Batched Redis decisions through the binary (`--redis-max-batch`, see
/// docs/redis.md): 128 requests in flight on one bucket pair of 300 per
/// hour, for a second, on a private Redis, with batching (the default) and
/// without (`--redis-max-batch 1`): exactly 300 granted either way, no
/// error. A batch of 0 is refused at the command line.
#[test]
fn batched_redis_decisions_through_the_binary_are_exact() {
    const LIMITS: &str = r#"
resources:
  - { name: bench/api, kind: bucket, burst: 300, count: 300, period: 1h }
"#;
    for batch in ["128", "1"] {
        let redis = charon_testkit::RedisServer::start();
        let url = redis.url();
        let server = CharonProcess::start(
            bin(),
            LIMITS,
            &["--store", url.as_str(), "--redis-max-batch", batch],
        );
        let v = bench_json(
            &server.endpoint(),
            &[
                "--resource",
                "bench/api",
                "--domains",
                "1",
                "--connections",
                "2",
                "--concurrency",
                "64",
                "--duration",
                "1s",
                "--warmup",
                "0s",
            ],
        );
        assert_eq!(v["errors"], 0, "batch {batch}: {v}");
        assert_eq!(v["granted"], 300, "batch {batch}: {v}");
        assert!(v["rejected"].as_u64().is_some_and(|n| n > 0), "{v}");
    }
    let refused = std::process::Command::new(bin())
        .args(["serve", "--redis-max-batch", "0"])
        .output()
        .expect("run serve");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--redis-max-batch"));
}
