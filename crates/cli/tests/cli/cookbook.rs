//! The cookbook of the Charon paper (§2.3) and its blog post, run through
//! `charon simulate` as an operator would.

use crate::support::{gtb, req, simulate};
use serde_json::{Value, json};

const SIMPLE: &str = r#"
resources:
  - name: api/simple
    kind: rate
    tiers:
      - { limit: 5, window: 1s }
"#;

#[test]
fn simple_five_requests_per_second() {
    let events: Vec<Value> = (0..6)
        .map(|i| req(i * 100, "api/simple", "u"))
        .chain([req(1_000, "api/simple", "u"), req(1_001, "api/simple", "u")])
        .collect();
    let out = simulate(SIMPLE, &events);
    let granted: Vec<u64> = out
        .iter()
        .map(|o| o["granted"].as_u64().expect("granted"))
        .collect();
    // Five in the first second; the sixth waits until the hit at 0 falls
    // out of the window at 1001 (a hit at t counts until t + window).
    assert_eq!(granted, vec![1, 1, 1, 1, 1, 0, 0, 1]);
    assert_eq!(out[5]["tier_hits"], 5);
    assert_eq!(out[5]["tier_limit"], 5);
}

const PENALTY: &str = r#"
resources:
  - name: api/search
    kind: rate
    tiers:
      - { limit: 5,  window: 1s, cooldown: 0s }
      - { limit: 25, window: 1s, active: 5s, cooldown: 15s, skippable: false }
"#;

#[test]
fn penalty_burst_for_five_seconds_once_every_fifteen() {
    let mut events: Vec<Value> = (0..31).map(|i| req(i, "api/search", "u")).collect();
    // Tier 2 entered at 5 is active until 5005, then cools down until 20005.
    events.extend((0..6).map(|i| req(5_005 + i, "api/search", "u")));
    events.extend((0..6).map(|i| req(19_999 + i, "api/search", "u")));
    events.push(req(20_005, "api/search", "u"));
    let out = simulate(PENALTY, &events);
    assert_eq!(gtb(&out[0]), (1, 1, true), "tier 0 bursts into tier 1");
    for o in &out[1..5] {
        assert_eq!(gtb(o), (1, 1, false));
    }
    assert_eq!(
        gtb(&out[5]),
        (1, 2, true),
        "the sixth hit bursts into tier 2"
    );
    for o in &out[6..30] {
        assert_eq!(gtb(o), (1, 2, false));
    }
    assert_eq!(out[29]["tier_hits"], 25);
    assert_eq!(
        gtb(&out[30]),
        (0, 2, false),
        "tier 2 full and no tier above"
    );
    // Fallback: tier 2 cools down, tier 1 is current again.
    for o in &out[31..36] {
        assert_eq!(gtb(o), (1, 1, false));
    }
    assert_eq!(
        gtb(&out[36]),
        (0, 1, false),
        "cannot burst while tier 2 cools down"
    );
    for o in &out[37..42] {
        assert_eq!(gtb(o), (1, 1, false), "a fresh window in tier 1");
    }
    assert_eq!(
        gtb(&out[42]),
        (0, 1, false),
        "tier 1 full at 20004 and tier 2 still cooling"
    );
    assert_eq!(
        gtb(&out[43]),
        (1, 2, true),
        "tier 2 may be entered again at 20005"
    );
}

const PRISON: &str = r#"
resources:
  - name: api/login
    kind: rate
    tiers:
      - { limit: 5, window: 1s }
      - { limit: 1, window: 15s, active: 15s, cooldown: 0s }
"#;

#[test]
fn punishment_prison_bans_for_fifteen_seconds() {
    let mut events: Vec<Value> = (0..7).map(|i| req(i, "api/login", "greedy")).collect();
    events.push(req(10_000, "api/login", "greedy"));
    events.push(req(15_004, "api/login", "greedy"));
    events.push(req(15_005, "api/login", "greedy"));
    events.push(req(15_006, "api/login", "other"));
    let out = simulate(PRISON, &events);
    assert_eq!(
        gtb(&out[5]),
        (1, 2, true),
        "the burst enters the prison tier"
    );
    assert_eq!(gtb(&out[6]), (0, 2, false), "locked up");
    assert_eq!(gtb(&out[7]), (0, 2, false), "still locked up 10 s later");
    assert_eq!(
        gtb(&out[8]),
        (0, 2, false),
        "prison ends at 5 + 15000 = 15005"
    );
    assert_eq!(gtb(&out[9]), (1, 1, false), "released into tier 1");
    assert_eq!(
        gtb(&out[10]),
        (1, 1, true),
        "other domains were never affected"
    );
}

const BATCH: &str = r#"
resources:
  - name: reports/api
    kind: rate
    tiers:
      - { limit: 5000, window: 300s, active: 300s, cooldown: 86100s }
"#;

#[test]
fn batch_5000_in_five_minutes_then_nothing_for_the_rest_of_the_day() {
    let mut events: Vec<Value> = (0..5_000)
        .map(|i| req(i * 60, "reports/api", "nightly"))
        .collect();
    events.push(req(299_999, "reports/api", "nightly"));
    events.push(req(300_000, "reports/api", "nightly"));
    events.push(req(86_399_999, "reports/api", "nightly"));
    events.push(req(86_400_000, "reports/api", "nightly"));
    let out = simulate(BATCH, &events);
    assert!(out[..5_000].iter().all(|o| o["granted"] == 1));
    assert_eq!(
        gtb(&out[0]),
        (1, 1, true),
        "the first request starts the window"
    );
    assert_eq!(out[4_999]["tier_hits"], 5_000);
    assert_eq!(gtb(&out[5_000]), (0, 1, false), "the window is full");
    assert_eq!(gtb(&out[5_001]), (0, 0, false), "cooldown from 300 s");
    assert_eq!(
        gtb(&out[5_002]),
        (0, 0, false),
        "still cooling a day later less 1 ms"
    );
    assert_eq!(gtb(&out[5_003]), (1, 1, true), "the next day's run starts");
}

const BULKHEADS: &str = r#"
resources:
  - name: sandbox/vm
    kind: copy
    domain_limit: 10
    global_limit: 12
    groups:
      - { name: high-volume, limit: 6, domains: [big-1, big-2] }
      - { name: probation, limit: 2, domains: [new-1, new-2] }
      - { name: blacklist, limit: 0, domains: [evil] }
"#;

fn reserve(t: u64, domain: &str, copies: u64, session: &str) -> Value {
    json!({"t": t, "op": "reserve", "resource": "sandbox/vm", "domain": domain, "copies": copies, "min_copies": 1, "session": session})
}

#[test]
fn bulkheads_keep_high_volume_domains_in_their_own_pool() {
    let events = vec![
        reserve(0, "big-1", 10, "a"),
        reserve(1, "big-2", 10, "b"),
        reserve(2, "small", 10, "c"),
        json!({"t": 3, "op": "release", "resource": "sandbox/vm", "domain": "big-1", "copies": 2, "groups": ["high-volume"], "session": "a"}),
        reserve(4, "big-2", 10, "b"),
        json!({"t": 5, "op": "end_session", "session": "b"}),
        reserve(6, "small", 10, "c"),
    ];
    let out = simulate(BULKHEADS, &events);
    assert_eq!(out[0]["granted"], 6, "the high-volume pool holds 6");
    assert_eq!(
        out[0]["groups"],
        json!([{"name": "high-volume", "limit": 6, "holds": 6}])
    );
    assert_eq!(out[1]["granted"], 0, "the pool is exhausted for big-2 too");
    assert_eq!(
        out[2]["granted"], 6,
        "small domains still get the rest (12 - 6)"
    );
    assert_eq!(
        (
            out[2]["global_holds"].as_u64(),
            out[2]["groups"].as_array().map(Vec::len)
        ),
        (Some(12), Some(0))
    );
    assert_eq!(out[3]["released"], 2);
    assert_eq!(
        out[3]["groups"],
        json!([{"name": "high-volume", "holds": 4}])
    );
    assert_eq!(out[4]["granted"], 2, "big-2 gets what big-1 gave back");
    assert_eq!(out[5]["released"], 2, "ending a session releases its holds");
    assert_eq!(out[6]["granted"], 2);
}

#[test]
fn probation_and_blacklist_groups() {
    let events = vec![
        reserve(0, "new-1", 5, "a"),
        reserve(1, "new-2", 5, "b"),
        reserve(2, "evil", 1, "c"),
        reserve(3, "trusted", 5, "d"),
    ];
    let out = simulate(BULKHEADS, &events);
    assert_eq!(
        out[0]["granted"], 2,
        "new domains share a probation pool of 2"
    );
    assert_eq!(out[1]["granted"], 0);
    assert_eq!(
        out[1]["groups"],
        json!([{"name": "probation", "limit": 2, "holds": 2}])
    );
    assert_eq!(
        out[2]["granted"], 0,
        "a blacklist group of limit 0 forbids access"
    );
    assert_eq!(
        out[3]["granted"], 5,
        "domains outside groups are only held to their own limit"
    );
}

#[test]
fn transfer_and_seize_between_sessions() {
    let events = vec![
        reserve(0, "big-1", 5, "p1"),
        json!({"t": 1, "op": "transfer", "resource": "sandbox/vm", "domain": "big-1", "copies": 3, "groups": ["high-volume"], "ttl_ms": 1000, "session": "p1"}),
        json!({"t": 2, "op": "release", "resource": "sandbox/vm", "domain": "big-1", "copies": 3, "groups": ["high-volume"], "session": "p1"}),
        json!({"t": 3, "op": "seize", "transfer_id": "t1", "session": "p2"}),
        json!({"t": 4, "op": "seize", "transfer_id": "t1", "session": "p3"}),
        json!({"t": 5, "op": "end_session", "session": "p1"}),
        json!({"t": 6, "op": "end_session", "session": "p2"}),
        json!({"t": 7, "op": "transfer", "resource": "sandbox/vm", "domain": "big-1", "copies": 1, "groups": ["high-volume"], "ttl_ms": 100, "session": "p2"}),
        reserve(8, "big-1", 1, "p4"),
        json!({"t": 9, "op": "transfer", "resource": "sandbox/vm", "domain": "big-1", "copies": 1, "groups": ["high-volume"], "ttl_ms": 100, "session": "p4"}),
        json!({"t": 109, "op": "seize", "transfer_id": "t2", "session": "p5"}),
        reserve(110, "big-1", 6, "p6"),
    ];
    let out = simulate(BULKHEADS, &events);
    assert_eq!(out[1]["transfer_id"], "t1");
    assert_eq!(
        out[2]["error"], "client",
        "staged copies cannot be released: {}",
        out[2]
    );
    assert_eq!(out[3]["copies"], 3);
    assert_eq!(out[3]["groups"], json!(["high-volume"]));
    assert_eq!(out[4]["error"], "client", "a transfer is seized once");
    assert_eq!(out[5]["released"], 2);
    assert_eq!(
        out[6]["released"], 3,
        "seized copies belong to the seizing session"
    );
    assert_eq!(out[7]["error"], "client", "p2 holds nothing any more");
    assert_eq!(out[10]["error"], "client", "expired at 9 + 100");
    assert_eq!(
        out[11]["granted"], 6,
        "the expired transfer gave its copy back"
    );
}

// ---- Buckets, windows and queues (issue 11's cookbook, SPEC §7–§10), with
// the resources of `examples/limits.yaml`, as the README shows them.

/// The whole example file: the recipes below use its bucket, window and queue
/// resources, and loading it checks the file is valid.
const KINDS: &str = include_str!("../../../../examples/limits.yaml");

/// A `request` of `copies` units.
fn req_n(t: u64, resource: &str, domain: &str, copies: u64) -> Value {
    json!({"t": t, "op": "request", "resource": resource, "domain": domain, "copies": copies})
}

/// (granted, remaining, retry_after_ms) of a meter reply.
fn grr(v: &Value) -> (u64, u64, Value) {
    (
        v["granted"]
            .as_u64()
            .unwrap_or_else(|| panic!("no granted in {v}")),
        v["remaining"].as_u64().expect("remaining"),
        v["retry_after_ms"].clone(),
    )
}

#[test]
fn weighted_credit_pool() {
    // 00:10 and 00:20 after the pool was full at 0.
    let out = simulate(
        KINDS,
        &[
            req_n(600_000, "api/credits", "u", 20),
            req_n(600_000, "api/credits", "u", 20),
            req_n(600_000, "api/credits", "u", 20),
            req_n(1_200_000, "api/credits", "u", 2),
        ],
    );
    assert_eq!(
        grr(&out[2]),
        (20, 40, json!(0)),
        "three POSTs of 20 leave 40"
    );
    assert_eq!(
        grr(&out[3]),
        (2, 48, json!(0)),
        "ten credits came back; a GET of 2 leaves 48"
    );
    assert_eq!(out[3]["limit"], 100);
}

#[test]
fn new_registrations_per_ip_and_an_override_that_doubles_the_rate() {
    for (domain, retry) in [("10.0.0.1", 50), ("10.0.0.2", 25)] {
        let mut events: Vec<Value> = (0..21)
            .map(|_| req(0, "acme/new-registrations", domain))
            .collect();
        events.push(req(retry, "acme/new-registrations", domain));
        events.push(req(retry, "acme/new-registrations", domain));
        let out = simulate(KINDS, &events);
        for o in &out[..20] {
            assert_eq!(o["granted"], 1, "{domain}: {o}");
        }
        assert_eq!(out[19]["limit"], 20, "{domain}: the burst is kept");
        assert_eq!(grr(&out[20]), (0, 0, json!(retry)), "{domain}");
        assert_eq!(grr(&out[21]), (1, 0, json!(retry)), "{domain}");
        assert_eq!(out[22]["granted"], 0, "{domain}: one token came back");
    }
}

#[test]
fn sliding_counter() {
    // 5 hits in the minute [0, 60 s); 3 at 10 s into the next one (estimate
    // 4 + n); at 30 % of it (78 s) the estimate is 3 + floor(5 × 0.7) = 6.
    let mut events: Vec<Value> = (0..5).map(|i| req(i, "edge/search", "u")).collect();
    events.extend((0..3).map(|_| req(70_000, "edge/search", "u")));
    events.push(req(78_000, "edge/search", "u"));
    events.push(req(78_000, "edge/search", "u"));
    let out = simulate(KINDS, &events);
    for o in &out[..8] {
        assert_eq!(o["granted"], 1, "{o}");
    }
    assert_eq!(grr(&out[8]).0, 1, "estimate 6 < 7: granted");
    assert_eq!(out[8]["remaining"], 0);
    assert_eq!(out[9]["granted"], 0, "estimate 7: full");
}

#[test]
fn throttle_and_ban() {
    const HOUR: u64 = 3_600_000;
    let mut events: Vec<Value> = (0..2_000).map(|_| req(0, "edge/login", "ip")).collect();
    events.push(req(1, "edge/login", "ip"));
    // Across the window's end at 1,200 s: still banned.
    let during = [2, 600_000, 1_200_000, 2_400_000, HOUR];
    events.extend(during.iter().map(|&t| req(t, "edge/login", "ip")));
    events.push(req(HOUR + 1, "edge/login", "ip"));
    let out = simulate(KINDS, &events);
    assert!(out[..2_000].iter().all(|o| o["granted"] == 1));
    assert_eq!(out[1_999]["remaining"], 0);
    let rejected = &out[2_000];
    assert_eq!(
        (rejected["granted"].as_u64(), rejected["banned"].as_bool()),
        (Some(0), Some(true))
    );
    assert_eq!(rejected["retry_after_ms"], HOUR);
    for (o, t) in out[2_001..2_006].iter().zip(during) {
        assert_eq!(o["granted"], 0, "{t}: {o}");
        assert_eq!(o["banned"], true, "{t}: {o}");
        assert_eq!(o["retry_after_ms"], HOUR + 1 - t, "{t}: the time left");
    }
    let after = &out[2_006];
    assert_eq!(
        (after["granted"].as_u64(), after["banned"].as_bool()),
        (Some(1), Some(false)),
        "the first request after the hour is decided normally: {after}"
    );
}

#[test]
fn queue_delays_instead_of_rejecting() {
    let events: Vec<Value> = (0..6).map(|_| req(0, "batch/exports", "u")).collect();
    let out = simulate(KINDS, &events);
    let delays: Vec<u64> = out[..5]
        .iter()
        .map(|o| o["delay_ms"].as_u64().expect("delay_ms"))
        .collect();
    assert_eq!(delays, vec![0, 100, 200, 300, 400]);
    assert!(out[..5].iter().all(|o| o["granted"] == 1));
    assert_eq!(out[5]["granted"], 0, "the queue is full");
    assert_eq!(out[5]["retry_after_ms"], 100, "until one unit has left");
}

#[test]
fn llm_tokens_dry_run_then_charge() {
    let t = 1_000;
    let out = simulate(
        KINDS,
        &[
            json!({"t": t, "op": "request", "resource": "llm/tokens", "domain": "u", "copies": 500, "dry_run": true}),
            json!({"t": t, "op": "charge", "resource": "llm/tokens", "domain": "u", "copies": 1_500}),
            req(t, "llm/tokens", "u"),
            req(t + 30_059, "llm/tokens", "u"),
            req(t + 30_060, "llm/tokens", "u"),
        ],
    );
    assert_eq!(grr(&out[0]), (500, 500, json!(0)), "would pass");
    // 1,500 tokens used against a full bucket of 1,000: 500 in debt, paid
    // back at 1,000 a minute in 30 s, then 60 ms for one token.
    assert_eq!(
        grr(&out[1]),
        (1_500, 0, json!(30_060)),
        "a charge is never rejected"
    );
    assert_eq!(grr(&out[2]), (0, 0, json!(30_060)), "in debt: rejected");
    assert_eq!(grr(&out[3]), (0, 0, json!(1)));
    assert_eq!(out[4]["granted"], 1, "the debt is paid back by time");
}

#[test]
fn burst_tiers_warn_then_ban() {
    const MINUTE: u64 = 60_000;
    let mut events: Vec<Value> = (0..16).map(|_| req(0, "api/uploads", "u")).collect();
    events.push(req(30_000, "api/uploads", "u"));
    events.push(
        json!({"t": MINUTE - 1, "op": "request", "resource": "api/uploads", "domain": "u", "dry_run": true}),
    );
    events.push(json!({"t": MINUTE - 1, "op": "charge", "resource": "api/uploads", "domain": "u", "copies": 1}));
    events.push(req(MINUTE, "api/uploads", "u"));
    let out = simulate(KINDS, &events);
    assert!(out[..15].iter().all(|o| o["granted"] == 1));
    // Tier 1: 4 of 5 is 80 %: the warning starts at the fourth hit, and
    // `remaining` counts the burst into tier 2 (1 + 10).
    assert_eq!(out[2]["warning"], false);
    assert_eq!(
        (&out[3]["warning"], &out[3]["remaining"]),
        (&json!(true), &json!(11))
    );
    // The sixth bursts into tier 2 (1 of 10: no warning); the 15th fills it.
    assert_eq!(
        (&out[5]["tier"], &out[5]["burst"], &out[5]["warning"]),
        (&json!(2), &json!(true), &json!(false))
    );
    assert_eq!(
        (
            &out[14]["limit"],
            &out[14]["remaining"],
            &out[14]["warning"]
        ),
        (&json!(10), &json!(0), &json!(true))
    );
    // The 16th is rejected and bans for a minute; tier 2 cools down until
    // then, so the ban's end is when tier 1 grants again.
    let rejected = &out[15];
    assert_eq!(
        (&rejected["granted"], &rejected["banned"]),
        (&json!(0), &json!(true))
    );
    assert_eq!(rejected["retry_after_ms"], MINUTE);
    assert_eq!(
        (&out[16]["banned"], &out[16]["retry_after_ms"]),
        (&json!(true), &json!(30_000))
    );
    // A dry run in the ban's last millisecond is rejected as the request
    // would be; a charge still counts, in the current tier (tier 1: tier 2
    // is cooling down), and the first request after the ban finds it there.
    assert_eq!(
        (
            &out[17]["granted"],
            &out[17]["banned"],
            &out[17]["retry_after_ms"]
        ),
        (&json!(0), &json!(true), &json!(1))
    );
    assert_eq!(
        (&out[18]["granted"], &out[18]["tier"], &out[18]["banned"]),
        (&json!(1), &json!(1), &json!(true))
    );
    let after = &out[19];
    assert_eq!(
        (&after["granted"], &after["banned"], &after["tier_hits"]),
        (&json!(1), &json!(false), &json!(2)),
        "{after}"
    );
}

/// The throttler's example (`examples/throttle.yaml` and its events, as
/// docs/throttler.md shows them): a start, a queue, an eviction by a
/// CRITICAL request, a rejection with its retry time, a caller gone, a
/// queued request starting at its time, and a class that learns.
#[test]
fn the_throttler_example_replays_as_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = std::fs::read_to_string(root.join("examples/throttle.yaml")).expect("example");
    let events = std::fs::read(root.join("examples/throttle-events.jsonl")).expect("events");
    assert_eq!(
        crate::support::simulate_text(&config, &events),
        [
            r#"{"t":0,"id":"r1","outcome":"started","predicted_ms":40.0}"#,
            r#"{"t":0,"id":"r2","outcome":"queued","predicted_ms":5.0}"#,
            r#"{"t":5,"id":"r3","outcome":"queued","predicted_ms":40.0}"#,
            r#"{"t":5,"id":"r4","outcome":"queued","predicted_ms":40.0}"#,
            r#"{"t":6,"id":"r5","outcome":"queued","predicted_ms":40.0}"#,
            r#"{"t":6,"id":"r4","outcome":"evicted","retry_after_ms":24}"#,
            r#"{"t":6,"id":"r6","outcome":"rejected","predicted_ms":40.0,"retry_after_ms":24}"#,
            r#"{"t":10,"id":"r3","outcome":"left"}"#,
            r#"{"t":27,"id":"r2","outcome":"started"}"#,
            r#"{"t":30,"id":"r5","outcome":"started"}"#,
            r#"{"t":30,"id":"r1","class":"POST /render","predicted_ms":52.5}"#,
        ]
    );
}
