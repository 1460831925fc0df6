//! The configuration API keeps the `envoy:` section (SPEC §11): imported
//! with the rest of the configuration, exported as it was normalized,
//! validated by path on import and on every resource edit, and carried by
//! the change feed; on SQLite and on a private PostgreSQL.

use crate::support;

use serde_json::json;
use support::{TestDb, resource_path};

/// SPEC §11's example as docs/envoy.md shows it, with the resource it
/// names.
const WITH_ENVOY: &str = include_str!("../../../../examples/envoy.yaml");

/// What `charon config check` prints for [`WITH_ENVOY`]'s section: the API
/// exports the same normalized YAML.
const ENVOY_EXPORTED: &str = "\
envoy:
  shadow_mode: false
  headers: false
  unknown_domain: ok
  match: deepest
  record: all_or_nothing
  windows: fixed
  descriptor_limits: ignore
  domains:
  - domain: edge
    descriptors:
    - key: generic_key
      value: search
      descriptors:
      - key: remote_address
        mask:
          ipv4: 32
          ipv6: 48
        resource: api/search
    - key: tenant
      rate_limit:
        unit: minute
        requests_per_unit: 100
      shadow_mode: true
    - key: health
      unlimited: true
";

async fn envoy_section_round_trips(db: TestDb) {
    let app = db.app().await;
    let dry = app
        .put("/v1/config?dry_run=true")
        .body("application/yaml", WITH_ENVOY)
        .expect(200)
        .await;
    let kinds: Vec<&str> = dry.json["diff"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["resource", "envoy"]);
    let done = app
        .put("/v1/config")
        .body("application/yaml", WITH_ENVOY)
        .expect(200)
        .await;
    assert_eq!(done.json["version"], 1);

    let yaml = app.get("/v1/config?format=yaml").expect(200).await.text;
    assert!(yaml.ends_with(ENVOY_EXPORTED), "{yaml}");
    let exported = app.get("/v1/config").expect(200).await.json;
    assert_eq!(exported["envoy"]["domains"][0]["domain"], "edge");
    assert_eq!(
        exported["envoy"]["domains"][0]["descriptors"][1]["rate_limit"],
        json!({"unit": "minute", "requests_per_unit": 100})
    );

    // The export imported again changes nothing, so the version stays.
    let again = app
        .put("/v1/config")
        .body("application/yaml", &yaml)
        .expect(200)
        .await;
    assert_eq!(again.json["changed"], false);
    assert_eq!(again.json["version"], 1);

    // Changing the section alone is one commit with one diff entry; the
    // feed's delta carries it whole.
    let changed = WITH_ENVOY.replace("requests_per_unit: 100", "requests_per_unit: 50");
    let done = app
        .put("/v1/config")
        .body("application/yaml", &changed)
        .expect(200)
        .await;
    assert_eq!(done.json["version"], 2);
    assert_eq!(done.json["diff"].as_array().unwrap().len(), 1);
    assert_eq!(done.json["diff"][0]["kind"], "envoy");
    let delta = app.get("/v1/changes?since=1").expect(200).await.json;
    assert_eq!(delta["snapshot"], false);
    assert_eq!(
        delta["envoy"]["domains"][0]["descriptors"][1]["rate_limit"]["requests_per_unit"],
        50
    );
    assert!(delta["resources"].as_array().unwrap().is_empty());
    let snapshot = app.get("/v1/changes").expect(200).await.json;
    assert_eq!(snapshot["envoy"]["domains"][0]["domain"], "edge");
    // Nothing changed for the section since version 2: not in the delta.
    app.put(&resource_path("other/r"))
        .json(json!({"kind": "window", "algorithm": "fixed", "limit": 1, "window": "1s"}))
        .send()
        .await
        .expect(201);
    let delta = app.get("/v1/changes?since=2").expect(200).await.json;
    assert!(delta.get("envoy").is_none(), "{delta}");

    // Removing it: the export has none, the delta says so.
    let removed = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - { name: api/search, kind: bucket, burst: 10, count: 10, period: 1s }\n  - { name: other/r, kind: window, algorithm: fixed, limit: 1, window: 1s }\n",
        )
        .expect(200)
        .await;
    assert_eq!(removed.json["diff"][0]["kind"], "envoy");
    assert_eq!(removed.json["diff"][0]["op"], "remove");
    assert!(
        app.get("/v1/config")
            .expect(200)
            .await
            .json
            .get("envoy")
            .is_none()
    );
    let delta = app.get("/v1/changes?since=3").expect(200).await.json;
    assert_eq!(delta["envoy_removed"], true);
    assert!(delta.get("envoy").is_none());
}

async fn envoy_section_is_validated_by_path_on_import_and_edit(db: TestDb) {
    let app = db.app().await;
    let bad = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources: []\nenvoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - { key: a, rate_limit: { unit: fortnight, requests_per_unit: 1 } }\n        - { key: b, value: x, mask: {} }\n",
        )
        .expect(400)
        .await;
    assert_eq!(
        bad.problem_paths(),
        [
            "envoy.domains[0].descriptors[0].rate_limit.unit",
            "envoy.domains[0].descriptors[1].mask",
        ]
    );
    // References are checked once the section parses.
    let refs = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - { name: vm, kind: copy, domain_limit: 1 }\nenvoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - { key: b, resource: vm }\n        - { key: c, resource: nowhere }\n",
        )
        .expect(400)
        .await;
    assert_eq!(
        refs.problem_paths(),
        [
            "envoy.domains[0].descriptors[0].resource",
            "envoy.domains[0].descriptors[1].resource",
        ]
    );
    assert_eq!(app.version().await, 0);
    app.put("/v1/config")
        .body("application/yaml", WITH_ENVOY)
        .expect(200)
        .await;
    // A resource the section names cannot be deleted, nor made
    // copy-limited: the problem names the node that stands in the way, and
    // nothing is committed.
    let del = app.delete(&resource_path("api/search")).expect(400).await;
    assert_eq!(
        del.problem_paths(),
        ["envoy.domains[0].descriptors[0].descriptors[0].resource"]
    );
    let copy = app
        .put(&resource_path("api/search"))
        .json(json!({"kind": "copy", "domain_limit": 3}))
        .send()
        .await
        .expect(400);
    assert_eq!(
        copy.problem_paths(),
        ["envoy.domains[0].descriptors[0].descriptors[0].resource"]
    );
    assert_eq!(app.version().await, 1);
    // Other edits go through, and a rate-like kind is fine.
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "window", "algorithm": "fixed", "limit": 5, "window": "1s"}))
        .send()
        .await
        .expect(200);
    assert_eq!(app.version().await, 2);
    let exported = app.get("/v1/config").expect(200).await.json;
    assert_eq!(exported["envoy"]["domains"][0]["domain"], "edge");
}

on_both_databases!(
    envoy_section_round_trips,
    envoy_section_is_validated_by_path_on_import_and_edit,
);

/// The OpenAPI document describes the section where it travels: in the
/// imported and exported configuration and in the change feed, nodes
/// nested by reference.
#[test]
fn the_openapi_document_describes_the_envoy_section() {
    let doc: serde_json::Value =
        serde_json::from_str(charon_config_service::openapi_json()).unwrap();
    let schemas = &doc["components"]["schemas"];
    for holder in ["ConfigDocument", "ExportedConfig", "Changes"] {
        let envoy = serde_json::to_string(&schemas[holder]["properties"]["envoy"]).unwrap();
        assert!(
            envoy.contains("#/components/schemas/EnvoySection"),
            "{holder}: {envoy}"
        );
    }
    assert_eq!(
        schemas["Changes"]["properties"]["envoy_removed"]["type"],
        "boolean"
    );
    let node = &schemas["EnvoyNode"];
    assert_eq!(node["additionalProperties"], false);
    assert_eq!(
        node["properties"]["descriptors"]["type"],
        json!(["array", "null"]),
        "{node}"
    );
    assert_eq!(
        node["properties"]["descriptors"]["items"]["$ref"],
        "#/components/schemas/EnvoyNode"
    );
    let domain = &schemas["EnvoyDomain"];
    assert_eq!(
        domain["properties"]["same_slot"]["type"],
        json!(["boolean", "null"]),
        "{domain}"
    );
    assert_eq!(
        schemas["EnvoyUnit"]["enum"],
        json!(["second", "minute", "hour", "day", "week", "month", "year"])
    );
    let limit = &schemas["EnvoyLimit"];
    assert_eq!(limit["additionalProperties"], false, "{limit}");
    assert!(limit["properties"].get("conditions").is_some(), "{limit}");
    assert_eq!(
        domain["properties"]["limits"]["items"]["$ref"], "#/components/schemas/EnvoyLimit",
        "{domain}"
    );
    let names = &schemas["EnvoySection"]["properties"]["header_names"];
    assert!(
        names
            .to_string()
            .contains("#/components/schemas/EnvoyHeaderNames"),
        "{names}"
    );
    for field in ["name", "replaces", "share_threshold", "detailed_metric"] {
        assert!(node["properties"].get(field).is_some(), "{field}: {node}");
    }
}
