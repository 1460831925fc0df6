//! Every rate-like kind through the simulation (SPEC §10): the reply
//! context, dry runs, charges and refunds, and the event checks.

use crate::both;

use serde_json::{Value, json};

const CONFIG: &str = r#"
resources:
  - { name: api, kind: rate, tiers: [ { limit: 2, window: 1s } ] }
  - { name: tokens, kind: bucket, burst: 10, count: 10, period: 1s, soft_limit: 80% }
  - { name: win, kind: window, algorithm: fixed, limit: 2, window: 1s, ban: 5s }
  - { name: q, kind: queue, rate: 10, period: 1s, size: 2 }
"#;

fn run(events: &[Value]) -> Vec<Value> {
    both::run(CONFIG, events)
}

#[test]
fn a_bucket_reply_has_the_reply_context_in_core_order() {
    let out =
        run(&[json!({"t": 0, "op": "request", "resource": "tokens", "domain": "d", "copies": 8})]);
    assert_eq!(
        serde_json::to_string(&out[0]).expect("encode"),
        r#"{"t":0,"op":"request","granted":8,"limit":10,"remaining":2,"reset_after_ms":800,"retry_after_ms":0,"warning":true,"banned":false}"#
    );
}

#[test]
fn a_rate_reply_has_its_own_fields_then_the_reply_context() {
    let out = run(&[
        json!({"t": 0, "op": "request", "resource": "api", "domain": "d"}),
        json!({"t": 0, "op": "request", "resource": "api", "domain": "d", "dry_run": true, "copies": 2, "min_copies": 2}),
        json!({"t": 5, "op": "charge", "resource": "api", "domain": "d", "copies": 2}),
    ]);
    assert_eq!(
        serde_json::to_string(&out[0]).expect("encode"),
        r#"{"t":0,"op":"request","granted":1,"hard_limit":null,"global_limit":null,"tier_limit":2,"domain_hits_last_second":1,"global_hits_last_second":1,"tier_hits":1,"tier":1,"burst":true,"hard_limited":false,"global_limited":false,"limit":2,"remaining":1,"reset_after_ms":1000,"retry_after_ms":0,"warning":false,"banned":false}"#
    );
    // A dry run for exactly 2 when 1 fits: rejected, and both fit once the
    // hit at 0 leaves the window at 1001.
    assert_eq!(
        (&out[1]["granted"], &out[1]["retry_after_ms"]),
        (&json!(0), &json!(1_001))
    );
    // A charge past the tier's limit is recorded all the same.
    assert_eq!(
        (
            &out[2]["granted"],
            &out[2]["tier_hits"],
            &out[2]["retry_after_ms"]
        ),
        (&json!(2), &json!(3), &json!(1_001))
    );
}

#[test]
fn a_dry_run_records_nothing() {
    let dry = json!({"t": 0, "op": "request", "resource": "tokens", "domain": "d", "copies": 10, "dry_run": true});
    let out = run(&[dry.clone(), dry]);
    for o in &out {
        assert_eq!(
            (o["granted"].as_u64(), o["remaining"].as_u64()),
            (Some(10), Some(0)),
            "{o}"
        );
    }
}

#[test]
fn charge_goes_into_debt_and_refund_pays_it_back() {
    let out = run(&[
        json!({"t": 0, "op": "charge", "resource": "tokens", "domain": "d", "copies": 15}),
        json!({"t": 0, "op": "request", "resource": "tokens", "domain": "d"}),
        json!({"t": 0, "op": "refund", "resource": "tokens", "domain": "d", "copies": 5}),
        json!({"t": 100, "op": "request", "resource": "tokens", "domain": "d"}),
    ]);
    assert_eq!(out[0]["granted"], 15);
    assert_eq!(
        out[0]["retry_after_ms"], 600,
        "1.5 s of debt, less the burst, plus one token"
    );
    assert_eq!(out[1]["granted"], 0);
    assert_eq!(out[2]["op"], "refund");
    assert_eq!(out[2]["granted"], 5);
    assert_eq!(out[2]["retry_after_ms"], 100);
    assert_eq!(out[3]["granted"], 1);
}

#[test]
fn a_window_bans_and_a_queue_delays() {
    let r = |t: u64, res: &str| json!({"t": t, "op": "request", "resource": res, "domain": "d"});
    let out = run(&[
        r(0, "win"),
        r(0, "win"),
        r(0, "win"),
        r(4_000, "win"),
        r(5_000, "win"),
    ]);
    assert_eq!(out[2]["granted"], 0);
    assert_eq!(out[2]["banned"], true);
    assert_eq!(out[3]["banned"], true);
    assert_eq!(out[3]["retry_after_ms"], 1_000);
    assert_eq!(
        (out[4]["granted"].as_u64(), out[4]["banned"].as_bool()),
        (Some(1), Some(false))
    );
    let out = run(&[r(0, "q"), r(0, "q"), r(0, "q")]);
    let delays: Vec<Value> = out.iter().map(|o| o["delay_ms"].clone()).collect();
    assert_eq!(delays, vec![json!(0), json!(100), json!(0)]);
    assert_eq!(out[2]["granted"], 0);
}

#[test]
fn bad_events_are_client_errors_naming_the_field() {
    let out = run(&[
        json!({"t": 0, "op": "request", "resource": "tokens", "domain": "d", "dry_run": "yes"}),
        json!({"t": 0, "op": "charge", "resource": "tokens", "domain": "d", "min_copies": 1}),
        json!({"t": 0, "op": "charge", "resource": "tokens", "domain": "d", "copies": 0}),
        json!({"t": 0, "op": "refund", "resource": "win", "domain": "d"}),
        json!({"t": 0, "op": "refund", "resource": "tokens", "domain": "d", "copies": 9_007_199_254_740_992_u64}),
        json!({"t": 0, "op": "refund", "resource": "api", "domain": "d"}),
        json!({"t": 0, "op": "request", "resource": "tokens", "domain": "d", "copies": 10}),
    ]);
    let (out, after) = out.split_at(out.len() - 1);
    for o in out {
        assert_eq!(o["error"], "client", "{o}");
    }
    let message = |i: usize| out[i]["message"].as_str().expect("message").to_owned();
    assert!(message(0).starts_with("dry_run: "), "{}", message(0));
    assert!(
        message(1).starts_with("min_copies: unknown field"),
        "{}",
        message(1)
    );
    assert!(message(2).contains("copies"), "{}", message(2));
    assert!(message(4).starts_with("copies: "), "{}", message(4));
    // Nothing changed: the bucket is still full.
    assert_eq!(after[0]["granted"], 10);
}

/// The same replay through a Redis Cluster (`redis+cluster://`): every
/// kind, a dry run, a charge and a refund, as in memory; the replay's keys
/// are deleted on every master.
#[test]
fn a_replay_on_a_redis_cluster_is_the_replay_in_memory() {
    let cluster = charon_testkit::RedisCluster::start();
    let events: Vec<Value> = ["api", "tokens", "win", "q"]
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            let t = i as u64 * 10;
            [
                json!({"t": t, "op": "request", "resource": r, "domain": "d", "copies": 2}),
                json!({"t": t + 1, "op": "request", "resource": r, "domain": "d", "dry_run": true}),
                json!({"t": t + 2, "op": "charge", "resource": r, "domain": "e", "copies": 3}),
            ]
        })
        .chain([
            json!({"t": 100, "op": "refund", "resource": "tokens", "domain": "e", "copies": 1}),
        ])
        .collect();
    let out = both::run_at(CONFIG, &events, &cluster.url());
    assert_eq!(out.len(), events.len());
}
