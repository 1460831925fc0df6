//! Buckets, windows and queues through the limiter (SPEC §7–§10): requests
//! dispatch by kind, dry runs, charges and refunds, the same operations on
//! the burst tiers, and the client error of a refund on them.

use std::sync::Arc;

use charon_core::ClientError;
use charon_core::config::Config;
use charon_core::meter::Reply;
use charon_core::request::Amount;
use charon_limiter::{Decision, LimitError, Limiter, RequestOptions};
use charon_testkit::stores::{self, Fixture};

const CONFIG: &str = r#"
namespaces:
  open: { allow_unconfigured: true }
  off: { ignore_configured: true }
resources:
  - name: credits
    kind: bucket
    burst: 100
    count: 1
    period: 1m
    soft_limit: 50%
    domains: { rich: { count: 2 } }
  - name: regs
    kind: bucket
    burst: 20
    count: 20
    period: 1s
  - name: login
    kind: window
    algorithm: fixed
    limit: 2
    window: 10s
    ban: 1h
  - name: exports
    kind: queue
    rate: 10
    period: 1s
    size: 5
  - name: api
    kind: rate
    tiers: [ { limit: 1, window: 1s } ]
  - name: vm
    kind: copy
    domain_limit: 1
  - name: off/b
    kind: bucket
    burst: 1
    count: 1
    period: 1s
"#;

fn limiter(f: &Fixture) -> Arc<Limiter> {
    let (config, _) = Config::from_yaml(CONFIG).unwrap();
    Limiter::new(config, f.store.clone())
}

fn n(c: u64) -> Amount {
    Amount::new(c, 1).unwrap()
}

fn meter(d: Decision) -> Reply {
    match d {
        Decision::Meter { reply, ignored } => {
            assert!(!ignored);
            reply
        }
        other => panic!("expected a meter reply, got {other:?}"),
    }
}

fn client(e: LimitError) -> ClientError {
    match e {
        LimitError::Client(c) => c,
        other => panic!("expected a client error, got {other:?}"),
    }
}

async fn request(l: &Limiter, r: &str, d: &str, c: u64) -> Reply {
    meter(
        l.decide(r, d, n(c), RequestOptions::default())
            .await
            .unwrap(),
    )
}

/// Seed 002's registrations per IP, then a charge into debt and a refund:
/// run on both stores, which must answer alike.
async fn bucket_scenario(f: Fixture) -> Vec<Reply> {
    let l = limiter(&f);
    let mut replies = Vec::new();
    for _ in 0..20 {
        assert_eq!(request(&l, "regs", "ip", 1).await.granted, 1);
    }
    let r = request(&l, "regs", "ip", 1).await;
    assert_eq!((r.granted, r.retry_after_ms), (0, Some(50)));
    replies.push(r);
    f.clock.advance(50);
    replies.push(request(&l, "regs", "ip", 1).await);
    assert_eq!(replies[1].granted, 1);

    // A charge is never rejected: 30 tokens into an empty bucket leave a
    // debt of 30, paid back in 1.5 s (and 50 ms for the next token).
    let c = meter(l.charge("regs", "ip", 30).await.unwrap());
    assert_eq!((c.granted, c.remaining), (30, 0));
    assert_eq!(c.retry_after_ms, Some(1_550));
    replies.push(c);
    assert_eq!(request(&l, "regs", "ip", 1).await.granted, 0);
    // A refund of 31 pays the debt and one token back.
    let r = meter(l.refund("regs", "ip", 31).await.unwrap());
    assert_eq!((r.granted, r.remaining, r.retry_after_ms), (31, 1, Some(0)));
    replies.push(r);
    replies.push(request(&l, "regs", "ip", 1).await);
    assert_eq!(replies[4].granted, 1);
    replies
}

#[tokio::test]
async fn bucket_burst_retry_charge_and_refund_alike_in_both_stores() {
    let memory = bucket_scenario(stores::memory().await).await;
    let redis = bucket_scenario(stores::redis().await).await;
    assert_eq!(memory, redis);
}

#[tokio::test]
async fn weighted_credits_with_a_soft_limit_and_an_override() {
    let f = stores::memory().await;
    let l = limiter(&f);
    f.clock.set(10 * 60_000);
    for left in [80, 60, 40] {
        let r = request(&l, "credits", "u", 20).await;
        assert_eq!((r.granted, r.remaining), (20, left));
        assert_eq!(r.warning, left <= 50, "50 % used warns");
    }
    f.clock.set(20 * 60_000);
    let r = request(&l, "credits", "u", 2).await;
    assert_eq!((r.granted, r.remaining, r.limit), (2, 48, 100));
    // The override doubles the rate and keeps the burst.
    let r = request(&l, "credits", "rich", 100).await;
    assert_eq!(r.granted, 100);
    f.clock.advance(60_000);
    assert_eq!(request(&l, "credits", "rich", 5).await.granted, 2);
}

#[tokio::test]
async fn a_dry_run_answers_as_the_request_and_records_nothing() {
    let f = stores::memory().await;
    let l = limiter(&f);
    let dry = RequestOptions::dry_run();
    for _ in 0..3 {
        let r = meter(l.decide("regs", "d", n(20), dry).await.unwrap());
        assert_eq!((r.granted, r.remaining), (20, 0));
    }
    assert_eq!(request(&l, "regs", "d", 20).await.granted, 20);
    let r = meter(l.decide("regs", "d", n(1), dry).await.unwrap());
    assert_eq!((r.granted, r.retry_after_ms), (0, Some(50)));
}

#[tokio::test]
async fn a_queue_delays_and_rejects_only_when_full() {
    let f = stores::memory().await;
    let l = limiter(&f);
    for delay in [0, 100, 200, 300, 400] {
        let r = request(&l, "exports", "d", 1).await;
        assert_eq!((r.granted, r.delay_ms), (1, Some(delay)));
    }
    let r = request(&l, "exports", "d", 1).await;
    assert_eq!(r.granted, 0);
    assert_eq!(r.retry_after_ms, Some(100));
}

#[tokio::test]
async fn a_window_bans_after_a_rejection_and_refuses_refunds() {
    let f = stores::memory().await;
    let l = limiter(&f);
    assert_eq!(request(&l, "login", "d", 2).await.granted, 2);
    let r = request(&l, "login", "d", 1).await;
    assert_eq!((r.granted, r.banned), (0, true));
    assert_eq!(r.retry_after_ms, Some(3_600_000));
    f.clock.advance(60_000);
    let r = request(&l, "login", "d", 1).await;
    assert_eq!((r.granted, r.banned), (0, true));
    assert_eq!(r.retry_after_ms, Some(3_540_000));
    f.clock.advance(3_540_000);
    let r = request(&l, "login", "d", 1).await;
    assert_eq!((r.granted, r.banned), (1, false));

    let e = client(l.refund("login", "d", 1).await.unwrap_err());
    assert!(
        matches!(&e, ClientError::InvalidArgument(m) if m.contains("refund")),
        "{e:?}"
    );
}

#[tokio::test]
async fn kind_rate_dry_runs_and_charges_and_refuses_only_refunds() {
    let f = stores::memory().await;
    let l = limiter(&f);
    let d = l
        .decide("api", "d", n(1), RequestOptions::default())
        .await
        .unwrap();
    let Decision::Tiers(tiers) = d else {
        panic!("tiers expected, got {d:?}")
    };
    let other = limiter(&stores::memory().await);
    assert_eq!(tiers, other.request("api", "d", n(1)).await.unwrap());
    assert_eq!(
        (tiers.context.limit, tiers.context.remaining),
        (1, 0),
        "{tiers:?}"
    );
    // Tier 1 is full until its hit leaves the window at 0 + 1000 + 1.
    assert_eq!(tiers.context.retry_after_ms, Some(1_001));

    let tier_reply = |d: Decision| match d {
        Decision::Tiers(r) => r,
        Decision::Meter { .. } => panic!("tiers expected, got {d:?}"),
    };
    let dry = tier_reply(
        l.decide("api", "d", n(1), RequestOptions::dry_run())
            .await
            .unwrap(),
    );
    assert_eq!((dry.granted, dry.context.retry_after_ms), (0, Some(1_001)));
    // A charge is never rejected: the tier holds 2 hits of 1.
    let c = tier_reply(l.charge("api", "d", 1).await.unwrap());
    assert_eq!((c.granted, c.tier, c.tier_hits), (1, 1, 2), "{c:?}");
    assert_eq!(c.context.retry_after_ms, Some(1_001));
    // The permissive tier of an unconfigured resource charges too.
    let c = tier_reply(l.charge("open/anything", "d", 1).await.unwrap());
    assert_eq!((c.granted, c.domain_hits_last_second), (1, 1), "{c:?}");

    let e = client(l.refund("api", "d", 1).await.unwrap_err());
    assert!(matches!(&e, ClientError::InvalidArgument(m) if m.contains("only for kind bucket")));
    assert!(matches!(
        client(l.charge("vm", "d", 1).await.unwrap_err()),
        ClientError::WrongKind { .. }
    ));
    assert!(matches!(
        client(l.charge("nope", "d", 1).await.unwrap_err()),
        ClientError::UnknownResource(_)
    ));
    let e = client(l.charge("regs", "d", 0).await.unwrap_err());
    assert!(matches!(&e, ClientError::InvalidArgument(m) if m.contains("copies")));
    // Nothing was recorded by the errors.
    assert_eq!(request(&l, "regs", "d", 20).await.granted, 20);
}

#[tokio::test]
async fn ignore_configured_grants_meters_whole_and_records_the_cost() {
    let f = stores::memory().await;
    let l = limiter(&f);
    for _ in 0..2 {
        let d = l
            .decide("off/b", "d", n(3), RequestOptions::default())
            .await
            .unwrap();
        let Decision::Meter { reply, ignored } = d else {
            panic!("meter expected")
        };
        assert!(ignored);
        assert_eq!(reply.granted, 3);
    }
    // The cost was recorded: the bucket is 5 tokens in debt.
    let c = l.charge("off/b", "d", 1).await.unwrap();
    assert_eq!(c.meter().unwrap().retry_after_ms, Some(7_000));
}
