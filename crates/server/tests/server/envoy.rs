//! Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//! (SPEC §11) through a real tonic client against an in-process server,
//! in the in-memory store and in the Redis store (a private Redis): value
//! and value-less nodes, IPv6 /48 masking, `hits_addend`, dry runs, all or
//! nothing across descriptors, shadow mode, `unlimited`, headers,
//! statuses, metrics, `UNAVAILABLE` with Redis stopped, bad input, no
//! `envoy:` section, health. Limits are per hour or per day, so nothing
//! refills while a test runs.

use std::time::Duration;

use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use charon_testkit::{InProcessServer, RedisServer};
use tonic::transport::Channel;

mod peers;

const CONFIG: &str = r#"
resources:
  - { name: api/search, kind: bucket, burst: 3, count: 3, period: 1h }
  - { name: api/login, kind: window, algorithm: fixed, limit: 2, window: 1d, soft_limit: 50% }
  - { name: api/tiers, kind: rate, tiers: [ { limit: 5, window: 10s } ] }
  - name: api/burst
    kind: rate
    hard_limit: 100
    tiers:
      - { limit: 2, window: 1h }
      - { limit: 1, window: 1h, active: 1h, cooldown: 1h }
envoy:
  headers: true
  domains:
    - domain: edge
      descriptors:
        - key: generic_key
          value: search
          descriptors:
            - key: remote_address
              mask: {}
              resource: api/search
        - key: user
          resource: api/login
        - key: tenant
          rate_limit: { unit: day, requests_per_unit: 2 }
          shadow_mode: true
        - key: plan
          rate_limit: { unit: day, requests_per_unit: 1 }
        - key: health
          unlimited: true
        - key: tiers
          resource: api/tiers
        - key: burst
          resource: api/burst
"#;

/// A server on `config` in the named store; the Redis server is kept
/// alive beside it.
async fn server(config: &str, store: &str) -> (InProcessServer, Option<RedisServer>) {
    match store {
        "memory" => (InProcessServer::start(config).await, None),
        _ => {
            let redis = RedisServer::start();
            let server = InProcessServer::start_with_store(config, &redis.url()).await;
            (server, Some(redis))
        }
    }
}

async fn client(server: &InProcessServer) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.endpoint())
        .await
        .expect("connect")
}

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        hits_addend: hits,
        ..RateLimitDescriptor::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn call(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r)
        .await
        .expect("an answer")
        .into_inner()
}

/// One descriptor, one call: its status.
async fn one(
    c: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
    hits: Option<u64>,
) -> DescriptorStatus {
    let r = call(c, request(vec![descriptor(entries, hits)])).await;
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.overall_code, r.statuses[0].code, "one descriptor: {r:?}");
    r.statuses[0].clone()
}

fn ok(s: &DescriptorStatus) -> bool {
    s.code == Code::Ok as i32
}

fn over(s: &DescriptorStatus) -> bool {
    s.code == Code::OverLimit as i32
}

const STORES: [&str; 2] = ["memory", "redis"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_less_keys_mask_ipv6_to_48_and_statuses_carry_the_limit() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        // Three addresses of one /48 share the bucket of 3.
        for (i, addr) in [
            "2001:db8:abcd:1::1",
            "2001:db8:abcd:2::2",
            "2001:db8:abcd:3::3",
        ]
        .iter()
        .enumerate()
        {
            let st = one(
                &mut c,
                &[("generic_key", "search"), ("remote_address", addr)],
                None,
            )
            .await;
            assert!(ok(&st), "{store}: {addr}: {st:?}");
            assert_eq!(st.limit_remaining, 2 - u32::try_from(i).expect("small"));
            let limit = st.current_limit.as_ref().expect("a limit");
            assert_eq!(limit.name, "api/search");
            assert_eq!(limit.requests_per_unit, 3);
            assert!(st.duration_until_reset.is_some());
        }
        let st = one(
            &mut c,
            &[
                ("generic_key", "search"),
                ("remote_address", "2001:db8:abcd:ffff::9"),
            ],
            None,
        )
        .await;
        assert!(over(&st), "{store}: the /48 is spent: {st:?}");
        // Another /48, and an IPv4 address, have their own buckets.
        for addr in ["2001:db8:abce::1", "203.0.113.7"] {
            let st = one(
                &mut c,
                &[("generic_key", "search"), ("remote_address", addr)],
                None,
            )
            .await;
            assert!(ok(&st), "{store}: {addr}: {st:?}");
        }
        // An invalid address is limited by its text, never an error.
        let st = one(
            &mut c,
            &[("generic_key", "search"), ("remote_address", "not-an-ip")],
            None,
        )
        .await;
        assert!(ok(&st), "{store}: {st:?}");
        // A value the tree does not know is not limited.
        let st = one(
            &mut c,
            &[("generic_key", "other"), ("remote_address", "203.0.113.7")],
            None,
        )
        .await;
        assert!(ok(&st) && st.current_limit.is_none(), "{store}: {st:?}");
        // Inline limits report their unit.
        let st = one(&mut c, &[("plan", "gold")], None).await;
        let limit = st.current_limit.expect("a limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (1, Unit::Day as i32));
        // (an inline limit without a `name` has none, as in
        // envoyproxy/ratelimit; a configured resource is named by it)
        assert_eq!(limit.name, "");
        // The window of a day reports its unit too.
        let st = one(&mut c, &[("user", "zed")], None).await;
        let limit = st.current_limit.expect("a limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (2, Unit::Day as i32));
        let metrics = charon_testkit::http_get(s.http.port(), "/metrics")
            .expect("metrics")
            .1;
        assert!(
            metrics.contains("charon_envoy_invalid_addresses_total{domain=\"edge\""),
            "{store}"
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_and_dry_runs() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        // The descriptor's own hits_addend: 2 of 2.
        let st = one(&mut c, &[("user", "alice")], Some(2)).await;
        assert!(ok(&st) && st.limit_remaining == 0, "{store}: {st:?}");
        assert!(over(&one(&mut c, &[("user", "alice")], None).await));
        // The request's hits_addend when the descriptor has none.
        let mut r = request(vec![descriptor(&[("user", "bob")], None)]);
        r.hits_addend = 2;
        let st = call(&mut c, r).await.statuses[0].clone();
        assert!(ok(&st) && st.limit_remaining == 0, "{store}: {st:?}");
        // More than the limit at once is over, whole or nothing: nothing
        // is granted, and the next single hit still fits.
        assert!(over(&one(&mut c, &[("user", "carl")], Some(3)).await));
        assert!(ok(&one(&mut c, &[("user", "carl")], Some(2)).await));
        // hits_addend 0 is a dry run: answered as if granted, recorded
        // never.
        for _ in 0..3 {
            let st = one(&mut c, &[("user", "carol")], Some(0)).await;
            assert!(ok(&st) && st.limit_remaining == 1, "{store}: {st:?}");
        }
        let st = one(&mut c, &[("user", "carol")], Some(2)).await;
        assert!(ok(&st), "{store}: the dry runs recorded nothing: {st:?}");
        // A dry run on a spent limit is over.
        assert!(over(&one(&mut c, &[("user", "carol")], Some(0)).await));
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_descriptor_over_records_nothing_for_the_others() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        assert!(ok(&one(&mut c, &[("plan", "p1")], None).await));
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("user", "dave")], None),
                descriptor(
                    &[("generic_key", "search"), ("remote_address", "10.0.0.1")],
                    None,
                ),
                descriptor(&[("health", "x")], None),
                descriptor(&[("plan", "p1")], None),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}: {r:?}");
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        let (o, x) = (Code::Ok as i32, Code::OverLimit as i32);
        assert_eq!(
            codes,
            [o, o, o, x],
            "{store}: one status per descriptor, in order"
        );
        assert_eq!(r.statuses[0].limit_remaining, 1, "as decided in the batch");
        assert!(r.statuses[2].current_limit.is_none(), "unlimited");
        // Headers: the tightest limit, and Retry-After when over.
        let headers: Vec<(&str, &str)> = r
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        for name in [
            "RateLimit-Limit",
            "RateLimit-Remaining",
            "RateLimit-Reset",
            "Retry-After",
        ] {
            assert!(
                headers.iter().any(|(k, _)| *k == name),
                "{store}: {name} in {headers:?}"
            );
        }
        assert!(
            headers.contains(&("RateLimit-Remaining", "0")),
            "{headers:?}"
        );
        // Nothing was recorded for dave nor for 10.0.0.1.
        let st = one(&mut c, &[("user", "dave")], Some(2)).await;
        assert!(ok(&st), "{store}: dave's hit was not recorded: {st:?}");
        let st = one(
            &mut c,
            &[("generic_key", "search"), ("remote_address", "10.0.0.1")],
            Some(3),
        )
        .await;
        assert!(ok(&st), "{store}: 10.0.0.1's hit was not recorded: {st:?}");
        // Two descriptors on one limit in one call count together.
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("user", "eve")], None),
                descriptor(&[("user", "eve")], None),
                descriptor(&[("user", "eve")], None),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}: {r:?}");
        assert!(
            ok(&one(&mut c, &[("user", "eve")], Some(2)).await),
            "{store}"
        );
        // Within limits, no Retry-After.
        let r = call(&mut c, request(vec![descriptor(&[("user", "fay")], None)])).await;
        assert!(
            r.response_headers_to_add
                .iter()
                .all(|h| h.key != "Retry-After")
        );
        s.stop().await;
    }
}

/// A descriptor whose node names a `kind: rate` resource is limited by its
/// burst tiers, inside the all-or-nothing batch: over on the tiers records
/// nothing on a bucket under its limit, and the reverse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_tiers_descriptors_are_limited_and_all_or_nothing() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        let burst = |v: &str, hits| descriptor(&[("burst", v)], hits);
        let search =
            |ip: &str| descriptor(&[("generic_key", "search"), ("remote_address", ip)], None);
        // Tier 1 (2 an hour), then a burst into tier 2 (1 more), then over.
        let st = one(&mut c, &[("burst", "a")], Some(2)).await;
        assert!(ok(&st), "{store}: {st:?}");
        let limit = st.current_limit.clone().expect("a limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("api/burst", 2, Unit::Hour as i32),
            "{store}: the tier that decided, its window an hour: {st:?}"
        );
        assert_eq!(st.limit_remaining, 1, "{store}: the burst is still open");
        let st = one(&mut c, &[("burst", "a")], None).await;
        assert!(ok(&st), "{store}: burst into tier 2: {st:?}");
        assert_eq!(
            st.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(1),
            "{store}: tier 2 decided: {st:?}"
        );
        assert_eq!(st.limit_remaining, 0);
        let st = one(&mut c, &[("burst", "a")], None).await;
        assert!(over(&st), "{store}: both tiers full: {st:?}");
        // Over on the tiers: the bucket under its limit records nothing.
        let r = call(&mut c, request(vec![search("10.9.0.1"), burst("a", None)])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}: {r:?}");
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [Code::Ok as i32, Code::OverLimit as i32], "{store}");
        assert!(
            r.response_headers_to_add
                .iter()
                .any(|h| h.key == "Retry-After"),
            "{store}: {r:?}"
        );
        let st = one(
            &mut c,
            &[("generic_key", "search"), ("remote_address", "10.9.0.1")],
            Some(3),
        )
        .await;
        assert!(ok(&st), "{store}: the bucket kept all 3: {st:?}");
        // The reverse: over on the bucket, the tiers under theirs record
        // nothing (b's two hits of tier 1 are still there afterwards).
        let r = call(
            &mut c,
            request(vec![burst("b", Some(2)), search("10.9.0.1")]),
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}: {r:?}");
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [Code::Ok as i32, Code::OverLimit as i32], "{store}");
        let st = one(&mut c, &[("burst", "b")], Some(2)).await;
        assert!(ok(&st), "{store}: b's hits were not recorded: {st:?}");
        assert_eq!(
            st.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(2),
            "{store}: still in tier 1: {st:?}"
        );
        // A dry run (cost 0) on full tiers is over, and records nothing.
        let st = one(&mut c, &[("burst", "c")], Some(0)).await;
        assert!(ok(&st), "{store}: {st:?}");
        assert!(over(&one(&mut c, &[("burst", "a")], Some(0)).await));
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_records_and_answers_ok_and_unlimited_touches_nothing() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        let remaining: Vec<u32> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                let st = one(&mut c, &[("tenant", "acme")], None).await;
                assert!(ok(&st), "{store}: shadowed: {st:?}");
                v.push(st.limit_remaining);
            }
            v
        };
        assert_eq!(remaining, [1, 0, 0], "{store}: recorded");
        // A shadowed descriptor over its limit does not stop the others.
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("tenant", "acme")], None),
                descriptor(&[("user", "gus")], Some(2)),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        assert!(
            over(&one(&mut c, &[("user", "gus")], None).await),
            "{store}: gus recorded"
        );
        for _ in 0..5 {
            let st = one(&mut c, &[("health", "ok")], Some(1000)).await;
            assert!(ok(&st) && st.current_limit.is_none(), "{store}: {st:?}");
        }
        let metrics = charon_testkit::http_get(s.http.port(), "/metrics")
            .expect("metrics")
            .1;
        for name in [
            "charon_envoy_shadow_total{domain=\"edge\",node=\"envoy/edge/tenant\"}",
            "charon_envoy_over_limit_total{domain=\"edge\",node=\"envoy/edge/user\"}",
            "charon_envoy_near_limit_total{domain=\"edge\",node=\"envoy/edge/user\"}",
            "charon_envoy_descriptors_total{domain=\"edge\",node=\"envoy/edge/health\"}",
        ] {
            assert!(metrics.contains(name), "{store}: {name} in\n{metrics}");
        }
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument_and_records_nothing() {
    for store in STORES {
        let (s, _redis) = server(CONFIG, store).await;
        let mut c = client(&s).await;
        let long = "v".repeat(2000);
        let many: Vec<RateLimitDescriptor> = (0..10_000)
            .map(|_| descriptor(&[("user", "hal")], None))
            .collect();
        let mut unknown = request(vec![descriptor(&[("user", "hal")], None)]);
        unknown.domain = "nowhere".to_owned();
        let mut empty_domain = request(vec![descriptor(&[("user", "hal")], None)]);
        empty_domain.domain = String::new();
        let user = || descriptor(&[("user", "hal")], None);
        let cases: Vec<(&str, RateLimitRequest)> = vec![
            ("no descriptors", request(vec![])),
            (
                "an empty key",
                request(vec![user(), descriptor(&[("", "x")], None)]),
            ),
            (
                "an empty value",
                request(vec![user(), descriptor(&[("user", "")], None)]),
            ),
            (
                "a long value",
                request(vec![user(), descriptor(&[("user", &long)], None)]),
            ),
            (
                "a long key",
                request(vec![user(), descriptor(&[(&long, "x")], None)]),
            ),
            ("no entries", request(vec![user(), descriptor(&[], None)])),
            ("10,000 descriptors", request(many)),
            ("an empty domain", empty_domain),
            (
                "hits_addend 2^64 - 1",
                request(vec![user(), descriptor(&[("user", "hal")], Some(u64::MAX))]),
            ),
        ];
        for (what, r) in cases {
            let e = c.should_rate_limit(r).await.expect_err(what);
            assert_eq!(
                e.code(),
                tonic::Code::InvalidArgument,
                "{store}: {what}: {e:?}"
            );
        }
        // An unknown domain is OK by default (`unknown_domain: ok`), as in
        // envoyproxy/ratelimit and Limitador: nothing applies to it.
        let r = call(&mut c, unknown.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        assert_eq!(r.statuses.len(), 1);
        assert!(r.statuses[0].current_limit.is_none());
        // Nothing was recorded for hal, and the server still serves.
        let st = one(&mut c, &[("user", "hal")], Some(2)).await;
        assert!(ok(&st), "{store}: {st:?}");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_is_unavailable_not_a_hang() {
    let (s, redis) = server(CONFIG, "redis").await;
    let redis = redis.expect("a redis");
    let mut c = client(&s).await;
    assert!(ok(&one(&mut c, &[("user", "ida")], None).await));
    redis.stop();
    // A guard against a hang, not a measure of speed: the store's
    // operation timeout (1 s) answers well before.
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        c.should_rate_limit(request(vec![descriptor(&[("user", "ida")], None)])),
    )
    .await
    .expect("an answer, not a hang");
    let e = answer.expect_err("the store cannot be reached");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        e.metadata()
            .get("charon-error-class")
            .map(|v| v.to_str().ok()),
        Some(Some("server"))
    );
    // Unlimited and unmatched descriptors need no store.
    let st = one(&mut c, &[("health", "ok")], None).await;
    assert!(ok(&st));
    redis.resume();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_envoy_section_every_call_is_ok() {
    let s = InProcessServer::start(
        "resources:\n  - { name: api/x, kind: bucket, burst: 1, count: 1, period: 1h }\n",
    )
    .await;
    let mut c = client(&s).await;
    for _ in 0..3 {
        let mut r = request(vec![
            descriptor(&[("user", "a")], None),
            descriptor(&[("k", "v")], None),
        ]);
        r.domain = "anything".to_owned();
        let r = call(&mut c, r).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses.len(), 2);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_list_the_envoy_service() {
    let s = InProcessServer::start(CONFIG).await;
    let channel = Channel::from_shared(s.endpoint())
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
        })
        .await
        .expect("a health answer")
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(
        Channel::from_shared(s.endpoint())
            .expect("an endpoint")
            .connect()
            .await
            .expect("connect"),
    );
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([list]))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("a reflection answer")
        .expect("one message");
    let Some(MessageResponse::ListServicesResponse(services)) = answer.message_response else {
        panic!("a list of services: {answer:?}");
    };
    let names: Vec<&str> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService")
            && names.contains(&"charon.v1.Limiter"),
        "{names:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_namespace_answers_ok_and_never_stops_the_batch() {
    let config = format!("namespaces: {{ envoy: {{ ignore_configured: true }} }}\n{CONFIG}");
    for store in STORES {
        let (s, _redis) = server(&config, store).await;
        let mut c = client(&s).await;
        for _ in 0..3 {
            assert!(ok(&one(&mut c, &[("plan", "p")], None).await), "{store}");
        }
        // A dry run on the spent inline limit, beside an enforced one.
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("plan", "p")], Some(0)),
                descriptor(&[("user", "jo")], Some(2)),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        assert!(
            over(&one(&mut c, &[("user", "jo")], None).await),
            "{store}: jo recorded"
        );
        s.stop().await;
    }
}

/// `same_slot: true` on a domain: every count a call of that domain
/// touches carries the domain's Redis hash tag (one Redis Cluster slot for
/// a whole all-or-nothing batch), and those counts are the domain's own,
/// apart from the same resource used by another domain, in both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_slot_domain_keeps_its_counts_under_one_tag() {
    let config = CONFIG.replace(
        "        - key: tiers\n          resource: api/tiers\n",
        "        - key: tiers\n          resource: api/tiers\n    - domain: slot\n      same_slot: true\n      descriptors:\n        - key: user\n          resource: api/login\n        - key: plan\n          rate_limit: { unit: day, requests_per_unit: 1 }\n",
    );
    for store in STORES {
        let (s, redis) = server(&config, store).await;
        let mut c = client(&s).await;
        // dave spends api/login's limit of 2 in the domain edge …
        assert!(
            ok(&one(&mut c, &[("user", "dave")], Some(2)).await),
            "{store}"
        );
        assert!(
            over(&one(&mut c, &[("user", "dave")], None).await),
            "{store}"
        );
        // … which the domain slot counts apart.
        let slot = |descriptors| RateLimitRequest {
            domain: "slot".to_owned(),
            descriptors,
            hits_addend: 0,
        };
        let r = call(
            &mut c,
            slot(vec![
                descriptor(&[("user", "dave")], None),
                descriptor(&[("plan", "p1")], None),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        // All or nothing still holds: plan p1 is spent, so dave's hit in
        // this call is not recorded.
        let r = call(
            &mut c,
            slot(vec![
                descriptor(&[("user", "dave")], None),
                descriptor(&[("plan", "p1")], None),
            ]),
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}: {r:?}");
        let r = call(&mut c, slot(vec![descriptor(&[("user", "dave")], None)])).await;
        assert_eq!(r.statuses[0].limit_remaining, 0, "{store}: {r:?}");
        assert!(ok(&r.statuses[0]), "{store}: one of 2 was left: {r:?}");
        // Burst tiers too (the node `burst` follows `plan` in this domain).
        let r = call(&mut c, slot(vec![descriptor(&[("burst", "z")], None)])).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        if let Some(redis) = &redis {
            let mut raw = redis::Client::open(redis.url())
                .and_then(|c| c.get_connection())
                .expect("redis");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("charon:{%eslot}:*")
                .query(&mut raw)
                .expect("KEYS");
            let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                [
                    "charon:{%eslot}:m:15:envoy/slot/plan:p1",
                    "charon:{%eslot}:m:9:api/login:dave",
                    "charon:{%eslot}:t:9:api/burst:g",
                    "charon:{%eslot}:t:9:api/burst:gn",
                    "charon:{%eslot}:t:9:api/burst:r:z",
                    "charon:{%eslot}:t:9:api/burst:rs:z",
                    "charon:{%eslot}:t:9:api/burst:rt1:z",
                ],
                "every key of the domain under its tag"
            );
        }
        s.stop().await;
    }
}

/// The worked examples of docs/envoy.md, "Client identity keys": one node
/// per key kind, each fed the descriptor Envoy builds from its actions.
const IDENTITY: &str = r#"
resources:
  - { name: api/keys, kind: window, algorithm: fixed, limit: 2, window: 1h }
  - { name: web/sessions, kind: bucket, burst: 2, count: 2, period: 1h }
envoy:
  domains:
    - domain: identity
      descriptors:
        - key: api_key
          resource: api/keys
        - key: session
          resource: web/sessions
        - key: user
          rate_limit: { unit: hour, requests_per_unit: 2 }
        - key: region
          value: eu-west
          rate_limit: { unit: hour, requests_per_unit: 2 }
        - key: region
          value: us-east
          descriptors:
            - key: remote_address
              mask: { ipv4: 24, ipv6: 48 }
              rate_limit: { unit: hour, requests_per_unit: 2 }
        - key: remote_address
          mask: { ipv4: 32, ipv6: 56 }
          rate_limit: { unit: hour, requests_per_unit: 2 }
"#;

/// Sends `calls` one-descriptor calls of `entries` to the domain
/// `identity`; the codes, `true` for OK.
async fn identity_calls(
    c: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
    calls: usize,
) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..calls {
        let r = call(
            c,
            RateLimitRequest {
                domain: "identity".to_owned(),
                descriptors: vec![descriptor(entries, None)],
                hits_addend: 0,
            },
        )
        .await;
        out.push(ok(&r.statuses[0]));
    }
    out
}

/// One step of a worked example: one-descriptor calls of these entries,
/// one per code expected (`true` for OK), in order.
type Step<'a> = (&'a [(&'a str, &'a str)], &'a [bool]);

/// Runs the steps of the worked example `case` against a fresh server on
/// [`IDENTITY`], in both stores; a failure names the case, the store and
/// the step.
async fn identity_case(case: &str, steps: &[Step<'_>]) {
    for store in STORES {
        let (s, _redis) = server(IDENTITY, store).await;
        let mut c = client(&s).await;
        for (i, (entries, want)) in steps.iter().enumerate() {
            let got = identity_calls(&mut c, entries, want.len()).await;
            assert_eq!(got, *want, "{case}, {store}, step {i}: {entries:?}");
        }
        s.stop().await;
    }
}

/// By header: `request_headers: {header_name: x-api-key, descriptor_key:
/// api_key}` sends `api_key=<the header>`; each key has its own window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_by_header() {
    identity_case(
        "header",
        &[
            (&[("api_key", "k-123")], &[true, true, false]),
            (&[("api_key", "k-456")], &[true]),
        ],
    )
    .await;
}

/// By cookie: `header_to_metadata` copies the cookie `session` into dynamic
/// metadata, and the `metadata` action sends `session=<the cookie>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_by_cookie() {
    identity_case(
        "cookie",
        &[
            (&[("session", "3f9c0a")], &[true, true, false]),
            (&[("session", "77e1b2")], &[true]),
        ],
    )
    .await;
}

/// By user id: `jwt_authn` with `payload_in_metadata`, and the `metadata`
/// action on the claim `sub` sends `user=<sub>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_by_jwt_claim() {
    identity_case(
        "jwt claim",
        &[
            (&[("user", "alice@example.com")], &[true, true, false]),
            (&[("user", "bob@example.com")], &[true]),
        ],
    )
    .await;
}

/// By region: a `generic_key` per virtual host (`descriptor_key: region`)
/// sends `region=eu-west`, one limit for the whole region; in us-east a
/// `remote_address` action follows, so each /24 there has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_by_region() {
    let us = |a| [("region", "us-east"), ("remote_address", a)];
    identity_case(
        "region",
        &[
            (&[("region", "eu-west")], &[true, true, false]),
            (&us("198.51.100.7"), &[true, true]),
            // Same /24: the same client.
            (&us("198.51.100.200"), &[false]),
            (&us("198.51.101.7"), &[true]),
            // A region the tree does not name is not limited.
            (&[("region", "ap-south")], &[true, true, true]),
        ],
    )
    .await;
}

/// By client address: the `remote_address` action sends
/// `remote_address=<the client's address>` (Envoy's `x-forwarded-for` rules
/// decide which), and `mask` makes IPv4 per address, IPv6 per /56.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_by_client_address() {
    identity_case(
        "client address",
        &[
            (&[("remote_address", "2001:db8:1:100::1")], &[true, true]),
            // Another address of the same /56 is the same client.
            (&[("remote_address", "2001:db8:1:1ff::9")], &[false]),
            (&[("remote_address", "2001:db8:1:200::1")], &[true]),
            (&[("remote_address", "192.0.2.1")], &[true, true, false]),
            (&[("remote_address", "192.0.2.2")], &[true]),
            // Not an address: limited by its literal text, never an error.
            (&[("remote_address", "not-an-ip")], &[true, true, false]),
        ],
    )
    .await;
}
