//! The cookbook of the blog post (`seeds/000_…`) and the paper (§2.3), as
//! the page offers them. Durations are the strings of SPEC §6 so that a
//! preset reads like the configuration it exports to.

use serde_json::{Value, json};

/// Every preset: `id`, `title`, `summary` (what the blog post says it is
/// for), and the configuration fields of a `/run` body.
pub(crate) fn all() -> Value {
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
        }
    ])
}

#[cfg(test)]
mod tests {
    use charon_core::config::Config;
    use serde_json::json;

    #[test]
    fn every_preset_is_a_valid_configuration_that_normalization_leaves_alone() {
        let presets = super::all();
        let presets = presets.as_array().expect("a list");
        assert_eq!(presets.len(), 4);
        for p in presets {
            let resource = json!({"name": p["name"], "kind": "rate", "tiers": p["tiers"]});
            let (_, adjustments) = Config::from_value(&json!({ "resources": [resource] }))
                .unwrap_or_else(|e| panic!("preset {}: {e}", p["id"]));
            assert!(
                adjustments.is_empty(),
                "preset {}: {adjustments:?}",
                p["id"]
            );
        }
    }
}
