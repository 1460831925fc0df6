//! The cookbook of the Charon paper (§2.3) and its blog post, run through
//! `charon simulate` as an operator would.

mod support;

use serde_json::{Value, json};
use support::{gtb, req, simulate};

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
