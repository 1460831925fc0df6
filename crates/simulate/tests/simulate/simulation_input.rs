//! `Simulation` never panics and answers every non-blank line with exactly
//! one object: a reply or an error line. Random bytes, random JSON, and
//! events whose fields are of every wrong type and size.

use charon_core::config::Config;
use charon_simulate::Simulation;
use proptest::prelude::*;
use serde_json::{Value, json};

const CONFIG: &str = r#"
resources:
  - { name: api, kind: rate, hard_limit: 3, tiers: [ { limit: 2, window: 1s }, { limit: 5, window: 1s, active: 2s, cooldown: 3s } ] }
  - { name: vm, kind: copy, domain_limit: 2, groups: [ { name: g, limit: 1, domains: [a] } ] }
"#;

fn sim() -> Simulation {
    Simulation::new(Config::from_yaml(CONFIG).expect("valid").0)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

fn check(reply: &Value) -> Result<(), TestCaseError> {
    let obj = reply
        .as_object()
        .ok_or_else(|| TestCaseError::fail("reply is not an object"))?;
    prop_assert!(obj.contains_key("t") && obj.contains_key("op"), "{}", reply);
    if let Some(class) = obj.get("error") {
        prop_assert_eq!(class, "client");
        prop_assert!(obj["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    Ok(())
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        "[a-z/]{0,8}".prop_map(Value::from),
        Just(json!([])),
        Just(json!({"x": 1})),
        Just(json!(["a", 1])),
        (0u64..20).prop_map(Value::from),
    ]
}

fn event() -> impl Strategy<Value = Value> {
    let ops = prop_oneof![
        Just("request"),
        Just("reserve"),
        Just("release"),
        Just("transfer"),
        Just("seize"),
        Just("end_session"),
        Just("bogus")
    ];
    let keys = prop::sample::subsequence(
        vec![
            "t",
            "resource",
            "domain",
            "copies",
            "min_copies",
            "session",
            "groups",
            "ttl_ms",
            "transfer_id",
            "extra",
        ],
        0..=10,
    );
    (ops, keys, prop::collection::vec(scalar(), 10)).prop_map(|(op, keys, values)| {
        let mut m = serde_json::Map::new();
        m.insert("op".into(), op.into());
        for (k, v) in keys.into_iter().zip(values) {
            m.insert(k.into(), v);
        }
        Value::Object(m)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_bytes_get_error_lines(lines in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..20)) {
        let rt = runtime();
        let mut s = sim();
        for line in lines {
            match rt.block_on(s.line(&line)) {
                None => prop_assert!(line.iter().all(u8::is_ascii_whitespace)),
                Some(reply) => check(&reply)?,
            }
        }
    }

    #[test]
    fn random_events_get_one_reply_each(events in prop::collection::vec(event(), 1..40)) {
        let rt = runtime();
        let mut s = sim();
        for e in events {
            let text = serde_json::to_vec(&e).expect("encode");
            let reply = rt.block_on(s.line(&text)).expect("a reply");
            check(&reply)?;
            // Truncated JSON is an error too.
            if text.len() > 2 {
                let reply = rt.block_on(s.line(&text[..text.len() / 2])).expect("a reply");
                prop_assert_eq!(&reply["error"], "client");
            }
        }
    }
}

#[test]
fn odd_numbers_and_backwards_time_are_client_errors() {
    let rt = runtime();
    let mut s = sim();
    let mut ask = |v: Value| rt.block_on(s.event(&v));
    let cases = [
        (
            json!({"t": -1, "op": "request", "resource": "api", "domain": "d"}),
            "t: -1 is negative; counts start at 0",
        ),
        (
            json!({"t": 1.5, "op": "request", "resource": "api", "domain": "d"}),
            "t: 1.5 is not a whole number",
        ),
        (
            json!({"t": 1e300, "op": "request", "resource": "api", "domain": "d"}),
            "t: 1e+300 is too large (at most 9007199254740991)",
        ),
        (
            json!({"t": 18446744073709551615u64, "op": "request", "resource": "api", "domain": "d"}),
            "t: 18446744073709551615 is too large (at most 9007199254740991)",
        ),
        (
            json!({"t": "5", "op": "request", "resource": "api", "domain": "d"}),
            "t: expected a whole number, found the string \"5\"",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "api", "domain": "d", "copies": 0}),
            "copies must be at least 1",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "api", "domain": "d", "copies": 2, "min_copies": 3}),
            "min_copies (3) must not exceed copies (2)",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "api", "domain": 7}),
            "domain: expected a string, found the number 7",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "api"}),
            "domain: is required",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "api", "domain": "d", "copys": 1}),
            "copys: unknown field (expected one of: t, op, resource, domain, copies, min_copies, dry_run, session, id)",
        ),
        (
            json!({"t": 5, "op": "fly"}),
            "op: expected request, charge, refund, reserve, release, transfer, seize, end_session, get_capacity or release_capacity, found the string \"fly\"",
        ),
        (
            json!({"t": 5, "op": "request", "resource": "nope", "domain": "d"}),
            "unknown resource \"nope\"",
        ),
        (
            json!({"t": 5, "op": "release", "resource": "vm", "domain": "a", "groups": "g"}),
            "groups: expected a list, found the string \"g\"",
        ),
        (
            json!({"t": 5, "op": "transfer", "resource": "vm", "domain": "a"}),
            "ttl_ms: is required",
        ),
        (json!([1, 2]), "expected an event (a mapping), found a list"),
    ];
    // Every problem of a line is reported, each with its field.
    let reply = ask(json!({"t": -1, "op": "request", "domain": 7, "copys": 1}));
    assert_eq!(
        reply["message"],
        "copys: unknown field (expected one of: t, op, resource, domain, copies, min_copies, dry_run, session, id)\n\
         t: -1 is negative; counts start at 0\n\
         resource: is required\n\
         domain: expected a string, found the number 7",
        "{reply}"
    );
    for (event, message) in cases {
        let reply = ask(event.clone());
        assert_eq!(reply["error"], "client", "{event} -> {reply}");
        let got = reply["message"].as_str().expect("message");
        assert!(
            got.starts_with(message),
            "{event}: {got:?} does not start with {message:?}"
        );
    }
    assert_eq!(
        ask(json!({"t": 10, "op": "request", "resource": "api", "domain": "d"}))["granted"],
        1
    );
    let back = ask(json!({"t": 9, "op": "request", "resource": "api", "domain": "d"}));
    assert!(
        back["message"]
            .as_str()
            .expect("message")
            .starts_with("t went backwards: 9 < 10"),
        "{back}"
    );
    assert_eq!(back["t"], 9, "t is echoed");
    // A refused event changed nothing: the clock is still at 10.
    assert_eq!(
        ask(json!({"t": 10, "op": "request", "resource": "api", "domain": "d"}))["tier_hits"],
        2
    );
}
