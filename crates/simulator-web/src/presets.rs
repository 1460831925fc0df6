//! The cookbook of the blog post (`seeds/000_…`) and the paper (§2.3), and
//! the recipes of issue 11 for buckets, windows and queues (seeds 001, 002,
//! 004; `examples/limits.yaml`, `crates/cli/tests/cli/cookbook.rs`), as the page
//! offers them. Durations are the strings of SPEC §6 so that a preset reads
//! like the configuration it exports to.
//!
//! A preset of a bucket, a window or a queue carries a `script`: the
//! cookbook's events (`events` as in a `/run` body), the clock to show them
//! at (`at`) and a timeline `span` wide enough for them. The page loads
//! them with the clock paused, so a preset shows the recipe's figures at
//! once.

use serde_json::{Value, json};

/// Every preset: `id`, `title`, `summary` (what the source says it is
/// for), the configuration fields of a `/run` body (`kind` absent for the
/// burst tiers) and, for the other kinds, a `script`.
pub(crate) fn all() -> Value {
    let at = |times: &[u64]| times.iter().map(|t| json!({ "t": t })).collect::<Vec<_>>();
    // Twenty at once, the 21st at the same instant, one more 50 ms later.
    let mut times = vec![0; 21];
    times.push(50);
    let registrations = at(&times);
    let sliding = at(&[
        0, 10_000, 20_000, 30_000, 40_000, 70_000, 70_000, 70_000, 78_000, 78_000,
    ]);
    let queue = at(&[0; 6]);
    json!([
        {
            "id": "simple",
            "title": "Simple",
            "summary": "Five requests per second, no burst: the sixth request in any second is rejected.",
            "name": "api/simple",
            "tiers": [
                { "limit": 5, "window": "1s", "cooldown": "0s", "skippable": false }
            ]
        },
        {
            "id": "penalty",
            "title": "Penalty",
            "summary": "Five per second; a burst enters tier 2 (25 per second) for five seconds, then tier 2 cools down for fifteen: one burst every twenty seconds at most.",
            "name": "api/search",
            "tiers": [
                { "limit": 5, "window": "1s", "cooldown": "0s", "skippable": false },
                { "limit": 25, "window": "1s", "active": "5s", "cooldown": "15s", "skippable": false }
            ]
        },
        {
            "id": "prison",
            "title": "Punishment (prison)",
            "summary": "Five per second; the request that bursts is granted into a prison tier that allows one hit per fifteen seconds and stays active fifteen seconds: a fifteen-second ban.",
            "name": "api/login",
            "tiers": [
                { "limit": 5, "window": "1s", "cooldown": "0s", "skippable": false },
                { "limit": 1, "window": "15s", "active": "15s", "cooldown": "0s", "skippable": false }
            ]
        },
        {
            "id": "batch",
            "title": "Batch",
            "summary": "The first request opens a fifteen-second window for fifty requests; then nothing for thirty seconds (the blog's cranked-down nightly job).",
            "name": "reports/api",
            "tiers": [
                { "limit": 50, "window": "15s", "active": "15s", "cooldown": "30s", "skippable": false }
            ]
        },
        {
            "id": "credits",
            "title": "Credit pool (bucket)",
            "summary": "Seed 004's weighted credit pool: 100 credits, one back a minute, a call costs its copies. Three POSTs of 20 at 10 min leave 40; a GET of 2 at 20 min is granted with 48 left (ten came back).",
            "name": "api/credits",
            "kind": "bucket",
            "burst": 100, "count": 1, "period": "1m",
            "script": {
                "events": [
                    { "t": 600_000, "copies": 20 },
                    { "t": 600_000, "copies": 20 },
                    { "t": 600_000, "copies": 20 },
                    { "t": 1_200_000, "copies": 2 }
                ],
                "at": 1_200_000,
                "span": 1_800_000
            }
        },
        {
            "id": "registrations",
            "title": "Registrations per IP (bucket)",
            "summary": "Seed 002's new registrations per IP: burst 20, 20 per second. Twenty at once are granted, the 21st is told to retry after 50 ms, and one 50 ms later is granted.",
            "name": "acme/new-registrations",
            "kind": "bucket",
            "burst": 20, "count": 20, "period": "1s",
            "script": {
                "events": registrations,
                "at": 50,
                "span": 10_000
            }
        },
        {
            "id": "sliding",
            "title": "Sliding counter (window)",
            "summary": "Seed 001's sliding counter: 7 a minute. Five hits in the first minute and three at 70 s; at 78 s (30 % into the minute) the estimate is 3 + floor(5 × 0.7) = 6, so one more is granted and the next rejected.",
            "name": "edge/search",
            "kind": "window",
            "algorithm": "sliding_counter", "limit": 7, "window": "1m",
            "script": {
                "events": sliding,
                "at": 78_000,
                "span": 120_000
            }
        },
        {
            "id": "ban",
            "title": "Throttle and ban (window)",
            "summary": "Seed 001's login throttle: 2,000 per 1,200 s, ban 1 h. A request of 2,000 copies fills the window; the next is rejected and bans the client: every request in the next hour is rejected as banned, even after the window turned, and the first after the hour is decided normally.",
            "name": "edge/login",
            "kind": "window",
            "algorithm": "fixed", "limit": 2000, "window": "1200s", "ban": "1h",
            "script": {
                "events": [
                    { "t": 0, "copies": 2000 },
                    { "t": 1 },
                    { "t": 1_800_000 },
                    { "t": 3_600_000 },
                    { "t": 3_600_001 }
                ],
                "at": 3_600_001,
                "span": 7_200_000
            }
        },
        {
            "id": "queue",
            "title": "Queue 10/s, size 5",
            "summary": "Seed 001's shaping queue: ten a second leave, five may wait. Six requests at once: five are admitted with delays 0, 100, 200, 300 and 400 ms, the sixth is rejected, told to retry after 100 ms; the backlog drains in half a second.",
            "name": "batch/exports",
            "kind": "queue",
            "rate": 10, "period": "1s", "size": 5,
            "script": {
                "events": queue,
                "at": 1_000,
                "span": 10_000
            }
        },
        {
            "id": "llm",
            "title": "LLM tokens (dry run, charge)",
            "summary": "1,000 tokens a minute. A dry run of 500 before the call is granted and records nothing; a charge of the 1,500 tokens used after it leaves the bucket 500 in debt (soft limit 80 %: a warning) and rejects until 30.06 s, when the debt is paid back by time.",
            "name": "llm/tokens",
            "kind": "bucket",
            "burst": 1000, "count": 1000, "period": "1m", "soft_limit": "80%",
            "script": {
                "events": [
                    { "t": 0, "copies": 500, "dry_run": true },
                    { "t": 0, "op": "charge", "copies": 1500 },
                    { "t": 10_000 },
                    { "t": 30_060 }
                ],
                "at": 30_060,
                "span": 60_000
            }
        }
    ])
}

#[cfg(test)]
mod tests {
    use charon_core::config::Config;
    use serde_json::json;

    /// The configuration fields of a preset, as a resource.
    fn resource(p: &serde_json::Value) -> serde_json::Value {
        let mut r = p.as_object().expect("a preset is a mapping").clone();
        for key in ["id", "title", "summary", "script"] {
            r.remove(key);
        }
        r.entry("kind").or_insert_with(|| json!("rate"));
        serde_json::Value::Object(r)
    }

    #[test]
    fn every_preset_is_a_valid_configuration_that_normalization_leaves_alone() {
        let presets = super::all();
        let presets = presets.as_array().expect("a list");
        assert_eq!(presets.len(), 10);
        for p in presets {
            let (_, adjustments) = Config::from_value(&json!({ "resources": [resource(p)] }))
                .unwrap_or_else(|e| panic!("preset {}: {e}", p["id"]));
            assert!(
                adjustments.is_empty(),
                "preset {}: {adjustments:?}",
                p["id"]
            );
            let scripted = p.get("script").is_some();
            assert_eq!(scripted, p.get("kind").is_some(), "preset {}", p["id"]);
        }
    }
}
