//! Capacity leases through the simulation (SPEC §12): the events and
//! replies of the spec, the paper's proportional-share table, expiry at
//! its exact millisecond, learning mode, and bad input.

use crate::both;

use serde_json::{Value, json};

const CONFIG: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 90, algorithm: proportional_share,
      lease_length: 10s, refresh_interval: 2s, learning_mode: 0s }
  - { name: db/learn, kind: lease, capacity: 10, algorithm: fair_share,
      lease_length: 10s, refresh_interval: 2s, safe_capacity: 1 }
  - { name: api, kind: rate, tiers: [ { limit: 2, window: 1s } ] }
"#;

fn run(events: &[Value]) -> Vec<Value> {
    both::run(CONFIG, events)
}

fn get(t: u64, client: &str, wants: f64) -> Value {
    json!({"t": t, "op": "get_capacity", "client": client, "resource": "db/qps", "wants": wants})
}

#[test]
fn the_spec_reply_and_the_papers_proportional_share_table() {
    let mut events = Vec::new();
    // Two rounds: a late client gets less until the others shrink.
    for t in [0, 1] {
        for (c, w) in [("a", 100.0), ("b", 50.0), ("c", 10.0)] {
            events.push(get(t, c, w));
        }
    }
    let out = run(&events);
    assert_eq!(
        serde_json::to_string(&out[0]).expect("encode"),
        r#"{"t":0,"op":"get_capacity","resource":"db/qps","capacity":90,"expires_at_ms":10000,"refresh_interval_ms":2000,"safe_capacity":90}"#
    );
    let second: Vec<&Value> = out[3..].iter().map(|r| &r["capacity"]).collect();
    // The paper's 45.6 and 34.4, exactly: rounded down to the millionth.
    assert_eq!(
        second,
        [&json!(45.555555), &json!(34.444444), &json!(10)],
        "{out:#?}"
    );
    assert_eq!(
        out[1]["capacity"],
        json!(0),
        "a holds it all until it shrinks"
    );
    assert_eq!(out[5]["safe_capacity"], json!(30), "90 among three clients");
}

#[test]
fn a_lease_lapses_at_its_exact_millisecond_and_release_says_so() {
    let out = run(&[
        get(0, "a", 60.0),
        get(1, "b", 60.0),
        // At 9999 a's lease holds: b gets what a does not hold.
        get(9_999, "b", 60.0),
        // At 10000 it has lapsed: b may have all it wants.
        get(10_000, "b", 60.0),
        json!({"t": 10_000, "op": "release_capacity", "client": "a", "resource": "db/qps"}),
        json!({"t": 10_001, "op": "release_capacity", "client": "b", "resource": "db/qps"}),
        json!({"t": 10_001, "op": "release_capacity", "client": "b", "resource": "db/qps"}),
    ]);
    assert_eq!(out[0]["capacity"], json!(60));
    assert_eq!(out[1]["capacity"], json!(30), "what a does not hold");
    assert_eq!(out[2]["capacity"], json!(30));
    assert_eq!(out[3]["capacity"], json!(60), "{:?}", out[3]);
    assert_eq!(
        serde_json::to_string(&out[4]).expect("encode"),
        r#"{"t":10000,"op":"release_capacity","released":false}"#
    );
    assert_eq!(out[5]["released"], json!(true));
    assert_eq!(out[6]["released"], json!(false));
}

#[test]
fn learning_mode_trusts_what_clients_have() {
    let learn = |t: u64, c: &str, wants: f64, has: f64| json!({"t": t, "op": "get_capacity", "client": c, "resource": "db/learn", "wants": wants, "has": has});
    // Learning for one lease length (10 s) from the first lease decision.
    let out = run(&[
        learn(1_000, "a", 8.0, 7.0),
        learn(1_000, "b", 8.0, 3.0),
        learn(10_999, "a", 8.0, 7.0),
        learn(10_999, "b", 8.0, 3.0),
        learn(11_000, "a", 8.0, 7.0),
    ]);
    assert_eq!(out[0]["capacity"], json!(7), "what it has");
    assert_eq!(out[1]["capacity"], json!(3));
    assert_eq!(out[2]["capacity"], json!(7), "still learning");
    assert_eq!(out[4]["capacity"], json!(5), "fair share of 10 between two");
    assert_eq!(out[4]["safe_capacity"], json!(1), "configured");
}

#[test]
fn bad_lease_events_are_client_errors_that_change_nothing() {
    let bad = [
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "db/qps", "wants": -1}),
            "wants is -1; capacities start at 0",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "db/qps", "wants": "lots"}),
            "wants: expected a number",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "nope", "wants": 1}),
            "unknown resource \"nope\"",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "api", "wants": 1}),
            "resource \"api\" is rate-limited; get_capacity needs a lease-limited resource",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "", "resource": "db/qps", "wants": 1}),
            "client_id",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "db/qps", "wants": 1, "subclients": 0}),
            "subclients: must be at least 1",
        ),
        (
            json!({"t": 0, "op": "get_capacity", "client": "a", "resource": "db/qps", "wants": 1, "domain": "d"}),
            "domain",
        ),
        (
            json!({"t": 0, "op": "release_capacity", "client": "a", "resource": "api"}),
            "release_capacity needs a lease-limited resource",
        ),
    ];
    let mut events: Vec<Value> = bad.iter().map(|(e, _)| e.clone()).collect();
    events.push(get(0, "z", 1_000.0));
    let out = run(&events);
    for ((_, want), got) in bad.iter().zip(&out) {
        assert_eq!(got["error"], json!("client"), "{got}");
        let message = got["message"].as_str().unwrap_or_default();
        assert!(message.contains(want), "{message:?} should say {want:?}");
    }
    assert_eq!(
        out.last().map(|r| &r["capacity"]),
        Some(&json!(90)),
        "nothing was held"
    );
}
