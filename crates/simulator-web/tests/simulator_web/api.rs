//! The simulator's API through its router, without a socket.

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use charon_core::config::Config;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn call(method: &str, uri: &str, body: Option<Value>) -> (StatusCode, String, Vec<u8>) {
    let request = Request::builder().method(method).uri(uri);
    let request = match body {
        Some(b) => request
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => request.body(Body::empty()),
    }
    .expect("request");
    let response = charon_simulator_web::router()
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, content_type, bytes.to_vec())
}

pub(crate) async fn post(uri: &str, body: Value) -> (StatusCode, Value) {
    let (status, content_type, bytes) = call("POST", uri, Some(body)).await;
    assert!(
        content_type.starts_with("application/json"),
        "{uri} answered {content_type}"
    );
    let value = serde_json::from_slice(&bytes).expect("a JSON answer");
    (status, value)
}

fn penalty_tiers() -> Value {
    json!([
        { "limit": 5, "window": "1s", "cooldown": "0s" },
        { "limit": 25, "window": "1s", "active": "5s", "cooldown": "15s" }
    ])
}

fn events(ts: impl IntoIterator<Item = u64>) -> Vec<Value> {
    ts.into_iter().map(|t| json!({ "t": t })).collect()
}

/// (granted, tier, burst) of an event's reply.
fn gtb(event: &Value) -> (u64, u64, bool) {
    let r = &event["reply"];
    (
        r["granted"].as_u64().expect("granted"),
        r["tier"].as_u64().expect("tier"),
        r["burst"].as_bool().expect("burst"),
    )
}

/// The snapshot of tier `i` (one-indexed) in a list of tier snapshots.
fn tier(snapshots: &Value, i: usize) -> &Value {
    &snapshots[i - 1]
}

#[tokio::test]
async fn the_penalty_preset_bursts_fills_tier_2_and_cools_down() {
    // 31 requests at 0..30 ms, then 6 just after tier 2's active period.
    let mut ts: Vec<u64> = (0..31).collect();
    ts.extend(5_005..5_011);
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": penalty_tiers(), "events": events(ts), "at": 6_000 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let ev = out["events"].as_array().expect("events");
    assert_eq!(ev.len(), 37);

    assert_eq!(gtb(&ev[0]), (1, 1, true), "tier 0 bursts into tier 1");
    for e in &ev[1..5] {
        assert_eq!(gtb(e), (1, 1, false));
    }
    assert_eq!(gtb(&ev[5]), (1, 2, true), "the 6th hit bursts into tier 2");
    assert_eq!(ev[5]["placed"], json!([{ "tier": 2, "hits": 1 }]));
    let after_burst = &ev[5]["tiers"];
    assert_eq!(tier(after_burst, 2)["phase"], "active");
    assert_eq!(tier(after_burst, 2)["current"], true);
    assert_eq!(tier(after_burst, 2)["entered"], 5);
    assert_eq!(tier(after_burst, 2)["active_until"], 5_005);
    assert_eq!(tier(after_burst, 2)["cooldown_until"], 20_005);
    assert_eq!(tier(after_burst, 2)["hit_times"], json!([[5, 1]]));
    assert_eq!(tier(after_burst, 1)["phase"], "active");
    assert_eq!(tier(after_burst, 1)["shadowed"], true, "tier 1 is shadowed");
    assert_eq!(tier(after_burst, 1)["current"], false);
    assert_eq!(
        tier(after_burst, 1)["hit_times"],
        json!([[0, 1], [1, 1], [2, 1], [3, 1], [4, 1]])
    );

    for e in &ev[6..30] {
        assert_eq!(gtb(e), (1, 2, false));
    }
    assert_eq!(ev[29]["reply"]["tier_hits"], 25);
    assert_eq!(ev[29]["reply"]["tier_limit"], 25);
    assert_eq!(
        gtb(&ev[30]),
        (0, 2, false),
        "rejected: tier 2 is full and there is no tier 3"
    );
    assert_eq!(ev[30]["placed"], json!([]));

    // At 5005 tier 2 cools down and tier 1 is current again, its window
    // empty by now: five grants, then a rejection (no burst while cooling).
    for e in &ev[31..36] {
        assert_eq!(gtb(e), (1, 1, false));
        assert_eq!(tier(&e["tiers"], 2)["phase"], "cooldown");
        assert_eq!(tier(&e["tiers"], 1)["current"], true);
    }
    assert_eq!(gtb(&ev[36]), (0, 1, false), "no burst during cooldown");

    assert_eq!(
        out["totals"],
        json!({"requests": 37, "granted_requests": 35, "rejected_requests": 2, "granted_hits": 35, "bursts": 2})
    );
    assert_eq!(
        out["periods"],
        json!([
            [{ "entered": 0, "active_until": null, "cooldown_until": null }],
            [{ "entered": 5, "active_until": 5_005, "cooldown_until": 20_005 }]
        ])
    );
    let now = &out["now"];
    assert_eq!(now["t"], 6_000);
    assert_eq!(now["current_tier"], 1);
    assert_eq!(now["domain_hits_last_second"], 5);
    assert_eq!(tier(&now["tiers"], 2)["phase"], "cooldown");
    assert_eq!(tier(&now["tiers"], 2)["hits"], 0);
    assert_eq!(tier(&now["tiers"], 1)["hits"], 5);
    assert_eq!(out["resource"]["tiers"][1]["active"], "5s");
}

#[tokio::test]
async fn the_clock_alone_moves_the_now_snapshot() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": penalty_tiers(), "events": events(0..6), "at": 20_005 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let now = &out["now"];
    assert_eq!(tier(&now["tiers"], 2)["phase"], "inactive");
    assert_eq!(tier(&now["tiers"], 2)["entered"], Value::Null);
    assert_eq!(tier(&now["tiers"], 1)["hits"], 0, "the window emptied");
    assert_eq!(now["current_tier"], 1, "tier 1 never ends");
}

#[tokio::test]
async fn a_multi_hit_request_passes_through_tiers_and_min_copies_holds() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "tiers": penalty_tiers(),
            "events": [
                { "t": 0, "copies": 10 },
                { "t": 1, "copies": 30, "min_copies": 25 },
                { "t": 2, "copies": 30, "min_copies": 1 }
            ],
            "detail": "replies"
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let ev = &out["events"];
    assert_eq!(gtb(&ev[0]), (10, 2, true));
    assert_eq!(
        ev[0]["placed"],
        json!([{ "tier": 1, "hits": 5 }, { "tier": 2, "hits": 5 }])
    );
    assert_eq!(gtb(&ev[1]), (0, 2, false), "25 do not fit in the 20 left");
    assert_eq!(gtb(&ev[2]), (20, 2, false));
    assert_eq!(ev[2]["copies"], 30);
    assert_eq!(ev[2]["min_copies"], 1);
    assert!(
        ev[0].get("tiers").is_none(),
        "detail: replies has no snapshots"
    );
}

#[tokio::test]
async fn report_from_lists_only_recent_events_but_replays_all() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "tiers": penalty_tiers(),
            "events": events((0..31).chain([30_000])),
            "report_from": 30_000,
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["skipped"], 31);
    assert_eq!(out["events"][0]["index"], 31);
    assert_eq!(out["totals"]["requests"], 32);
    assert_eq!(
        out["periods"][1],
        json!([]),
        "tier 2's cooldown ended at 20005"
    );
}

#[tokio::test]
async fn hard_limit_and_millisecond_durations() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "hard_limit": 3,
            "tiers": [{ "limit": 5, "window": 1000, "cooldown": 0 }],
            "events": [{ "t": 0, "copies": 5, "min_copies": 1 }]
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let reply = &out["events"][0]["reply"];
    assert_eq!(reply["granted"], 3);
    assert_eq!(reply["hard_limit"], 3);
    assert_eq!(reply["hard_limited"], true);
    assert_eq!(out["resource"]["tiers"][0]["window"], "1s");
}

#[tokio::test]
async fn validation_errors_carry_body_paths() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "hard_limit": -1,
            "tiers": [
                { "limit": 5, "window": "1x" },
                { "limt": 25, "window": "1s", "active": "5s" }
            ],
            "events": [
                { "t": 10 },
                { "t": 5, "copies": 0 },
                { "t": 20, "copies": 2, "min_copies": 3 },
                { "t": "soon", "colour": "red" }
            ],
            "global_limit": 7
        }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"], "invalid");
    let paths: Vec<&str> = out["issues"]
        .as_array()
        .expect("issues")
        .iter()
        .map(|i| i["path"].as_str().expect("path"))
        .collect();
    for expected in [
        "global_limit",
        "hard_limit",
        "tiers[0].window",
        "tiers[1].limt",
        "tiers[1].limit",
        "events[1].t",
        "events[1]",
        "events[2]",
        "events[3].t",
        "events[3].colour",
    ] {
        assert!(paths.contains(&expected), "no issue at {expected}: {out}");
    }
    let message = out["message"].as_str().expect("message");
    assert!(
        message.contains("tiers[0].window: \"1x\" is not a duration"),
        "{message}"
    );
    // The configuration's fields and the events' are read by the same
    // checker (charon_core::fields): the same words for the same problem.
    for expected in [
        "hard_limit: -1 is negative; counts start at 0",
        "events[3].t: expected a whole number, found the string \"soon\"",
        "events[3].colour: unknown field (expected one of: t, op, copies, min_copies, dry_run)",
        "tiers[1].limt: unknown field (expected one of: limit, window, active, cooldown, skippable)",
    ] {
        assert!(message.contains(expected), "no {expected:?} in {message}");
    }
}

#[tokio::test]
async fn normalization_is_applied_and_reported() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "tiers": [
                { "limit": 5, "window": "1s" },
                { "limit": 9, "window": "2s", "active": "1s" },
                { "limit": 9, "window": "1s", "active": "0s" },
                { "limit": 25, "window": "2s", "active": "5s" }
            ],
            "events": []
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(
        out["adjustments"],
        json!([
            { "path": "tiers[1].window", "change": "2s shortened to the active period 1s" },
            { "path": "tiers[2]", "change": "removed: its active period is 0s" },
            { "path": "tiers[3].active", "change": "5s trimmed to 4s, a whole number of 2s windows" }
        ])
    );
    let tiers = out["resource"]["tiers"].as_array().expect("tiers");
    assert_eq!(tiers.len(), 3);
    assert_eq!(tiers[1]["window"], "1s");
    assert_eq!(tiers[2]["active"], "4s");
    assert_eq!(out["now"]["tiers"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn not_json_and_not_an_object() {
    let (status, _, bytes) = call(
        "POST",
        "/simulator/api/run",
        Some(Value::String("x".into())),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let out: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(out["issues"][0]["path"], "");

    let request = Request::builder()
        .method("POST")
        .uri("/simulator/api/run")
        .body(Body::from("{not json"))
        .expect("request");
    let response = charon_simulator_web::router()
        .oneshot(request)
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_event_cap_is_enforced() {
    let max = charon_simulator_web::MAX_EVENTS as u64;
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": penalty_tiers(), "events": events(0..max + 1) }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert_eq!(out["error"], "too_many_events");
    assert_eq!(out["max_events"], max);

    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": penalty_tiers(), "events": events(0..max), "detail": "replies" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["totals"]["requests"], max);
}

#[tokio::test]
async fn simulator_replay_work_is_bounded() {
    let tiers = |n: usize| {
        Value::Array(
            (0..n)
                .map(|i| json!({"limit": 10 * (i + 1), "window": "1s"}))
                .collect(),
        )
    };
    let max = charon_simulator_web::MAX_EVENT_TIERS;
    // At the bound: answered.
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": tiers(10), "events": events(0..(max / 10) as u64), "detail": "replies" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    // One tier more: refused before anything is replayed, naming the bound.
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": tiers(11), "events": events(0..(max / 10) as u64), "detail": "replies" }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert_eq!(out["error"], "too_much_work");
    assert_eq!(out["max_event_tiers"], max);
    assert!(
        out["message"]
            .as_str()
            .is_some_and(|m| m.contains("10000 events × 11 tiers")),
        "{out}"
    );
    // detail "full" lists at most MAX_LISTED_TIER_STATES tier states.
    let states = charon_simulator_web::MAX_LISTED_TIER_STATES;
    let n = (states / 32 + 1) as u64;
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "tiers": tiers(32).as_array().expect("tiers").iter().map(|t| {
            json!({"limit": t["limit"], "window": "1ms"})
        }).collect::<Vec<_>>(), "events": events(0..n) }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert_eq!(out["error"], "too_many_tier_states");
    assert_eq!(out["max_listed_tier_states"], states);
    // A body over the limit is refused as such.
    let padding = " ".repeat(charon_simulator_web::BODY_LIMIT);
    let (status, _, bytes) =
        call_raw("/simulator/api/run", format!("{{\"events\": []{padding}}}")).await;
    let out: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert_eq!(out["error"], "body_too_large");
}

async fn call_raw(uri: &str, body: String) -> (StatusCode, String, Vec<u8>) {
    let request = Request::builder()
        .method("POST")
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("request");
    let response = charon_simulator_web::router()
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let bytes = to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, String::new(), bytes.to_vec())
}

#[tokio::test]
async fn snapshots_too_large_are_refused_with_a_way_out() {
    let body = |detail: &str| {
        json!({
            "tiers": [{ "limit": 100_000, "window": "1h" }],
            "events": events(0..5_000),
            "detail": detail,
        })
    };
    let (status, out) = post("/simulator/api/run", body("full")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(out["error"], "too_many_hit_times");
    let (status, out) = post("/simulator/api/run", body("replies")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["now"]["tiers"][0]["hits"], 5_000);
}

#[tokio::test]
async fn yaml_export_parses_back_to_the_same_configuration() {
    let (status, out) = post(
        "/simulator/api/yaml",
        json!({ "name": "api/search", "hard_limit": 100, "tiers": penalty_tiers() }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let yaml = out["yaml"].as_str().expect("yaml");
    let (parsed, adjustments) = Config::from_yaml(yaml).expect("the export parses");
    assert!(adjustments.is_empty());
    let expected = json!({"resources": [{
        "name": "api/search", "kind": "rate", "hard_limit": 100, "tiers": penalty_tiers()
    }]});
    let (expected, _) = Config::from_value(&expected).expect("valid");
    assert_eq!(parsed, expected);
    assert!(yaml.contains("api/search"), "{yaml}");
}

#[tokio::test]
async fn yaml_export_needs_a_valid_name_and_reports_normalization() {
    let (status, out) = post("/simulator/api/yaml", json!({ "tiers": penalty_tiers() })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["issues"][0]["path"], "name");

    let (status, out) = post(
        "/simulator/api/yaml",
        json!({ "name": "api/x", "tiers": [{ "limit": 1, "window": "2s", "active": "1s" }] }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["adjustments"][0]["path"], "tiers[0].window");
    let (parsed, _) = Config::from_yaml(out["yaml"].as_str().expect("yaml")).expect("parses");
    let again = parsed.to_yaml();
    assert_eq!(
        again,
        out["yaml"].as_str().expect("yaml"),
        "already normalized"
    );
}

#[tokio::test]
async fn presets_hold_the_cookbook() {
    let (status, _, bytes) = call("GET", "/simulator/api/presets", None).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&bytes).expect("JSON");
    let ids: Vec<&str> = out["presets"]
        .as_array()
        .expect("presets")
        .iter()
        .map(|p| p["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        ids,
        [
            "simple",
            "penalty",
            "prison",
            "batch",
            "credits",
            "registrations",
            "sliding",
            "ban",
            "queue",
            "llm"
        ]
    );
    let penalty = &out["presets"][1];
    assert_eq!(penalty["tiers"][1]["limit"], 25);
    assert_eq!(out["max_events"], charon_simulator_web::MAX_EVENTS);
}

#[tokio::test]
async fn the_page_and_its_assets_are_served() {
    let response = charon_simulator_web::router()
        .oneshot(
            Request::get("/simulator")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("answer");
    let csp = response
        .headers()
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "the page loads nothing from elsewhere: {csp}"
    );
    let (status, content_type, bytes) = call("GET", "/simulator", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/html"));
    let html = String::from_utf8(bytes).expect("UTF-8");
    assert!(html.contains("/simulator/assets/simulator.js"));
    assert!(html.contains("/simulator/assets/simulator.css"));
    for (path, kind) in [
        ("/simulator/assets/simulator.js", "text/javascript"),
        ("/simulator/assets/simulator.css", "text/css"),
    ] {
        let (status, content_type, bytes) = call("GET", path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(!bytes.is_empty(), "{path}");
    }
    let (status, _, _) = call("GET", "/simulator/", None).await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
}

// ---- buckets, windows and queues (issue 11, SPEC §7–10) -------------------

/// Runs preset `id` with its script, as the page does when it is picked.
async fn run_preset(id: &str) -> Value {
    let (_, _, bytes) = call("GET", "/simulator/api/presets", None).await;
    let presets: Value = serde_json::from_slice(&bytes).expect("JSON");
    let preset = presets["presets"]
        .as_array()
        .expect("presets")
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no preset {id}"));
    let mut body = preset.as_object().expect("a mapping").clone();
    for key in ["id", "title", "summary", "script"] {
        body.remove(key);
    }
    body.insert("events".into(), preset["script"]["events"].clone());
    body.insert("at".into(), preset["script"]["at"].clone());
    let (status, out) = post("/simulator/api/run", Value::Object(body)).await;
    assert_eq!(status, StatusCode::OK, "preset {id}: {out}");
    out
}

fn reply(out: &Value, i: usize) -> &Value {
    &out["events"][i]["reply"]
}

#[tokio::test]
async fn the_credit_pool_refills_one_credit_a_minute_between_events() {
    let out = run_preset("credits").await;
    assert_eq!(out["kind"], "bucket");
    assert_eq!(out["limit"], 100);
    assert_eq!(reply(&out, 2)["remaining"], 40);
    assert_eq!(reply(&out, 3)["granted"], 2);
    assert_eq!(reply(&out, 3)["remaining"], 48);
    // The level between the events is the bucket's own: 40 at 10 min,
    // rising a credit a minute to 50 just before the GET.
    let e3 = &out["events"][3];
    assert_eq!(e3["before"]["remaining"], 50);
    assert_eq!(e3["after"]["remaining"], 48);
    let series = out["series"].as_array().expect("series");
    let mid = series
        .iter()
        .find(|l| {
            l["t"]
                .as_u64()
                .is_some_and(|t| (900_000..960_000).contains(&t))
        })
        .expect("a sample at 15 min");
    assert_eq!(mid["remaining"], 45, "{mid}");
    assert!(
        series
            .windows(2)
            .all(|p| p[0]["t"].as_u64() <= p[1]["t"].as_u64()),
        "the series is in time order"
    );
    assert_eq!(out["now"]["remaining"], 48);
    assert_eq!(out["totals"]["granted_hits"], 62);
}

#[tokio::test]
async fn registrations_per_ip_say_when_to_come_back() {
    let out = run_preset("registrations").await;
    for i in 0..20 {
        assert_eq!(reply(&out, i)["granted"], 1, "request {i}");
    }
    let r = reply(&out, 20);
    assert_eq!(
        (r["granted"].as_u64(), r["remaining"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(r["retry_after_ms"], 50);
    assert_eq!(reply(&out, 21)["granted"], 1);
    assert_eq!(out["totals"]["rejected_requests"], 1);
}

#[tokio::test]
async fn the_sliding_counter_shows_its_count_and_estimate() {
    let out = run_preset("sliding").await;
    let e = &out["events"][8];
    assert_eq!(e["reply"]["granted"], 1);
    assert_eq!(e["reply"]["remaining"], 0);
    // 30 % into the minute: 3 + floor(5 × 0.7) = 6 before, 7 after.
    assert_eq!(e["before"]["count"], 3);
    assert_eq!(e["before"]["previous"], 5);
    assert_eq!(e["before"]["estimate"], 6);
    assert_eq!(e["after"]["count"], 4);
    assert_eq!(e["after"]["estimate"], 7);
    assert_eq!(reply(&out, 9)["granted"], 0);
    // The window turns at 60 s: the count drops from 5 to 0 there.
    let series = out["series"].as_array().expect("series");
    let at = |t: u64| {
        series
            .iter()
            .find(|l| l["t"] == t)
            .unwrap_or_else(|| panic!("no reading at {t}"))
    };
    assert_eq!(at(59_999)["count"], 5);
    assert_eq!(at(60_000)["count"], 0);
    assert_eq!(at(60_000)["estimate"], 5);
}

#[tokio::test]
async fn a_ban_is_a_span_and_every_request_in_it_is_banned() {
    let out = run_preset("ban").await;
    assert_eq!(reply(&out, 0)["granted"], 2000);
    let first = reply(&out, 1);
    assert_eq!(first["granted"], 0);
    assert_eq!(first["banned"], true);
    assert_eq!(first["retry_after_ms"], 3_600_000);
    assert_eq!(reply(&out, 2)["banned"], true);
    assert_eq!(reply(&out, 2)["retry_after_ms"], 1_800_001);
    assert_eq!(reply(&out, 3)["retry_after_ms"], 1);
    assert_eq!(reply(&out, 4)["banned"], false);
    assert_eq!(reply(&out, 4)["granted"], 1);
    assert_eq!(out["bans"], json!([{ "from": 1, "until": 3_600_001 }]));
    assert_eq!(out["events"][2]["before"]["banned_until"], 3_600_001);
    assert!(out["now"].get("banned_until").is_none(), "{}", out["now"]);
    assert_eq!(out["totals"]["banned"], 3);
    assert_eq!(out["totals"]["bans"], 1);
}

#[tokio::test]
async fn the_queue_delays_then_rejects_and_shows_its_backlog() {
    let out = run_preset("queue").await;
    let delays: Vec<Value> = (0..6).map(|i| reply(&out, i)["delay_ms"].clone()).collect();
    assert_eq!(
        delays,
        [
            json!(0),
            json!(100),
            json!(200),
            json!(300),
            json!(400),
            json!(0)
        ]
    );
    assert_eq!(reply(&out, 5)["granted"], 0);
    assert_eq!(reply(&out, 5)["retry_after_ms"], 100);
    assert_eq!(out["events"][4]["after"]["usage"], 5);
    // The backlog drains at ten a second: 3 waiting at 250 ms (rounded up),
    // none from 500 ms, as the series shows.
    let series = out["series"].as_array().expect("series");
    let usage_at = |t: u64| {
        series
            .iter()
            .find(|l| l["t"] == t)
            .map(|l| l["usage"].clone())
            .unwrap_or_else(|| panic!("no reading at {t}"))
    };
    assert_eq!(usage_at(250), 3);
    assert_eq!(usage_at(500), 0);
    assert_eq!(out["now"]["usage"], 0);
}

#[tokio::test]
async fn llm_tokens_dry_run_then_charge_into_debt() {
    let out = run_preset("llm").await;
    let dry = &out["events"][0];
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["reply"]["granted"], 500);
    assert_eq!(dry["reply"]["remaining"], 500);
    assert_eq!(dry["after"]["remaining"], 1000, "a dry run records nothing");
    let charge = &out["events"][1];
    assert_eq!(charge["op"], "charge");
    assert_eq!(charge["reply"]["granted"], 1500);
    assert_eq!(charge["reply"]["remaining"], 0);
    assert_eq!(charge["reply"]["retry_after_ms"], 30_060);
    assert_eq!(charge["reply"]["warning"], true);
    assert_eq!(reply(&out, 2)["granted"], 0);
    assert_eq!(reply(&out, 3)["granted"], 1);
    assert_eq!(out["soft_threshold"], 800);
    assert_eq!(out["totals"]["charged"], 1500);
    assert_eq!(out["totals"]["dry_runs"], 1);
}

#[tokio::test]
async fn kinds_and_events_are_checked_with_body_paths() {
    let (status, out) = post(
        "/simulator/api/run",
        json!({ "kind": "copy", "events": [] }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["issues"][0]["path"], "kind", "{out}");

    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "tiers": penalty_tiers(),
            "events": [ { "t": 0, "op": "charge" }, { "t": 0, "dry_run": true }, { "t": 0, "op": "refund" } ]
        }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["issues"][0]["path"], "events[2].op", "{out}");
    let message = out["message"].as_str().expect("message");
    assert!(message.contains("refund"), "{message}");

    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "kind": "bucket", "burst": 0, "count": 1, "period": 1000, "tiers": [],
            "events": [ { "t": 0, "op": "refund", "min_copies": 1 } ]
        }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    let paths: Vec<&str> = out["issues"]
        .as_array()
        .expect("issues")
        .iter()
        .map(|i| i["path"].as_str().expect("path"))
        .collect();
    for expected in ["burst", "tiers", "events[0].min_copies"] {
        assert!(paths.contains(&expected), "no issue at {expected}: {out}");
    }
    assert!(
        !paths.contains(&"events[0].op"),
        "a broken bucket is still a bucket: {out}"
    );

    // A refund on a window is the limiter's client error, at the event.
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "kind": "window", "algorithm": "fixed", "limit": 2, "window": "1s",
            "events": [ { "t": 0 }, { "t": 1, "op": "refund" } ]
        }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["issues"][0]["path"], "events[1].op", "{out}");
    assert!(
        out["message"]
            .as_str()
            .expect("message")
            .contains("only for kind bucket"),
        "{out}"
    );
}

#[tokio::test]
async fn a_bucket_exports_as_yaml() {
    let (status, out) = post(
        "/simulator/api/yaml",
        json!({ "name": "api/credits", "kind": "bucket", "burst": 100, "count": 1, "period": 60_000, "soft_limit": "80%" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let yaml = out["yaml"].as_str().expect("yaml");
    for needle in [
        "kind: bucket",
        "burst: 100",
        "period: 1m",
        "soft_limit: 80%",
    ] {
        assert!(yaml.contains(needle), "no {needle:?} in\n{yaml}");
    }
}

#[tokio::test]
async fn burst_tiers_take_dry_runs_and_charges_with_the_reply_context() {
    // Tier 1 holds 5 a second. The first request enters it; a charge of 3
    // lands in it (no burst), a dry run of 2 would burst into tier 2 and
    // records nothing, so the request after it still finds tier 1's last
    // place, and then tier 2's 25 as the most a request could get.
    let (status, out) = post(
        "/simulator/api/run",
        json!({
            "tiers": penalty_tiers(),
            "soft_limit": "80%",
            "events": [
                { "t": 0, "copies": 1 },
                { "t": 1, "op": "charge", "copies": 3 },
                { "t": 2, "copies": 2, "dry_run": true },
                { "t": 3, "copies": 1 }
            ]
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let events = out["events"].as_array().expect("events");
    assert_eq!(gtb(&events[0]), (1, 1, true), "{out}");
    // The charge is recorded in tier 1 (4 of 5 hits: at the 80 % soft limit);
    // the most a request could now get is tier 1's last place and tier 2's 25.
    assert_eq!(gtb(&events[1]), (3, 1, false), "{out}");
    assert_eq!(events[1]["reply"]["remaining"], 26, "{out}");
    assert_eq!(events[1]["reply"]["warning"], true, "{out}");
    // The dry run of 2 would burst into tier 2; it records nothing.
    assert_eq!(gtb(&events[2]), (2, 2, true), "{out}");
    // So the next request still finds tier 1 with one place left.
    assert_eq!(gtb(&events[3]), (1, 1, false), "{out}");
    assert_eq!(events[3]["reply"]["limit"], 5, "{out}");
    assert_eq!(events[3]["reply"]["remaining"], 25, "{out}");
    // A dry run's grant is not a hit.
    assert_eq!(out["totals"]["granted_hits"], 5, "{out}");
    assert_eq!(out["totals"]["bursts"], 1, "{out}");
}

/// The throttler view: the same run with each discipline, decided by
/// charon-core's machine on the server.
async fn throttle_run(discipline: &str, overload: f64) -> Value {
    let (status, v) = post(
        "/simulator/api/throttle",
        json!({"discipline": discipline, "capacity": 1000, "queue_ms": 100, "max_wait_ms": 200,
               "cheap_ms": 1, "expensive_ms": 40, "expensive_share": 0.1, "critical_share": 0.2,
               "overload": overload, "seconds": 20, "seed": 7}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

#[tokio::test]
async fn the_throttler_view_shows_a_throttler_that_keeps_the_service_useful_under_overload() {
    let none = throttle_run("none", 3.0).await;
    let cost = throttle_run("cost", 3.0).await;
    let qps = throttle_run("qps", 3.0).await;
    let s = |v: &Value, k: &str| v["summary"][k].as_f64().unwrap_or(f64::NAN);
    // The same arrivals (same seed) in every run.
    assert_eq!(none["summary"]["arrivals"], cost["summary"]["arrivals"]);
    assert_eq!(s(&none, "rejected"), 0.0);
    // Without a throttler the backlog grows and little finishes in time;
    // with one, the service does useful work and CRITICAL requests get in.
    assert!(s(&none, "goodput") < 0.3, "{}", none["summary"]);
    assert!(s(&cost, "goodput") > 0.8, "{}", cost["summary"]);
    assert!(s(&cost, "critical_success") > 0.9, "{}", cost["summary"]);
    assert!(s(&cost, "evicted") > 0.0 && s(&cost, "rejected") > 0.0);
    assert!(s(&qps, "goodput") > 0.5, "{}", qps["summary"]);
    let timeline = cost["timeline"].as_array().expect("timeline");
    assert_eq!(timeline.len(), 200, "20 s in buckets of 100 ms");
    // The queue never holds more than its 100 CPU-ms.
    assert!(
        timeline
            .iter()
            .all(|b| b["queue_units"].as_f64().unwrap_or(0.0) <= 100.0)
    );
    // The same body gives the same answer.
    assert_eq!(throttle_run("cost", 3.0).await, cost);
}

#[tokio::test]
async fn the_throttler_view_refuses_bad_fields_and_oversized_runs_by_path() {
    let (status, v) = post(
        "/simulator/api/throttle",
        json!({"discipline": "fast", "capacity": -1, "colour": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("discipline: expected qps, cost or none"),
        "{message}"
    );
    assert!(
        message.contains("capacity: -1 is out of range"),
        "{message}"
    );
    assert!(message.contains("colour: unknown field"), "{message}");
    let (status, v) = post(
        "/simulator/api/throttle",
        json!({"capacity": 100000, "cheap_ms": 0.001, "expensive_share": 0, "overload": 20, "seconds": 120}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("a run makes at most 200000"),
        "{v}"
    );
}
