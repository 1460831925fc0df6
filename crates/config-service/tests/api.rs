//! The configuration API, endpoint by endpoint, on SQLite and on a private
//! PostgreSQL: the same scenarios run on both (`sqlite::*` and `postgres`).

#![allow(clippy::unwrap_used)]

mod support;

use axum::http::{Method, header};
use charon_config_service::{StoreOptions, Tokens};
use serde_json::{Value, json};
use support::{READER, TestDb, resource_path, seg};

on_both_databases!(
    resources_are_created_read_replaced_and_deleted,
    post_creates_once,
    every_validation_problem_is_reported_and_nothing_changes,
    normalization_is_visible_in_what_is_read_back,
    overrides_are_edited_one_domain_at_a_time,
    groups_and_their_members,
    namespaces_are_created_read_and_deleted,
    stale_if_match_is_refused_with_412,
    writes_need_a_write_token,
    reads_may_need_a_token,
    credentials_are_checked_before_the_request,
    changes_since_give_deltas_and_snapshots,
    history_older_than_kept_gives_a_snapshot,
    import_and_export_round_trip,
    import_refuses_bad_documents,
    concurrent_writes_get_distinct_versions,
    unknown_paths_and_methods_answer_json,
);

fn search() -> Value {
    json!({
        "kind": "rate",
        "hard_limit": 100,
        "tiers": [
            {"limit": 5, "window": "1s"},
            {"limit": 25, "window": "1s", "active": "5s", "cooldown": "15s"}
        ]
    })
}

fn vm_doc() -> Value {
    json!({
        "kind": "copy",
        "domain_limit": 4,
        "global_limit": 100,
        "groups": [{"name": "probation", "limit": 5, "domains": ["new-1"]}]
    })
}

async fn resources_are_created_read_replaced_and_deleted(db: TestDb) {
    let app = db.app().await;
    let path = resource_path("api/search");
    assert_eq!(path, "/v1/resources/api%2Fsearch");

    let created = app.put(&path).json(search()).send().await.expect(201);
    assert_eq!(created.json["version"], 1);
    assert_eq!(created.json["changed"], true);
    assert_eq!(created.etag(), 1);
    assert_eq!(created.json["resource"]["name"], "api/search");
    // Read back in the normalized, explicit form.
    let read = app.get(&path).anonymous().send().await.expect(200);
    assert_eq!(read.etag(), 1);
    assert_eq!(
        read.json,
        json!({
            "name": "api/search", "kind": "rate", "hard_limit": 100,
            "tiers": [
                {"limit": 5, "window": "1s", "cooldown": "0s", "skippable": false},
                {"limit": 25, "window": "1s", "active": "5s", "cooldown": "15s", "skippable": false}
            ]
        })
    );

    // The same again is not a commit.
    let same = app
        .put(&path)
        .json(read.json.clone())
        .send()
        .await
        .expect(200);
    assert_eq!(same.json["changed"], false);
    assert_eq!(same.json["version"], 1);

    // Replace: lower the first tier.
    let mut lower = search();
    lower["tiers"][0]["limit"] = json!(3);
    let replaced = app.put(&path).json(lower).send().await.expect(200);
    assert_eq!(replaced.json["version"], 2);
    assert_eq!(replaced.json["resource"]["tiers"][0]["limit"], 3);

    app.put(&resource_path("sandbox/vm"))
        .json(vm_doc())
        .send()
        .await
        .expect(201);
    app.put(&resource_path("top"))
        .json(vm_doc())
        .send()
        .await
        .expect(201);
    let list = app.get("/v1/resources").send().await.expect(200);
    assert_eq!(list.json["version"], 4);
    let names: Vec<&str> = list.json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api/search", "sandbox/vm", "top"]);
    let api = app
        .get("/v1/resources?namespace=api")
        .send()
        .await
        .expect(200);
    assert_eq!(api.json["resources"].as_array().unwrap().len(), 1);
    let default = app
        .get("/v1/resources?namespace=default")
        .send()
        .await
        .expect(200);
    assert_eq!(default.json["resources"][0]["name"], "top");

    let deleted = app.delete(&path).send().await.expect(200);
    assert_eq!(deleted.json, json!({"version": 5, "changed": true}));
    assert_eq!(deleted.etag(), 5);
    let gone = app.get(&path).send().await.expect(404);
    assert_eq!(gone.json["error"], "not_found");
    app.delete(&path).send().await.expect(404);
    assert_eq!(app.version().await, 5);
}

async fn post_creates_once(db: TestDb) {
    let app = db.app().await;
    let mut body = vm_doc();
    body["name"] = json!("sandbox/vm");
    let created = app
        .post("/v1/resources")
        .json(body.clone())
        .send()
        .await
        .expect(201);
    assert_eq!(created.json["resource"]["name"], "sandbox/vm");
    let again = app
        .post("/v1/resources")
        .json(body)
        .send()
        .await
        .expect(409);
    assert_eq!(again.json["error"], "already_exists");
    let nameless = app
        .post("/v1/resources")
        .json(vm_doc())
        .send()
        .await
        .expect(400);
    assert_eq!(nameless.problem_paths(), ["name"]);
    assert_eq!(app.version().await, 1);
}

async fn every_validation_problem_is_reported_and_nothing_changes(db: TestDb) {
    let app = db.app().await;
    let path = resource_path("api/search");
    let bad = app
        .put(&path)
        .json(json!({
            "kind": "rate",
            "hard_limit": -1,
            "global_limit": "lots",
            "limt": 3,
            "tiers": [
                {"limit": 5, "window": "1x"},
                {"limit": 2.5, "window": "0s", "cooldown": 3},
                "fast"
            ],
            "domains": {
                "tenant 42": {"tiers": [{"limit": 1, "window": "1s", "skippable": "yes"}]},
                "ok": {"hard_limit": 1, "extra": true}
            }
        }))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.json["error"], "invalid");
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(
        paths,
        [
            "domains.ok.extra",
            "domains[\"tenant 42\"].tiers[0].skippable",
            "global_limit",
            "hard_limit",
            "limt",
            "tiers[0].window",
            "tiers[1].cooldown",
            "tiers[1].limit",
            "tiers[1].window",
            "tiers[2]",
        ]
    );
    for p in bad.json["problems"].as_array().unwrap() {
        assert!(!p["message"].as_str().unwrap().is_empty());
    }

    // Copy resources and the name.
    let bad = app
        .put(&resource_path("sandbox/vm"))
        .json(json!({
            "name": "sandbox/other",
            "kind": "copy",
        }))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["name"]);
    let bad = app
        .put(&resource_path("sandbox/vm"))
        .json(json!({
            "kind": "copy",
            "tiers": [],
            "domains": {"t": {"domain_limit": -2}},
            "groups": [
                {"name": "g", "limit": 1, "domains": ["a", "a"]},
                {"name": "g", "limit": "x"}
            ]
        }))
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(
        paths,
        [
            "domain_limit",
            "domains.t.domain_limit",
            "groups[0].domains[1]",
            "groups[1].limit",
            "tiers"
        ]
    );
    let bad = app
        .put(&resource_path("x"))
        .json(json!({"kind": "scissors"}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["kind"]);
    let bad = app
        .put(&resource_path("x"))
        .json(json!([1, 2]))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), [""]);
    // A name the URL carries is checked too.
    let bad = app
        .put(&resource_path("/leading"))
        .json(search())
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["name"]);
    let bad = app
        .put(&resource_path("bell\u{7}"))
        .json(search())
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["name"]);

    // Not JSON, or not declared as JSON.
    let bad = app
        .put(&path)
        .body("application/json", "{\"kind\": ")
        .send()
        .await
        .expect(400);
    assert!(
        bad.json["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let bad = app
        .put(&path)
        .body("text/html", "<p>")
        .send()
        .await
        .expect(415);
    assert_eq!(bad.json["error"], "unsupported_media_type");

    assert_eq!(app.version().await, 0);
    app.get(&path).send().await.expect(404);
}

async fn normalization_is_visible_in_what_is_read_back(db: TestDb) {
    let app = db.app().await;
    let stored = app
        .put(&resource_path("api/burst"))
        .json(json!({
            "kind": "rate",
            "tiers": [
                {"limit": 1, "window": "1s", "active": "0s"},
                {"limit": 2, "window": "10s", "active": "4s"},
                {"limit": 3, "window": "2s", "active": "5s", "cooldown": "1s"}
            ],
            "domains": {"t": {"tiers": [{"limit": 9, "window": "3s", "active": "7s"}]}}
        }))
        .send()
        .await
        .expect(201);
    let adjusted: Vec<&str> = stored.json["adjustments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        adjusted,
        [
            "tiers[0]",
            "tiers[1].window",
            "tiers[2].active",
            "domains[\"t\"].tiers[0].active"
        ]
    );
    let read = app
        .get(&resource_path("api/burst"))
        .send()
        .await
        .expect(200);
    assert_eq!(
        read.json["tiers"],
        json!([
            {"limit": 2, "window": "4s", "active": "4s", "cooldown": "0s", "skippable": false},
            {"limit": 3, "window": "2s", "active": "4s", "cooldown": "1s", "skippable": false}
        ])
    );
    assert_eq!(read.json["domains"]["t"]["tiers"][0]["active"], "6s");

    let stored = app
        .put(&resource_path("sandbox/vm"))
        .json(json!({
            "kind": "copy", "domain_limit": 50, "global_limit": 10,
            "domains": {"big": {"domain_limit": 20}},
            "groups": [{"name": "g", "limit": 30, "domains": ["big"]}]
        }))
        .send()
        .await
        .expect(201);
    assert_eq!(stored.json["adjustments"].as_array().unwrap().len(), 3);
    let read = app
        .get(&resource_path("sandbox/vm"))
        .send()
        .await
        .expect(200);
    assert_eq!(read.json["domain_limit"], 10);
    assert_eq!(read.json["domains"]["big"]["domain_limit"], 10);
    assert_eq!(read.json["groups"][0]["limit"], 10);
}

async fn overrides_are_edited_one_domain_at_a_time(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    app.put(&api).json(search()).send().await.expect(201);
    let o = format!("{api}/domains/tenant-42");

    let created = app
        .put(&o)
        .json(json!({"hard_limit": 200, "tiers": [{"limit": 50, "window": "1s"}]}))
        .send()
        .await
        .expect(201);
    assert_eq!(created.json["version"], 2);
    assert_eq!(
        created.json["resource"]["domains"]["tenant-42"]["hard_limit"],
        200
    );
    let read = app.get(&o).send().await.expect(200);
    assert_eq!(read.etag(), 2);
    assert_eq!(
        read.json,
        json!({"hard_limit": 200, "tiers": [{"limit": 50, "window": "1s", "cooldown": "0s", "skippable": false}]})
    );
    let replaced = app
        .put(&o)
        .json(json!({"hard_limit": 150}))
        .send()
        .await
        .expect(200);
    assert_eq!(
        replaced.json["resource"]["domains"]["tenant-42"],
        json!({"hard_limit": 150})
    );
    // A domain with characters that need encoding.
    let odd = format!("{api}/domains/{}", seg("team a/b"));
    app.put(&odd)
        .json(json!({"tiers": []}))
        .send()
        .await
        .expect(201);
    let list = app.get(&format!("{api}/domains")).send().await.expect(200);
    assert_eq!(list.json["version"], 4);
    let domains: Vec<&String> = list.json["domains"].as_object().unwrap().keys().collect();
    assert_eq!(domains, ["team a/b", "tenant-42"]);

    // Problems are relative to the override sent.
    let bad = app
        .put(&o)
        .json(
            json!({"hard_limit": -3, "tiers": [{"limit": 1, "window": "soon"}], "domain_limit": 3}),
        )
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["domain_limit", "hard_limit", "tiers[0].window"]);
    let bad = app
        .put(&odd)
        .json(json!({"tiers": "none"}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["tiers"]);
    let bad = app.put(&odd).json(json!(7)).send().await.expect(400);
    assert_eq!(bad.problem_paths(), [""]);
    let bad = app
        .put(&format!("{api}/domains/{}", seg("tab\t")))
        .json(json!({}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["domain"]);

    // Copy overrides are normalized against the global limit.
    let vm = resource_path("sandbox/vm");
    app.put(&vm).json(vm_doc()).send().await.expect(201);
    let capped = app
        .put(&format!("{vm}/domains/tenant-7"))
        .json(json!({"domain_limit": 500}))
        .send()
        .await
        .expect(201);
    assert_eq!(
        capped.json["resource"]["domains"]["tenant-7"]["domain_limit"],
        100
    );
    assert_eq!(
        capped.json["adjustments"][0]["path"],
        "domains[\"tenant-7\"].domain_limit"
    );
    let bad = app
        .put(&format!("{vm}/domains/tenant-7"))
        .json(json!({"tiers": []}))
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["domain_limit", "tiers"]);

    let deleted = app.delete(&o).send().await.expect(200);
    assert!(
        deleted.json["resource"]["domains"]
            .get("tenant-42")
            .is_none()
    );
    app.delete(&o).send().await.expect(404);
    app.get(&o).send().await.expect(404);
    app.delete(&odd).send().await.expect(200);
    let read = app.get(&api).send().await.expect(200);
    assert!(read.json.get("domains").is_none());

    // On a resource that does not exist.
    app.put(&format!("{}/domains/x", resource_path("nope")))
        .json(json!({}))
        .send()
        .await
        .expect(404);
    app.get(&format!("{}/domains", resource_path("nope")))
        .send()
        .await
        .expect(404);
}

async fn groups_and_their_members(db: TestDb) {
    let app = db.app().await;
    let vm = resource_path("sandbox/vm");
    app.put(&vm).json(vm_doc()).send().await.expect(201);
    let trusted = format!("{vm}/groups/trusted");

    let created = app
        .put(&trusted)
        .json(json!({"limit": 50, "domains": ["a", "b"]}))
        .send()
        .await
        .expect(201);
    assert_eq!(created.json["version"], 2);
    let read = app.get(&trusted).send().await.expect(200);
    assert_eq!(
        read.json,
        json!({"name": "trusted", "limit": 50, "domains": ["a", "b"]})
    );
    let list = app.get(&format!("{vm}/groups")).send().await.expect(200);
    let names: Vec<&str> = list.json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["probation", "trusted"]);

    // Replaced in place; a limit above the global one is lowered.
    let replaced = app
        .put(&trusted)
        .json(json!({"name": "trusted", "limit": 500}))
        .send()
        .await
        .expect(200);
    assert_eq!(
        replaced.json["resource"]["groups"][1],
        json!({"name": "trusted", "limit": 100, "domains": []})
    );
    assert_eq!(replaced.json["adjustments"][0]["path"], "groups[1].limit");

    // Membership.
    let member = format!("{vm}/groups/probation/domains/new-2");
    let added = app.put(&member).send().await.expect(201);
    assert_eq!(
        added.json["resource"]["groups"][0]["domains"],
        json!(["new-1", "new-2"])
    );
    let version = added.json["version"].as_u64().unwrap();
    let again = app.put(&member).send().await.expect(200);
    assert_eq!(again.json["changed"], false);
    assert_eq!(again.json["version"], version);
    let removed = app.delete(&member).send().await.expect(200);
    assert_eq!(
        removed.json["resource"]["groups"][0]["domains"],
        json!(["new-1"])
    );
    app.delete(&member).send().await.expect(404);
    let bad = app
        .put(&format!("{vm}/groups/probation/domains/{}", seg("nl\n")))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["domain"]);
    app.put(&format!("{vm}/groups/nope/domains/x"))
        .send()
        .await
        .expect(404);

    // Problems relative to the group sent.
    let bad = app
        .put(&trusted)
        .json(json!({"name": "other", "limit": 1}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["name"]);
    let bad = app
        .put(&trusted)
        .json(json!({"limit": -1, "domains": ["x", "x", 3], "color": "red"}))
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["color", "domains[1]", "domains[2]", "limit"]);
    let bad = app
        .put(&format!("{vm}/groups/{}", seg("del\u{7f}")))
        .json(json!({"limit": 1}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["name"]);

    // Groups belong to copy-limited resources.
    let api = resource_path("api/search");
    app.put(&api).json(search()).send().await.expect(201);
    let wrong = app
        .put(&format!("{api}/groups/g"))
        .json(json!({"limit": 1}))
        .send()
        .await
        .expect(422);
    assert_eq!(wrong.json["error"], "wrong_kind");
    app.get(&format!("{api}/groups")).send().await.expect(422);

    app.delete(&trusted).send().await.expect(200);
    app.get(&trusted).send().await.expect(404);
    app.delete(&trusted).send().await.expect(404);
    app.get(&format!("{}/groups/g", resource_path("nope")))
        .send()
        .await
        .expect(404);
}

async fn namespaces_are_created_read_and_deleted(db: TestDb) {
    let app = db.app().await;
    let created = app
        .put("/v1/namespaces/billing")
        .json(json!({"allow_unconfigured": true}))
        .send()
        .await
        .expect(201);
    assert_eq!(
        created.json,
        json!({"version": 1, "changed": true, "namespace": "billing",
               "settings": {"allow_unconfigured": true, "ignore_configured": false}})
    );
    let read = app
        .get("/v1/namespaces/billing")
        .anonymous()
        .send()
        .await
        .expect(200);
    assert_eq!(read.etag(), 1);
    assert_eq!(
        read.json,
        json!({"allow_unconfigured": true, "ignore_configured": false})
    );
    let same = app
        .put("/v1/namespaces/billing")
        .json(json!({"allow_unconfigured": true, "ignore_configured": false}))
        .send()
        .await
        .expect(200);
    assert_eq!(same.json["changed"], false);
    app.put("/v1/namespaces/default")
        .json(json!({"ignore_configured": true}))
        .send()
        .await
        .expect(201);
    let list = app.get("/v1/namespaces").send().await.expect(200);
    assert_eq!(
        list.json,
        json!({"version": 2, "namespaces": {
            "billing": {"allow_unconfigured": true, "ignore_configured": false},
            "default": {"allow_unconfigured": false, "ignore_configured": true}
        }})
    );

    let bad = app
        .put("/v1/namespaces/billing")
        .json(json!({"allow_unconfigured": "yes", "strict": true}))
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["allow_unconfigured", "strict"]);
    let bad = app
        .put(&format!("/v1/namespaces/{}", seg("a/b")))
        .json(json!({}))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["namespace"]);
    let bad = app
        .put(&format!("/v1/namespaces/{}", seg("a/b")))
        .json(json!([]))
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["namespace", ""]);

    let deleted = app
        .delete("/v1/namespaces/billing")
        .send()
        .await
        .expect(200);
    assert_eq!(deleted.json, json!({"version": 3, "changed": true}));
    app.get("/v1/namespaces/billing").send().await.expect(404);
    app.delete("/v1/namespaces/billing")
        .send()
        .await
        .expect(404);
}

async fn stale_if_match_is_refused_with_412(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    let vm = resource_path("sandbox/vm");
    app.put(&api).json(search()).send().await.expect(201);
    app.put(&vm).json(vm_doc()).send().await.expect(201);

    // Operator A reads at version 2; operator B changes the resource.
    let seen = app.get(&api).send().await.expect(200).etag();
    assert_eq!(seen, 2);
    let mut b = search();
    b["hard_limit"] = json!(7);
    app.put(&api)
        .if_match(format!("\"{seen}\""))
        .json(b)
        .send()
        .await
        .expect(200);
    // A's write, based on version 2, is refused and changes nothing.
    let mut a = search();
    a["hard_limit"] = json!(9);
    let refused = app
        .put(&api)
        .if_match(format!("\"{seen}\""))
        .json(a.clone())
        .send()
        .await
        .expect(412);
    assert_eq!(refused.json["error"], "version_conflict");
    assert_eq!(refused.json["current_version"], 3);
    assert_eq!(app.get(&api).send().await.expect(200).json["hard_limit"], 7);
    // So are edits of its parts and its deletion.
    app.put(&format!("{api}/domains/t"))
        .if_match(seen)
        .json(json!({}))
        .send()
        .await
        .expect(412);
    app.delete(&api).if_match(seen).send().await.expect(412);
    // A change to another resource does not conflict.
    app.put(&format!("{vm}/groups/probation/domains/new-9"))
        .if_match(seen)
        .send()
        .await
        .expect(201);
    // Based on the current version, it goes through.
    let current = app.get(&api).send().await.expect(200).etag();
    app.put(&api)
        .if_match(current)
        .json(a)
        .send()
        .await
        .expect(200);
    // A version from the future never matches; several may be listed.
    app.delete(&api).if_match(999).send().await.expect(412);
    // `*`: the target must exist.
    app.put(&resource_path("new"))
        .if_match("*")
        .json(search())
        .send()
        .await
        .expect(412);
    app.put(&api)
        .if_match("*")
        .json(search())
        .send()
        .await
        .expect(200);
    // A resource deleted after the version it was based on conflicts.
    let before_delete = app.version().await;
    app.delete(&vm).send().await.expect(200);
    app.put(&vm)
        .if_match(before_delete)
        .json(vm_doc())
        .send()
        .await
        .expect(412);
    let v = app.version().await;
    app.put(&vm)
        .if_match(format!("\"1\", \"{v}\""))
        .json(vm_doc())
        .send()
        .await
        .expect(201);
    let bad = app
        .put(&vm)
        .if_match("W/\"3\"")
        .json(vm_doc())
        .send()
        .await
        .expect(400);
    assert_eq!(bad.problem_paths(), ["If-Match"]);

    // Namespaces.
    let v = app
        .put("/v1/namespaces/ns")
        .json(json!({}))
        .send()
        .await
        .expect(201)
        .etag();
    app.put("/v1/namespaces/ns")
        .if_match(v)
        .json(json!({"allow_unconfigured": true}))
        .send()
        .await
        .expect(200);
    app.put("/v1/namespaces/ns")
        .if_match(v)
        .json(json!({}))
        .send()
        .await
        .expect(412);
    app.delete("/v1/namespaces/ns")
        .if_match(v)
        .send()
        .await
        .expect(412);

    // The whole configuration: any later commit conflicts.
    let v = app.version().await;
    app.put("/v1/config")
        .if_match(v - 1)
        .body("application/yaml", "resources: []\n")
        .send()
        .await
        .expect(412);
    app.put("/v1/config?dry_run=true")
        .if_match(v - 1)
        .body("application/yaml", "resources: []\n")
        .send()
        .await
        .expect(412);
    assert_eq!(app.version().await, v);
}

async fn writes_need_a_write_token(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    let writes = [
        (Method::PUT, api.clone(), Some(search())),
        (Method::POST, "/v1/resources".to_owned(), Some(search())),
        (Method::DELETE, api.clone(), None),
        (Method::PUT, format!("{api}/domains/d"), Some(json!({}))),
        (Method::DELETE, format!("{api}/domains/d"), None),
        (
            Method::PUT,
            format!("{api}/groups/g"),
            Some(json!({"limit": 1})),
        ),
        (Method::DELETE, format!("{api}/groups/g"), None),
        (Method::PUT, format!("{api}/groups/g/domains/d"), None),
        (Method::DELETE, format!("{api}/groups/g/domains/d"), None),
        (Method::PUT, "/v1/namespaces/n".to_owned(), Some(json!({}))),
        (Method::DELETE, "/v1/namespaces/n".to_owned(), None),
        (
            Method::PUT,
            "/v1/config".to_owned(),
            Some(json!({"resources": []})),
        ),
    ];
    for (method, path, body) in writes {
        let call = |token: Option<&str>| {
            let mut c = app.method(method.clone(), &path).anonymous();
            if let Some(t) = token {
                c = c.token(t);
            }
            if let Some(b) = &body {
                c = c.json(b.clone());
            }
            c
        };
        let none = call(None).send().await.expect(401);
        assert_eq!(none.json["error"], "unauthorized", "{method} {path}");
        assert_eq!(
            none.headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"charon-config\""
        );
        let wrong = call(Some("guess")).send().await.expect(401);
        assert!(
            wrong.headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("invalid_token")
        );
        let read_only = call(Some(READER)).send().await.expect(403);
        assert_eq!(read_only.json["error"], "forbidden");
    }
    // Not `Bearer`.
    app.put("/v1/namespaces/n")
        .anonymous()
        .header("authorization", "Basic d3JpdGVyOnRva2Vu")
        .json(json!({}))
        .send()
        .await
        .expect(401);
    // Reads are open; a dry run only needs to read.
    app.get("/v1/resources")
        .anonymous()
        .send()
        .await
        .expect(200);
    app.put("/v1/config?dry_run=true")
        .anonymous()
        .json(json!({"resources": []}))
        .send()
        .await
        .expect(200);
    assert_eq!(app.version().await, 0);

    // With no write token configured, nothing can be written.
    let closed = db.app_with(Tokens::new(), StoreOptions::default()).await;
    let refused = closed
        .put("/v1/namespaces/n")
        .json(json!({}))
        .send()
        .await
        .expect(401);
    assert!(
        refused.json["message"]
            .as_str()
            .unwrap()
            .contains("no write token")
            || refused.json["message"]
                .as_str()
                .unwrap()
                .contains("not valid")
    );
}

/// A client without the right token learns nothing about its request: the
/// token is checked before the URL, the query, `If-Match`, the
/// `Content-Type` and the body are looked at.
async fn credentials_are_checked_before_the_request(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    for (method, path) in [
        (Method::PUT, api.clone()),
        (Method::POST, "/v1/resources".to_owned()),
        (Method::PUT, format!("{api}/domains/d")),
        (Method::PUT, format!("{api}/groups/g")),
        (Method::PUT, "/v1/namespaces/n".to_owned()),
        (Method::PUT, "/v1/config".to_owned()),
    ] {
        for token in [None, Some(READER)] {
            let mut call = app
                .method(method.clone(), &path)
                .anonymous()
                .if_match("not a version")
                .body("text/html", "{not json");
            if let Some(t) = token {
                call = call.token(t);
            }
            let want = if token.is_some() { 403 } else { 401 };
            call.send().await.expect(want);
        }
    }
    app.delete(&format!("{api}/groups/g/domains/d"))
        .anonymous()
        .if_match("not a version")
        .send()
        .await
        .expect(401);

    let closed = db
        .app_with(
            Tokens::new()
                .writer("w")
                .reader(READER)
                .reads_need_token(true),
            StoreOptions::default(),
        )
        .await;
    for path in ["/v1/changes?since=minus-one", "/v1/config?format=xml"] {
        closed.get(path).anonymous().send().await.expect(401);
        closed.get(path).token(READER).send().await.expect(400);
    }
}

async fn reads_may_need_a_token(db: TestDb) {
    let app = db
        .app_with(
            TestDb::tokens().reads_need_token(true),
            StoreOptions::default(),
        )
        .await;
    for path in [
        "/v1/resources",
        "/v1/namespaces",
        "/v1/config",
        "/v1/changes?since=0",
    ] {
        app.get(path).anonymous().send().await.expect(401);
        app.get(path).token(READER).send().await.expect(200);
        app.get(path).send().await.expect(200);
    }
    // The OpenAPI document stays open.
    app.get("/openapi.json")
        .anonymous()
        .send()
        .await
        .expect(200);
}

async fn changes_since_give_deltas_and_snapshots(db: TestDb) {
    let app = db.app().await;
    let empty = app.get("/v1/changes?since=0").send().await.expect(200);
    assert_eq!(empty.json["snapshot"], true);
    assert_eq!(empty.json["version"], 0);
    let epoch = empty.json["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 32);

    let api = resource_path("api/search");
    let vm = resource_path("sandbox/vm");
    app.put(&api).json(search()).send().await.expect(201); // 1
    app.put(&vm).json(vm_doc()).send().await.expect(201); // 2
    app.put("/v1/namespaces/api")
        .json(json!({"allow_unconfigured": true}))
        .send()
        .await
        .expect(201); // 3
    app.put("/v1/namespaces/old")
        .json(json!({}))
        .send()
        .await
        .expect(201); // 4

    let snapshot = app.get("/v1/changes").send().await.expect(200);
    assert_eq!(snapshot.json["snapshot"], true);
    assert_eq!(snapshot.json["since"], 0);
    assert_eq!(snapshot.json["resources"].as_array().unwrap().len(), 2);
    assert_eq!(snapshot.json["namespaces"].as_object().unwrap().len(), 2);
    assert_eq!(snapshot.etag(), 4);

    // Changes after 4: a tier limit lowered, a member added, a resource
    // and a namespace deleted, a namespace changed.
    let mut lower = search();
    lower["tiers"][0]["limit"] = json!(2);
    app.put(&api).json(lower).send().await.expect(200); // 5
    app.put(&format!("{vm}/groups/probation/domains/new-2"))
        .send()
        .await
        .expect(201); // 6
    app.delete(&vm).send().await.expect(200); // 7
    app.put(&resource_path("x/y"))
        .json(search())
        .send()
        .await
        .expect(201); // 8
    app.delete("/v1/namespaces/old").send().await.expect(200); // 9
    app.put("/v1/namespaces/api")
        .json(json!({"ignore_configured": true}))
        .send()
        .await
        .expect(200); // 10

    let delta = app
        .get(&format!("/v1/changes?since=4&epoch={epoch}"))
        .send()
        .await
        .expect(200);
    assert_eq!(delta.etag(), 10);
    assert_eq!(
        delta.json,
        json!({
            "epoch": epoch,
            "version": 10,
            "since": 4,
            "snapshot": false,
            "resources": [
                {"name": "api/search", "kind": "rate", "hard_limit": 100, "tiers": [
                    {"limit": 2, "window": "1s", "cooldown": "0s", "skippable": false},
                    {"limit": 25, "window": "1s", "active": "5s", "cooldown": "15s", "skippable": false}
                ]},
                {"name": "x/y", "kind": "rate", "hard_limit": 100, "tiers": [
                    {"limit": 5, "window": "1s", "cooldown": "0s", "skippable": false},
                    {"limit": 25, "window": "1s", "active": "5s", "cooldown": "15s", "skippable": false}
                ]}
            ],
            "deleted_resources": ["sandbox/vm"],
            "namespaces": {"api": {"allow_unconfigured": false, "ignore_configured": true}},
            "deleted_namespaces": ["old"]
        })
    );
    // The member added at 6 is in the delta since 5.
    let delta = app.get("/v1/changes?since=5").send().await.expect(200);
    assert_eq!(delta.json["snapshot"], false);
    assert_eq!(delta.json["deleted_resources"], json!(["sandbox/vm"]));
    let delta = app.get("/v1/changes?since=6").send().await.expect(200);
    assert_eq!(delta.json["deleted_resources"], json!(["sandbox/vm"]));
    assert_eq!(delta.json["resources"][0]["name"], "x/y");

    // Up to date: an empty delta.
    let none = app.get("/v1/changes?since=10").send().await.expect(200);
    assert_eq!(none.json["snapshot"], false);
    assert_eq!(none.json["resources"], json!([]));
    assert_eq!(none.json["deleted_resources"], json!([]));
    assert_eq!(none.json["namespaces"], json!({}));
    // A version the service never had, or another epoch: a snapshot.
    let ahead = app.get("/v1/changes?since=11").send().await.expect(200);
    assert_eq!(ahead.json["snapshot"], true);
    assert_eq!(ahead.json["resources"].as_array().unwrap().len(), 2);
    let other = app
        .get("/v1/changes?since=4&epoch=0123")
        .send()
        .await
        .expect(200);
    assert_eq!(other.json["snapshot"], true);
    assert_eq!(other.json["deleted_resources"], json!([]));

    let bad = app.get("/v1/changes?since=-1").send().await.expect(400);
    assert_eq!(bad.json["error"], "invalid");
    app.get("/v1/changes?since=soon").send().await.expect(400);
}

async fn history_older_than_kept_gives_a_snapshot(db: TestDb) {
    let options = StoreOptions {
        history_versions: 3,
        ..StoreOptions::default()
    };
    let app = db.app_with(TestDb::tokens(), options).await;
    for i in 0..6 {
        app.put(&resource_path(&format!("r/{i}")))
            .json(search())
            .send()
            .await
            .expect(201);
    }
    // Versions 4..=6 are kept: deltas from 3 on, snapshots before.
    let delta = app.get("/v1/changes?since=3").send().await.expect(200);
    assert_eq!(delta.json["snapshot"], false);
    assert_eq!(delta.json["resources"].as_array().unwrap().len(), 3);
    let old = app.get("/v1/changes?since=2").send().await.expect(200);
    assert_eq!(old.json["snapshot"], true);
    assert_eq!(old.json["resources"].as_array().unwrap().len(), 6);
    // If-Match on an absent resource further back than the history cannot
    // be proven safe: refused.
    app.put(&resource_path("fresh"))
        .if_match(1)
        .json(search())
        .send()
        .await
        .expect(412);
    // On an existing resource its own version decides.
    app.put(&resource_path("r/0"))
        .if_match(1)
        .json(vm_doc())
        .send()
        .await
        .expect(200);
}

const FILE: &str = "\
namespaces:
  billing: { allow_unconfigured: true, ignore_configured: false }
resources:
  - name: api/search
    kind: rate
    hard_limit: 100
    global_limit: 1000
    tiers:
      - { limit: 5,  window: 1s, cooldown: 0s }
      - { limit: 25, window: 1s, active: 5s, cooldown: 15s, skippable: false }
    domains:
      tenant-42: { hard_limit: 200, tiers: [ { limit: 50, window: 1s } ] }
  - name: sandbox/vm
    kind: copy
    domain_limit: 4
    global_limit: 100
    domains: { tenant-7: { domain_limit: 10 } }
    groups:
      - { name: probation, limit: 5, domains: [new-1, new-2] }
";

async fn import_and_export_round_trip(db: TestDb) {
    let app = db.app().await;
    app.put(&resource_path("old/one"))
        .json(search())
        .send()
        .await
        .expect(201);
    app.put(&resource_path("sandbox/vm"))
        .json(vm_doc())
        .send()
        .await
        .expect(201);

    // A dry run shows the difference and changes nothing.
    let dry = app
        .put("/v1/config?dry_run=true")
        .body("application/yaml", FILE)
        .send()
        .await
        .expect(200);
    assert_eq!(dry.json["dry_run"], true);
    assert_eq!(dry.json["changed"], true);
    assert_eq!(dry.json["base_version"], 2);
    assert_eq!(dry.json["version"], 2);
    let ops: Vec<(String, String, String)> = dry.json["diff"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["name"].as_str().unwrap().to_owned(),
                e["op"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("namespace", "billing", "add"),
        ("resource", "api/search", "add"),
        ("resource", "old/one", "remove"),
        ("resource", "sandbox/vm", "change"),
    ]
    .iter()
    .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(ops, expected);
    assert_eq!(dry.json["diff"][2]["after"], Value::Null);
    assert_eq!(
        dry.json["diff"][3]["before"]["groups"][0]["domains"],
        json!(["new-1"])
    );
    assert_eq!(app.version().await, 2);

    // Applied: one commit.
    let applied = app
        .put("/v1/config")
        .if_match(2)
        .body("application/yaml", FILE)
        .send()
        .await
        .expect(200);
    assert_eq!(applied.json["dry_run"], false);
    assert_eq!(applied.json["version"], 3);
    assert_eq!(applied.json["diff"].as_array().unwrap().len(), 4);
    assert_eq!(app.version().await, 3);
    app.get(&resource_path("old/one")).send().await.expect(404);
    let delta = app.get("/v1/changes?since=2").send().await.expect(200);
    assert_eq!(delta.json["deleted_resources"], json!(["old/one"]));
    assert_eq!(delta.json["resources"].as_array().unwrap().len(), 2);

    // Export: the file, normalized.
    let yaml = app
        .get("/v1/config?format=yaml")
        .anonymous()
        .send()
        .await
        .expect(200);
    assert_eq!(yaml.headers[header::CONTENT_TYPE], "application/yaml");
    assert_eq!(yaml.etag(), 3);
    let (expected, _) = charon_core::config::Config::from_yaml(FILE).unwrap();
    assert_eq!(yaml.text, expected.to_yaml());
    let by_accept = app
        .get("/v1/config")
        .header("accept", "application/yaml")
        .send()
        .await
        .expect(200);
    assert_eq!(by_accept.text, yaml.text);
    let json_export = app.get("/v1/config").send().await.expect(200);
    assert_eq!(json_export.json, expected.to_value());
    app.get("/v1/config?format=toml").send().await.expect(400);

    // Importing the export changes nothing; nor does JSON of the same.
    let again = app
        .put("/v1/config")
        .body("application/yaml", &yaml.text)
        .send()
        .await
        .expect(200);
    assert_eq!(again.json["changed"], false);
    assert_eq!(again.json["version"], 3);
    assert_eq!(again.json["diff"], json!([]));
    let again = app
        .put("/v1/config")
        .json(json_export.json.clone())
        .send()
        .await
        .expect(200);
    assert_eq!(again.json["changed"], false);
    assert_eq!(app.version().await, 3);

    // Normalization of an import is reported with paths in the file.
    let adjusted = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - {name: a, kind: rate, tiers: [{limit: 1, window: 10s, active: 5s}]}\n",
        )
        .send()
        .await
        .expect(200);
    assert_eq!(
        adjusted.json["adjustments"][0]["path"],
        "resources[0].tiers[0].window"
    );
    assert_eq!(adjusted.json["version"], 4);
    let exported = app.get("/v1/config").send().await.expect(200);
    assert_eq!(exported.json["resources"].as_array().unwrap().len(), 1);
    assert!(exported.json.get("namespaces").is_none());
}

async fn import_refuses_bad_documents(db: TestDb) {
    let app = db.app().await;
    let bad = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "namespaces:\n  bad/ns: {}\nresources:\n  - {name: a, kind: rate, tiers: [{limit: x, window: 1s}]}\n  - {name: a, kind: copy, domain_limit: 1}\n  - {kind: copy}\n",
        )
        .send()
        .await
        .expect(400);
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(
        paths,
        [
            "namespaces[\"bad/ns\"]",
            "resources[0].tiers[0].limit",
            "resources[2].domain_limit",
            "resources[2].name"
        ]
    );
    let bad = app
        .put("/v1/config")
        .body("application/yaml", "resources: [\n")
        .send()
        .await
        .expect(400);
    assert!(bad.json["message"].as_str().unwrap().contains("YAML"));
    let dup = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - {name: a, kind: copy, domain_limit: 1}\n  - {name: a, kind: copy, domain_limit: 2}\n",
        )
        .send()
        .await
        .expect(400);
    assert_eq!(dup.problem_paths(), ["resources[1].name"]);
    let empty = app
        .put("/v1/config")
        .body("application/yaml", "  \n")
        .send()
        .await
        .expect(400);
    assert!(empty.json["message"].as_str().unwrap().contains("empty"));
    app.put("/v1/config")
        .body("application/json", "{")
        .send()
        .await
        .expect(400);
    app.put("/v1/config")
        .body("image/png", "resources: []")
        .send()
        .await
        .expect(415);
    app.put("/v1/config?dry_run=maybe")
        .body("application/yaml", "resources: []")
        .send()
        .await
        .expect(400);
    assert_eq!(app.version().await, 0);
}

async fn concurrent_writes_get_distinct_versions(db: TestDb) {
    let app = db.app().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let r = app
                .put(&resource_path(&format!("c/{i}")))
                .json(search())
                .send()
                .await
                .expect(201);
            r.json["version"].as_u64().unwrap()
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.unwrap());
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=16).collect::<Vec<u64>>());
    // Two writers of the same resource with the same If-Match: one wins.
    let mut tasks = Vec::new();
    for limit in [1, 2] {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut body = search();
            body["hard_limit"] = json!(limit);
            app.put(&resource_path("c/0"))
                .if_match(16)
                .json(body)
                .send()
                .await
                .status
                .as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 412]);
}

async fn unknown_paths_and_methods_answer_json(db: TestDb) {
    let app = db.app().await;
    let unencoded = app.get("/v1/resources/api/search").send().await.expect(404);
    assert!(unencoded.json["message"].as_str().unwrap().contains("%2F"));
    app.get("/v1/nothing").send().await.expect(404);
    // Names no one can store (PostgreSQL refuses NUL in text) are simply
    // not there, or invalid when written.
    app.get(&resource_path("a\0b")).send().await.expect(404);
    app.delete(&resource_path("a\0b")).send().await.expect(404);
    app.get("/v1/namespaces/%00").send().await.expect(404);
    app.delete("/v1/namespaces/%00").send().await.expect(404);
    app.put("/v1/namespaces/%00")
        .json(json!({}))
        .send()
        .await
        .expect(400);
    app.get("/v1/resources?namespace=%00")
        .send()
        .await
        .expect(200);
    app.get("/v1/changes?since=1&epoch=%00")
        .send()
        .await
        .expect(200);
    let wrong = app
        .method(Method::PATCH, "/v1/changes")
        .send()
        .await
        .expect(405);
    assert_eq!(wrong.json["error"], "method_not_allowed");
    assert!(wrong.headers.contains_key(header::ALLOW));
    // The same on the routes of a resource's parts.
    for path in ["domains", "domains/d", "groups", "groups/g"] {
        let path = format!("{}/{path}", resource_path("api/search"));
        let wrong = app.method(Method::PATCH, &path).send().await.expect(405);
        assert_eq!(wrong.json["error"], "method_not_allowed", "{path}");
        assert!(wrong.headers.contains_key(header::ALLOW), "{path}");
    }
}

/// Every operation the OpenAPI document lists exists (a request to it is
/// not answered 405 or "no such endpoint"); schemathesis checks the rest
/// (`tests/schemathesis.sh`).
#[tokio::test]
async fn every_documented_operation_is_served() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    let doc: Value = serde_json::from_str(charon_config_service::OPENAPI_JSON).unwrap();
    assert_eq!(app.get("/openapi.json").send().await.expect(200).json, doc);
    let mut count = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{name}", "api%2Fsearch")
            .replace("{domain}", "d")
            .replace("{group}", "g")
            .replace("{namespace}", "n");
        for method in item.as_object().unwrap().keys() {
            if method == "parameters" {
                continue;
            }
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let reply = app.method(m, &concrete).send().await;
            assert_ne!(reply.status, 405, "{method} {path}");
            assert!(
                !reply.text.contains("no such endpoint"),
                "{method} {path}: {}",
                reply.text
            );
            count += 1;
        }
    }
    assert_eq!(count, 23, "operations documented");
}

/// The router mounts in a host router beside its own routes and fallback.
#[tokio::test]
async fn the_router_mounts_beside_other_routes() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::{get, post};
    use tower::ServiceExt;

    let db = TestDb::sqlite();
    let app = db.app().await;
    let host = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/simulate", post(|| async { "simulated" }))
        .merge(charon_config_service::router(app.state.clone()))
        .fallback(|| async { (StatusCode::NOT_FOUND, "host fallback") });
    let call = |method: &str, path: &str| {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let host = host.clone();
        async move {
            let response = host.oneshot(request).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(
        call("GET", "/healthz").await,
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(
        call("POST", "/v1/simulate").await,
        (StatusCode::OK, "simulated".to_owned())
    );
    let (status, body) = call("GET", "/v1/resources").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"resources\""));
    assert_eq!(
        call("GET", "/metrics").await,
        (StatusCode::NOT_FOUND, "host fallback".to_owned())
    );
}

/// A SQLite file keeps everything across restarts; migrations run once.
#[tokio::test]
async fn a_sqlite_file_survives_a_restart() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    app.put(&resource_path("api/search"))
        .json(search())
        .send()
        .await
        .expect(201);
    let epoch = app.get("/v1/changes").send().await.json["epoch"].clone();
    app.state.close().await;
    let app = db.app().await;
    let changes = app.get("/v1/changes").send().await.expect(200);
    assert_eq!(changes.json["epoch"], epoch);
    assert_eq!(changes.json["version"], 1);
    assert_eq!(changes.json["resources"][0]["name"], "api/search");
}

/// A closed database answers 503, not a bare 500.
#[tokio::test]
async fn an_unreachable_database_answers_503() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    app.state.close().await;
    let reply = app.get("/v1/resources").send().await.expect(503);
    assert_eq!(reply.json["error"], "unavailable");
    let reply = app
        .put("/v1/namespaces/n")
        .json(json!({}))
        .send()
        .await
        .expect(503);
    assert_eq!(reply.json["error"], "unavailable");
}
