//! The hot-page stampede view (`POST /simulator/api/stampede`): the same
//! callers run with no limit, with a copy limit and retries with back-off,
//! and with `wait_mode: shared_result`, every copy decision made by the
//! `charon simulate` runner.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::api::post;

async fn stampede(body: Value) -> (StatusCode, Value) {
    post("/simulator/api/stampede", body).await
}

/// The figures of `mode` in an answer.
fn mode<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["modes"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mode"] == name))
        .unwrap_or_else(|| panic!("no mode {name} in {answer}"))
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {key} in {v}"))
}

#[tokio::test]
async fn shared_result_computes_once_and_answers_every_caller() {
    let body = json!({"callers": 200, "work_ms": 50, "spread_ms": 40, "backoff_ms": 10, "seed": 3});
    let (status, answer) = stampede(body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (none, backoff, shared) = (
        mode(&answer, "no_limit"),
        mode(&answer, "backoff"),
        mode(&answer, "shared_result"),
    );
    // All come before the first result is cached: without a limit every
    // caller computes; with one, once.
    assert_eq!(n(none, "computations"), 200, "{none}");
    assert_eq!(n(none, "copy_ops"), 0, "{none}");
    assert_eq!(n(backoff, "computations"), 1, "{backoff}");
    assert_eq!(n(shared, "computations"), 1, "{shared}");
    // Every caller of every mode got its result, one way or another.
    for m in [none, backoff, shared] {
        assert_eq!(
            n(m, "computations") + n(m, "result_ready") + n(m, "from_cache"),
            200,
            "{m}"
        );
        let histogram: u64 = m["histogram"]
            .as_array()
            .expect("histogram")
            .iter()
            .filter_map(Value::as_u64)
            .sum();
        assert_eq!(histogram, 200, "{m}");
        assert!(n(m, "p50_ms") <= n(m, "p99_ms"), "{m}");
    }
    // Those that came while it computed were woken with the result ready;
    // nobody waited longer than the computation.
    assert!(n(shared, "result_ready") > 0, "{shared}");
    assert!(n(shared, "max_ms") <= 50, "{shared}");
    // Waiting costs one reserve per caller; retrying costs more, and the
    // result reaches retrying callers later.
    assert!(
        n(backoff, "copy_ops") > n(shared, "copy_ops"),
        "{backoff} vs {shared}"
    );
    assert!(n(shared, "copy_ops") <= 201, "{shared}");
    assert!(
        n(backoff, "p99_ms") > n(shared, "p99_ms"),
        "{backoff} vs {shared}"
    );
    // Deterministic for a seed; another seed gives other arrivals.
    assert_eq!(stampede(body).await.1, answer);
    let (_, other) = stampede(
        json!({"callers": 200, "work_ms": 50, "spread_ms": 40, "backoff_ms": 10, "seed": 4}),
    )
    .await;
    assert_ne!(other["modes"], answer["modes"]);
}

#[tokio::test]
async fn a_stampede_after_the_result_is_cached_reads_the_cache() {
    // Arrivals over 10 s and a 5 ms computation: most callers find the
    // result cached by the first one, in every limited mode.
    let (status, answer) =
        stampede(json!({"callers": 50, "work_ms": 5, "spread_ms": 10_000, "seed": 1})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    for name in ["backoff", "shared_result"] {
        let m = mode(&answer, name);
        assert_eq!(n(m, "computations"), 1, "{m}");
        assert!(n(m, "from_cache") >= 45, "{m}");
    }
}

#[tokio::test]
async fn the_stampede_view_refuses_bad_input_and_too_costly_runs() {
    for (body, expect) in [
        (
            json!({"callers": 0}),
            "callers: 0 is out of range (1 to 1000)",
        ),
        (
            json!({"callers": 1001}),
            "callers: 1001 is out of range (1 to 1000)",
        ),
        (json!({"work_ms": -5}), "work_ms"),
        (
            json!({"work_ms": 1_000_000_000}),
            "work_ms: 1000000000 is out of range (1 to 60000)",
        ),
        (json!({"spread_ms": 1e12}), "spread_ms"),
        (json!({"colour": 1}), "colour: unknown field"),
        (
            json!({"callers": 1000, "work_ms": 60000, "backoff_ms": 1}),
            "a run makes at most 200000",
        ),
    ] {
        let (status, v) = stampede(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(message.contains(expect), "{body}: {message}");
    }
}
