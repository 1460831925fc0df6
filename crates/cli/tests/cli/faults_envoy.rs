//! Envoy's all-or-nothing `ShouldRateLimit` batch (SPEC §11) under Redis
//! faults, on a real `charon serve --store redis://…` process and a private
//! Redis: Redis stalled (SIGSTOP) for less than the store timeout, for
//! longer than it, and Redis back empty (FLUSHALL, and a restart without
//! persistence). Every call carries two descriptors on two different limits
//! (a configured window and an inline limit), so each one is a batch of two
//! meters in one script, and "both or neither" can be checked after the
//! fault: the two counts must always be equal.
//!
//! Counts are read through the protocol itself: a dry run (`hits_addend:
//! 0`) answers `limit_remaining` as if one hit were granted, and records
//! nothing.
//!
//! `--nocapture` shows one `FAULT` line per test: what was injected, what
//! was expected and what was observed.

use std::time::{Duration, Instant};

use crate::support::{bin, redis_cli};
use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use charon_testkit::{CharonProcess, RedisServer};
use tonic::transport::Channel;

/// Both limits are per day, so nothing refills while a test runs.
const LIMIT: u64 = 1000;
const CONFIG: &str = r#"
resources:
  - { name: api/login, kind: window, algorithm: fixed, limit: 1000, window: 1d }
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: user
          resource: api/login
        - key: plan
          rate_limit: { unit: day, requests_per_unit: 1000 }
"#;

/// What an answer may take beyond the store timeout on this loaded machine
/// (a hang would take far longer): a guard, not a measure of speed.
const ANSWER_MARGIN: Duration = Duration::from_secs(5);

/// A server on a private Redis with `--store-timeout store_timeout`.
fn start(store_timeout: &str) -> (RedisServer, CharonProcess) {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = CharonProcess::start(
        bin(),
        CONFIG,
        &["--store", url.as_str(), "--store-timeout", store_timeout],
    );
    (redis, server)
}

async fn client(server: &CharonProcess) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.endpoint())
        .await
        .expect("connect")
}

fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        hits_addend: hits,
        ..RateLimitDescriptor::default()
    }
}

/// One call of `hits` (default 1) on `user=ann` and `plan=gold`: one batch
/// of two meters. Guarded against a hang by `guard`.
async fn call(
    c: &mut RateLimitServiceClient<Channel>,
    hits: Option<u64>,
    guard: Duration,
) -> Result<RateLimitResponse, tonic::Status> {
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            descriptor("user", "ann", hits),
            descriptor("plan", "gold", hits),
        ],
        hits_addend: 0,
    };
    tokio::time::timeout(guard, c.should_rate_limit(request))
        .await
        .unwrap_or_else(|_| panic!("no answer within {guard:?}: a hang"))
        .map(tonic::Response::into_inner)
}

/// What a call came to: `ok`, `over_limit` or the gRPC status code.
fn outcome(r: &Result<RateLimitResponse, tonic::Status>) -> String {
    match r {
        Ok(r) if r.overall_code == Code::Ok as i32 => "ok".to_owned(),
        Ok(r) if r.overall_code == Code::OverLimit as i32 => "over_limit".to_owned(),
        Ok(r) => format!("overall_code {}", r.overall_code),
        Err(s) => format!("{:?}", s.code()),
    }
}

/// The counts of `user=ann` and `plan=gold`, read by a dry run.
async fn counts(c: &mut RateLimitServiceClient<Channel>, guard: Duration) -> (u64, u64) {
    let r = call(c, Some(0), guard).await.expect("a dry run answers");
    assert_eq!(r.statuses.len(), 2, "{r:?}");
    let count = |i: usize| {
        let s = &r.statuses[i];
        assert_eq!(s.code, Code::Ok as i32, "a dry run within the limit: {r:?}");
        LIMIT - 1 - u64::from(s.limit_remaining)
    };
    (count(0), count(1))
}

/// Server errors the server counted for Envoy calls.
fn server_errors(server: &CharonProcess) -> u64 {
    let metrics = server.http_get("/metrics").map(|m| m.1).unwrap_or_default();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("charon_envoy_errors_total{class=\"server\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The server still runs and never panicked.
fn still_up(server: &mut CharonProcess, what: &str) {
    assert!(
        server.wait_exit(Duration::ZERO).is_none(),
        "{what}: the server stopped:\n{}",
        server.log()
    );
    assert!(
        !server.log().contains("panicked"),
        "{what}:\n{}",
        server.log()
    );
}

/// (a) Redis stalls for less than the store timeout while calls are in
/// flight: every call is answered as if nothing happened (never
/// UNAVAILABLE), and afterwards the counts are exactly the calls made: no
/// call lost, none counted twice (a retry of a script that did run would
/// count it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_shorter_than_the_timeout_answers_normally_and_counts_exactly() {
    let store_timeout = Duration::from_secs(3);
    let guard = store_timeout + ANSWER_MARGIN;
    let (redis, mut server) = start("3s");
    let mut c = client(&server).await;
    for _ in 0..10 {
        assert_eq!(outcome(&call(&mut c, None, guard).await), "ok");
    }
    assert_eq!(counts(&mut c, guard).await, (10, 10));

    let in_flight = 20;
    redis.stop();
    let calls: Vec<_> = (0..in_flight)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move { outcome(&call(&mut c, None, guard).await) })
        })
        .collect();
    let stall = Duration::from_millis(500);
    tokio::time::sleep(stall).await; // the fault itself
    redis.resume();
    let mut answers = Vec::new();
    for t in calls {
        answers.push(t.await.expect("a call task"));
    }
    let after = counts(&mut c, guard).await;
    println!(
        "FAULT envoy-redis-stall-short: injected SIGSTOP of Redis for {stall:?} (store timeout \
         {store_timeout:?}) with {in_flight} two-descriptor calls in flight; expected every call \
         ok and the counts exactly 10 + {in_flight} on both limits; observed answers {answers:?}, \
         counts {after:?}, {} server errors counted",
        server_errors(&server)
    );
    assert!(answers.iter().all(|a| a == "ok"), "{answers:?}");
    assert_eq!(
        after,
        (10 + in_flight, 10 + in_flight),
        "nothing lost, nothing doubled"
    );
    assert_eq!(server_errors(&server), 0);
    still_up(&mut server, "stall-short");
}

/// (b) Redis stalls for longer than the store timeout: calls are answered
/// UNAVAILABLE (class `server`) within the timeout and a margin, never a
/// hang; once Redis resumes, the server decides again. A call answered
/// UNAVAILABLE may still have been recorded (its script was sent and ran
/// once Redis resumed: docs/envoy.md, "Failure"), but never half of it:
/// the two counts stay equal, at least every call answered OK and at most
/// every call made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_longer_than_the_timeout_is_unavailable_then_serves_again() {
    let store_timeout = Duration::from_millis(500);
    let guard = store_timeout + ANSWER_MARGIN;
    let (redis, mut server) = start("500ms");
    let mut c = client(&server).await;
    let mut ok = 0;
    for _ in 0..5 {
        assert_eq!(outcome(&call(&mut c, None, guard).await), "ok");
        ok += 1;
    }

    redis.stop();
    let stalled_at = Instant::now();
    let mut during = Vec::new();
    for _ in 0..4 {
        let r = call(&mut c, None, guard).await;
        if let Err(s) = &r {
            assert_eq!(
                s.metadata()
                    .get("charon-error-class")
                    .and_then(|v| v.to_str().ok()),
                Some("server"),
                "{s:?}"
            );
        }
        during.push(outcome(&r));
    }
    let stalled_for = stalled_at.elapsed();
    redis.resume();
    assert!(
        during.iter().all(|a| a == "Unavailable"),
        "every call during the stall: {during:?}"
    );

    // Serving again: the first calls after the resume may still meet the
    // tail of the stall; within a few, every call is decided.
    let mut after = Vec::new();
    for _ in 0..20 {
        let a = outcome(&call(&mut c, None, guard).await);
        let decided = a == "ok";
        after.push(a);
        if decided {
            break;
        }
    }
    for _ in 0..5 {
        after.push(outcome(&call(&mut c, None, guard).await));
    }
    ok += after.iter().filter(|a| *a == "ok").count();
    let made = 5 + during.len() + after.len();
    let (user, plan) = counts(&mut c, guard).await;
    println!(
        "FAULT envoy-redis-stall-long: injected SIGSTOP of Redis for {stalled_for:?} (store \
         timeout {store_timeout:?}) during 4 sequential two-descriptor calls; expected \
         Unavailable for each, then decisions again, both counts equal and between the calls \
         answered ok and the calls made; observed {during:?}, then {after:?}; counts \
         user={user} plan={plan} for {ok} ok of {made} calls ({} of the calls answered \
         Unavailable were recorded once Redis resumed)",
        user.saturating_sub(u64::try_from(ok).expect("small")),
    );
    assert_eq!(after.last().map(String::as_str), Some("ok"), "{after:?}");
    assert!(
        after.iter().skip_while(|a| *a != "ok").all(|a| a == "ok"),
        "once decided again, every call: {after:?}"
    );
    assert_eq!(user, plan, "a batch is recorded whole or not at all");
    let (ok, made) = (
        u64::try_from(ok).expect("small"),
        u64::try_from(made).expect("small"),
    );
    assert!(ok <= user && user <= made, "{ok} <= {user} <= {made}");
    still_up(&mut server, "stall-long");
}

/// Spends both limits whole: the next call is over.
async fn spend(c: &mut RateLimitServiceClient<Channel>, guard: Duration) {
    assert_eq!(outcome(&call(c, Some(LIMIT), guard).await), "ok");
    assert_eq!(outcome(&call(c, None, guard).await), "over_limit");
}

/// (c) Redis loses its data (FLUSHALL) under a running server: the next
/// calls are answered, from zero (lenient: the spent limits are fresh
/// again), with no error at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redis_counts_again_from_zero_without_errors() {
    let guard = Duration::from_secs(1) + ANSWER_MARGIN;
    let (redis, mut server) = start("1s");
    let mut c = client(&server).await;
    spend(&mut c, guard).await;
    assert_eq!(redis_cli(&redis, &["FLUSHALL"]).trim(), "OK");
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(outcome(&call(&mut c, None, guard).await));
    }
    let after = counts(&mut c, guard).await;
    println!(
        "FAULT envoy-redis-flushall: injected FLUSHALL with both limits spent; expected every \
         call ok and counts from zero, no server error; observed {answers:?}, counts {after:?}, \
         {} server errors counted",
        server_errors(&server)
    );
    assert!(answers.iter().all(|a| a == "ok"), "{answers:?}");
    assert_eq!(after, (5, 5));
    assert_eq!(server_errors(&server), 0);
    still_up(&mut server, "flushall");
}

/// (c) Redis killed and started again without persistence (empty, its
/// scripts forgotten) under a running server: calls while it is down are
/// answered UNAVAILABLE (never a hang); once it is back, at most a few
/// calls meet the broken connection, then every call is decided, counting
/// from zero; the server never stops or panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_counts_again_from_zero_without_an_error_storm() {
    let guard = Duration::from_secs(1) + ANSWER_MARGIN;
    let (mut redis, mut server) = start("1s");
    let mut c = client(&server).await;
    spend(&mut c, guard).await;

    tokio::task::block_in_place(|| redis.kill());
    let mut down = Vec::new();
    for _ in 0..3 {
        down.push(outcome(&call(&mut c, None, guard).await));
    }
    tokio::task::block_in_place(|| redis.restart());
    let errors_before = server_errors(&server);

    let mut back = Vec::new();
    for _ in 0..10 {
        let a = outcome(&call(&mut c, None, guard).await);
        let decided = a == "ok";
        back.push(a);
        if decided {
            break;
        }
    }
    for _ in 0..4 {
        back.push(outcome(&call(&mut c, None, guard).await));
    }
    let failed = back.iter().filter(|a| *a != "ok").count();
    let ok = u64::try_from(back.len() - failed).expect("small");
    let (user, plan) = counts(&mut c, guard).await;
    let errors_after = server_errors(&server) - errors_before;
    println!(
        "FAULT envoy-redis-restart-empty: injected SIGKILL of Redis with both limits spent, 3 \
         calls while it was down, then a restart without data on the same port; expected \
         Unavailable while down, at most 2 failed calls once it is back, then every call ok \
         counting from zero; observed while down {down:?}, after the restart {back:?}, counts \
         user={user} plan={plan}, {errors_after} server errors counted after the restart"
    );
    assert!(down.iter().all(|a| a == "Unavailable"), "{down:?}");
    assert!(failed <= 2, "an error storm after the restart: {back:?}");
    assert!(
        back.iter().skip_while(|a| *a != "ok").all(|a| a == "ok"),
        "once decided again, every call: {back:?}"
    );
    assert_eq!(back.last().map(String::as_str), Some("ok"), "{back:?}");
    // A call that failed on the dead connection never reached the new
    // Redis; if one did, it was recorded whole.
    assert_eq!(user, plan, "a batch is recorded whole or not at all");
    let made = ok + u64::try_from(failed).expect("small");
    assert!(
        ok <= user && user <= made,
        "{ok} <= {user} <= {made}: from zero"
    );
    assert_eq!(errors_after, u64::try_from(failed).expect("small"));
    still_up(&mut server, "restart-empty");
}
