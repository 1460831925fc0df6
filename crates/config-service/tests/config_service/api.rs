//! The configuration API, endpoint by endpoint, on SQLite and on a private
//! PostgreSQL: the same scenarios run on both (`sqlite::*` and `postgres`).

use crate::support;

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
    buckets_windows_and_queues_are_stored_normalized,
    bad_buckets_windows_and_queues_answer_400_with_the_path,
    the_new_kinds_import_and_export,
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

    let created = app.put(&path).json(search()).expect(201).await;
    assert_eq!(created.json["version"], 1);
    assert_eq!(created.json["changed"], true);
    assert_eq!(created.etag(), 1);
    assert_eq!(created.json["resource"]["name"], "api/search");
    // Read back in the normalized, explicit form.
    let read = app.get(&path).anonymous().expect(200).await;
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
    let same = app.put(&path).json(read.json.clone()).expect(200).await;
    assert_eq!(same.json["changed"], false);
    assert_eq!(same.json["version"], 1);

    // Replace: lower the first tier.
    let mut lower = search();
    lower["tiers"][0]["limit"] = json!(3);
    let replaced = app.put(&path).json(lower).expect(200).await;
    assert_eq!(replaced.json["version"], 2);
    assert_eq!(replaced.json["resource"]["tiers"][0]["limit"], 3);

    app.put(&resource_path("sandbox/vm"))
        .json(vm_doc())
        .expect(201)
        .await;
    app.put(&resource_path("top"))
        .json(vm_doc())
        .expect(201)
        .await;
    let list = app.get("/v1/resources").expect(200).await;
    assert_eq!(list.json["version"], 4);
    let names: Vec<&str> = list.json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api/search", "sandbox/vm", "top"]);
    let api = app.get("/v1/resources?namespace=api").expect(200).await;
    assert_eq!(api.json["resources"].as_array().unwrap().len(), 1);
    let default = app.get("/v1/resources?namespace=default").expect(200).await;
    assert_eq!(default.json["resources"][0]["name"], "top");

    let deleted = app.delete(&path).expect(200).await;
    assert_eq!(deleted.json, json!({"version": 5, "changed": true}));
    assert_eq!(deleted.etag(), 5);
    let gone = app.get(&path).expect(404).await;
    assert_eq!(gone.json["error"], "not_found");
    app.delete(&path).expect(404).await;
    assert_eq!(app.version().await, 5);
}

async fn post_creates_once(db: TestDb) {
    let app = db.app().await;
    let mut body = vm_doc();
    body["name"] = json!("sandbox/vm");
    let created = app
        .post("/v1/resources")
        .json(body.clone())
        .expect(201)
        .await;
    assert_eq!(created.json["resource"]["name"], "sandbox/vm");
    let again = app.post("/v1/resources").json(body).expect(409).await;
    assert_eq!(again.json["error"], "already_exists");
    assert_eq!(
        app.post("/v1/resources").json(vm_doc()).problems().await,
        ["name"]
    );
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
        .expect(400)
        .await;
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
    assert_eq!(
        app.put(&resource_path("sandbox/vm"))
            .json(json!({
                "name": "sandbox/other",
                "kind": "copy",
            }))
            .problems()
            .await,
        ["name"]
    );
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
        .expect(400)
        .await;
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
    assert_eq!(
        app.put(&resource_path("x"))
            .json(json!({"kind": "scissors"}))
            .problems()
            .await,
        ["kind"]
    );
    assert_eq!(
        app.put(&resource_path("x"))
            .json(json!([1, 2]))
            .problems()
            .await,
        [""]
    );
    // A name the URL carries is checked too.
    assert_eq!(
        app.put(&resource_path("/leading"))
            .json(search())
            .problems()
            .await,
        ["name"]
    );
    assert_eq!(
        app.put(&resource_path("bell\u{7}"))
            .json(search())
            .problems()
            .await,
        ["name"]
    );

    // Not JSON, or not declared as JSON.
    let bad = app
        .put(&path)
        .body("application/json", "{\"kind\": ")
        .expect(400)
        .await;
    assert!(
        bad.json["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let bad = app.put(&path).body("text/html", "<p>").expect(415).await;
    assert_eq!(bad.json["error"], "unsupported_media_type");

    assert_eq!(app.version().await, 0);
    app.get(&path).expect(404).await;
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
        .expect(201)
        .await;
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
    let read = app.get(&resource_path("api/burst")).expect(200).await;
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
        .expect(201)
        .await;
    assert_eq!(stored.json["adjustments"].as_array().unwrap().len(), 3);
    let read = app.get(&resource_path("sandbox/vm")).expect(200).await;
    assert_eq!(read.json["domain_limit"], 10);
    assert_eq!(read.json["domains"]["big"]["domain_limit"], 10);
    assert_eq!(read.json["groups"][0]["limit"], 10);
}

async fn overrides_are_edited_one_domain_at_a_time(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    app.put(&api).json(search()).expect(201).await;
    let o = format!("{api}/domains/tenant-42");

    let created = app
        .put(&o)
        .json(json!({"hard_limit": 200, "tiers": [{"limit": 50, "window": "1s"}]}))
        .expect(201)
        .await;
    assert_eq!(created.json["version"], 2);
    assert_eq!(
        created.json["resource"]["domains"]["tenant-42"]["hard_limit"],
        200
    );
    let read = app.get(&o).expect(200).await;
    assert_eq!(read.etag(), 2);
    assert_eq!(
        read.json,
        json!({"hard_limit": 200, "tiers": [{"limit": 50, "window": "1s", "cooldown": "0s", "skippable": false}]})
    );
    let replaced = app
        .put(&o)
        .json(json!({"hard_limit": 150}))
        .expect(200)
        .await;
    assert_eq!(
        replaced.json["resource"]["domains"]["tenant-42"],
        json!({"hard_limit": 150})
    );
    // A domain with characters that need encoding.
    let odd = format!("{api}/domains/{}", seg("team a/b"));
    app.put(&odd).json(json!({"tiers": []})).expect(201).await;
    let list = app.get(&format!("{api}/domains")).expect(200).await;
    assert_eq!(list.json["version"], 4);
    let domains: Vec<&String> = list.json["domains"].as_object().unwrap().keys().collect();
    assert_eq!(domains, ["team a/b", "tenant-42"]);

    // Problems are relative to the override sent.
    let bad = app
        .put(&o)
        .json(
            json!({"hard_limit": -3, "tiers": [{"limit": 1, "window": "soon"}], "domain_limit": 3}),
        )
        .expect(400)
        .await;
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["domain_limit", "hard_limit", "tiers[0].window"]);
    assert_eq!(
        app.put(&odd)
            .json(json!({"tiers": "none"}))
            .problems()
            .await,
        ["tiers"]
    );
    assert_eq!(app.put(&odd).json(json!(7)).problems().await, [""]);
    assert_eq!(
        app.put(&format!("{api}/domains/{}", seg("tab\t")))
            .json(json!({}))
            .problems()
            .await,
        ["domain"]
    );

    // Copy overrides are normalized against the global limit.
    let vm = resource_path("sandbox/vm");
    app.put(&vm).json(vm_doc()).expect(201).await;
    let capped = app
        .put(&format!("{vm}/domains/tenant-7"))
        .json(json!({"domain_limit": 500}))
        .expect(201)
        .await;
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
        .expect(400)
        .await;
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["domain_limit", "tiers"]);

    let deleted = app.delete(&o).expect(200).await;
    assert!(
        deleted.json["resource"]["domains"]
            .get("tenant-42")
            .is_none()
    );
    app.delete(&o).expect(404).await;
    app.get(&o).expect(404).await;
    app.delete(&odd).expect(200).await;
    let read = app.get(&api).expect(200).await;
    assert!(read.json.get("domains").is_none());

    // On a resource that does not exist.
    app.put(&format!("{}/domains/x", resource_path("nope")))
        .json(json!({}))
        .expect(404)
        .await;
    app.get(&format!("{}/domains", resource_path("nope")))
        .expect(404)
        .await;
}

async fn groups_and_their_members(db: TestDb) {
    let app = db.app().await;
    let vm = resource_path("sandbox/vm");
    app.put(&vm).json(vm_doc()).expect(201).await;
    let trusted = format!("{vm}/groups/trusted");

    let created = app
        .put(&trusted)
        .json(json!({"limit": 50, "domains": ["a", "b"]}))
        .expect(201)
        .await;
    assert_eq!(created.json["version"], 2);
    let read = app.get(&trusted).expect(200).await;
    assert_eq!(
        read.json,
        json!({"name": "trusted", "limit": 50, "domains": ["a", "b"]})
    );
    let list = app.get(&format!("{vm}/groups")).expect(200).await;
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
        .expect(200)
        .await;
    assert_eq!(
        replaced.json["resource"]["groups"][1],
        json!({"name": "trusted", "limit": 100, "domains": []})
    );
    assert_eq!(replaced.json["adjustments"][0]["path"], "groups[1].limit");

    // Membership.
    let member = format!("{vm}/groups/probation/domains/new-2");
    let added = app.put(&member).expect(201).await;
    assert_eq!(
        added.json["resource"]["groups"][0]["domains"],
        json!(["new-1", "new-2"])
    );
    let version = added.json["version"].as_u64().unwrap();
    let again = app.put(&member).expect(200).await;
    assert_eq!(again.json["changed"], false);
    assert_eq!(again.json["version"], version);
    let removed = app.delete(&member).expect(200).await;
    assert_eq!(
        removed.json["resource"]["groups"][0]["domains"],
        json!(["new-1"])
    );
    app.delete(&member).expect(404).await;
    assert_eq!(
        app.put(&format!("{vm}/groups/probation/domains/{}", seg("nl\n")))
            .problems()
            .await,
        ["domain"]
    );
    app.put(&format!("{vm}/groups/nope/domains/x"))
        .expect(404)
        .await;

    // Problems relative to the group sent.
    assert_eq!(
        app.put(&trusted)
            .json(json!({"name": "other", "limit": 1}))
            .problems()
            .await,
        ["name"]
    );
    let bad = app
        .put(&trusted)
        .json(json!({"limit": -1, "domains": ["x", "x", 3], "color": "red"}))
        .expect(400)
        .await;
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["color", "domains[1]", "domains[2]", "limit"]);
    assert_eq!(
        app.put(&format!("{vm}/groups/{}", seg("del\u{7f}")))
            .json(json!({"limit": 1}))
            .problems()
            .await,
        ["name"]
    );

    // Groups belong to copy-limited resources.
    let api = resource_path("api/search");
    app.put(&api).json(search()).expect(201).await;
    let wrong = app
        .put(&format!("{api}/groups/g"))
        .json(json!({"limit": 1}))
        .expect(422)
        .await;
    assert_eq!(wrong.json["error"], "wrong_kind");
    app.get(&format!("{api}/groups")).expect(422).await;

    app.delete(&trusted).expect(200).await;
    app.get(&trusted).expect(404).await;
    app.delete(&trusted).expect(404).await;
    app.get(&format!("{}/groups/g", resource_path("nope")))
        .expect(404)
        .await;
}

async fn namespaces_are_created_read_and_deleted(db: TestDb) {
    let app = db.app().await;
    let created = app
        .put("/v1/namespaces/billing")
        .json(json!({"allow_unconfigured": true}))
        .expect(201)
        .await;
    assert_eq!(
        created.json,
        json!({"version": 1, "changed": true, "namespace": "billing",
               "settings": {"allow_unconfigured": true, "ignore_configured": false}})
    );
    let read = app
        .get("/v1/namespaces/billing")
        .anonymous()
        .expect(200)
        .await;
    assert_eq!(read.etag(), 1);
    assert_eq!(
        read.json,
        json!({"allow_unconfigured": true, "ignore_configured": false})
    );
    let same = app
        .put("/v1/namespaces/billing")
        .json(json!({"allow_unconfigured": true, "ignore_configured": false}))
        .expect(200)
        .await;
    assert_eq!(same.json["changed"], false);
    app.put("/v1/namespaces/default")
        .json(json!({"ignore_configured": true}))
        .expect(201)
        .await;
    let list = app.get("/v1/namespaces").expect(200).await;
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
        .expect(400)
        .await;
    let mut paths = bad.problem_paths();
    paths.sort();
    assert_eq!(paths, ["allow_unconfigured", "strict"]);
    assert_eq!(
        app.put(&format!("/v1/namespaces/{}", seg("a/b")))
            .json(json!({}))
            .problems()
            .await,
        ["namespace"]
    );
    assert_eq!(
        app.put(&format!("/v1/namespaces/{}", seg("a/b")))
            .json(json!([]))
            .problems()
            .await,
        ["namespace", ""]
    );

    let deleted = app.delete("/v1/namespaces/billing").expect(200).await;
    assert_eq!(deleted.json, json!({"version": 3, "changed": true}));
    app.get("/v1/namespaces/billing").expect(404).await;
    app.delete("/v1/namespaces/billing").expect(404).await;
}

async fn stale_if_match_is_refused_with_412(db: TestDb) {
    let app = db.app().await;
    let api = resource_path("api/search");
    let vm = resource_path("sandbox/vm");
    app.put(&api).json(search()).expect(201).await;
    app.put(&vm).json(vm_doc()).expect(201).await;

    // Operator A reads at version 2; operator B changes the resource.
    let seen = app.get(&api).expect(200).await.etag();
    assert_eq!(seen, 2);
    let mut b = search();
    b["hard_limit"] = json!(7);
    app.put(&api)
        .if_match(format!("\"{seen}\""))
        .json(b)
        .expect(200)
        .await;
    // A's write, based on version 2, is refused and changes nothing.
    let mut a = search();
    a["hard_limit"] = json!(9);
    let refused = app
        .put(&api)
        .if_match(format!("\"{seen}\""))
        .json(a.clone())
        .expect(412)
        .await;
    assert_eq!(refused.json["error"], "version_conflict");
    assert_eq!(refused.json["current_version"], 3);
    assert_eq!(app.get(&api).expect(200).await.json["hard_limit"], 7);
    // So are edits of its parts and its deletion.
    app.put(&format!("{api}/domains/t"))
        .if_match(seen)
        .json(json!({}))
        .expect(412)
        .await;
    app.delete(&api).if_match(seen).expect(412).await;
    // A change to another resource does not conflict.
    app.put(&format!("{vm}/groups/probation/domains/new-9"))
        .if_match(seen)
        .expect(201)
        .await;
    // Based on the current version, it goes through.
    let current = app.get(&api).expect(200).await.etag();
    app.put(&api).if_match(current).json(a).expect(200).await;
    // A version from the future never matches; several may be listed.
    app.delete(&api).if_match(999).expect(412).await;
    // `*`: the target must exist.
    app.put(&resource_path("new"))
        .if_match("*")
        .json(search())
        .expect(412)
        .await;
    app.put(&api).if_match("*").json(search()).expect(200).await;
    // A resource deleted after the version it was based on conflicts.
    let before_delete = app.version().await;
    app.delete(&vm).expect(200).await;
    app.put(&vm)
        .if_match(before_delete)
        .json(vm_doc())
        .expect(412)
        .await;
    let v = app.version().await;
    app.put(&vm)
        .if_match(format!("\"1\", \"{v}\""))
        .json(vm_doc())
        .expect(201)
        .await;
    assert_eq!(
        app.put(&vm)
            .if_match("W/\"3\"")
            .json(vm_doc())
            .problems()
            .await,
        ["If-Match"]
    );

    // Namespaces.
    let v = app
        .put("/v1/namespaces/ns")
        .json(json!({}))
        .expect(201)
        .await
        .etag();
    app.put("/v1/namespaces/ns")
        .if_match(v)
        .json(json!({"allow_unconfigured": true}))
        .expect(200)
        .await;
    app.put("/v1/namespaces/ns")
        .if_match(v)
        .json(json!({}))
        .expect(412)
        .await;
    app.delete("/v1/namespaces/ns")
        .if_match(v)
        .expect(412)
        .await;

    // The whole configuration: any later commit conflicts.
    let v = app.version().await;
    app.put("/v1/config")
        .if_match(v - 1)
        .body("application/yaml", "resources: []\n")
        .expect(412)
        .await;
    app.put("/v1/config?dry_run=true")
        .if_match(v - 1)
        .body("application/yaml", "resources: []\n")
        .expect(412)
        .await;
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
        let none = call(None).expect(401).await;
        assert_eq!(none.json["error"], "unauthorized", "{method} {path}");
        assert_eq!(
            none.headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"charon-config\""
        );
        let wrong = call(Some("guess")).expect(401).await;
        assert!(
            wrong.headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("invalid_token")
        );
        let read_only = call(Some(READER)).expect(403).await;
        assert_eq!(read_only.json["error"], "forbidden");
    }
    // Not `Bearer`.
    app.put("/v1/namespaces/n")
        .anonymous()
        .header("authorization", "Basic d3JpdGVyOnRva2Vu")
        .json(json!({}))
        .expect(401)
        .await;
    // Reads are open; a dry run only needs to read.
    app.get("/v1/resources").anonymous().expect(200).await;
    app.put("/v1/config?dry_run=true")
        .anonymous()
        .json(json!({"resources": []}))
        .expect(200)
        .await;
    assert_eq!(app.version().await, 0);

    // With no write token configured, nothing can be written.
    let closed = db.app_with(Tokens::new(), StoreOptions::default()).await;
    let refused = closed
        .put("/v1/namespaces/n")
        .json(json!({}))
        .expect(401)
        .await;
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
        .expect(401)
        .await;

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
        closed.get(path).anonymous().expect(401).await;
        closed.get(path).token(READER).expect(400).await;
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
        app.get(path).anonymous().expect(401).await;
        app.get(path).token(READER).expect(200).await;
        app.get(path).expect(200).await;
    }
    // The OpenAPI document stays open.
    app.get("/openapi.json").anonymous().expect(200).await;
}

async fn changes_since_give_deltas_and_snapshots(db: TestDb) {
    let app = db.app().await;
    let empty = app.get("/v1/changes?since=0").expect(200).await;
    assert_eq!(empty.json["snapshot"], true);
    assert_eq!(empty.json["version"], 0);
    let epoch = empty.json["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 32);

    let api = resource_path("api/search");
    let vm = resource_path("sandbox/vm");
    app.put(&api).json(search()).expect(201).await; // 1
    app.put(&vm).json(vm_doc()).expect(201).await; // 2
    app.put("/v1/namespaces/api")
        .json(json!({"allow_unconfigured": true}))
        .expect(201)
        .await; // 3
    app.put("/v1/namespaces/old")
        .json(json!({}))
        .expect(201)
        .await; // 4

    let snapshot = app.get("/v1/changes").expect(200).await;
    assert_eq!(snapshot.json["snapshot"], true);
    assert_eq!(snapshot.json["since"], 0);
    assert_eq!(snapshot.json["resources"].as_array().unwrap().len(), 2);
    assert_eq!(snapshot.json["namespaces"].as_object().unwrap().len(), 2);
    assert_eq!(snapshot.etag(), 4);

    // Changes after 4: a tier limit lowered, a member added, a resource
    // and a namespace deleted, a namespace changed.
    let mut lower = search();
    lower["tiers"][0]["limit"] = json!(2);
    app.put(&api).json(lower).expect(200).await; // 5
    app.put(&format!("{vm}/groups/probation/domains/new-2"))
        .expect(201)
        .await; // 6
    app.delete(&vm).expect(200).await; // 7
    app.put(&resource_path("x/y"))
        .json(search())
        .expect(201)
        .await; // 8
    app.delete("/v1/namespaces/old").expect(200).await; // 9
    app.put("/v1/namespaces/api")
        .json(json!({"ignore_configured": true}))
        .expect(200)
        .await; // 10

    let delta = app
        .get(&format!("/v1/changes?since=4&epoch={epoch}"))
        .expect(200)
        .await;
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
    let delta = app.get("/v1/changes?since=5").expect(200).await;
    assert_eq!(delta.json["snapshot"], false);
    assert_eq!(delta.json["deleted_resources"], json!(["sandbox/vm"]));
    let delta = app.get("/v1/changes?since=6").expect(200).await;
    assert_eq!(delta.json["deleted_resources"], json!(["sandbox/vm"]));
    assert_eq!(delta.json["resources"][0]["name"], "x/y");

    // Up to date: an empty delta.
    let none = app.get("/v1/changes?since=10").expect(200).await;
    assert_eq!(none.json["snapshot"], false);
    assert_eq!(none.json["resources"], json!([]));
    assert_eq!(none.json["deleted_resources"], json!([]));
    assert_eq!(none.json["namespaces"], json!({}));
    // A version the service never had, or another epoch: a snapshot.
    let ahead = app.get("/v1/changes?since=11").expect(200).await;
    assert_eq!(ahead.json["snapshot"], true);
    assert_eq!(ahead.json["resources"].as_array().unwrap().len(), 2);
    let other = app.get("/v1/changes?since=4&epoch=0123").expect(200).await;
    assert_eq!(other.json["snapshot"], true);
    assert_eq!(other.json["deleted_resources"], json!([]));

    let bad = app.get("/v1/changes?since=-1").expect(400).await;
    assert_eq!(bad.json["error"], "invalid");
    app.get("/v1/changes?since=soon").expect(400).await;
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
            .expect(201)
            .await;
    }
    // Versions 4..=6 are kept: deltas from 3 on, snapshots before.
    let delta = app.get("/v1/changes?since=3").expect(200).await;
    assert_eq!(delta.json["snapshot"], false);
    assert_eq!(delta.json["resources"].as_array().unwrap().len(), 3);
    let old = app.get("/v1/changes?since=2").expect(200).await;
    assert_eq!(old.json["snapshot"], true);
    assert_eq!(old.json["resources"].as_array().unwrap().len(), 6);
    // If-Match on an absent resource further back than the history cannot
    // be proven safe: refused.
    app.put(&resource_path("fresh"))
        .if_match(1)
        .json(search())
        .expect(412)
        .await;
    // On an existing resource its own version decides.
    app.put(&resource_path("r/0"))
        .if_match(1)
        .json(vm_doc())
        .expect(200)
        .await;
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
        .expect(201)
        .await;
    app.put(&resource_path("sandbox/vm"))
        .json(vm_doc())
        .expect(201)
        .await;

    // A dry run shows the difference and changes nothing.
    let dry = app
        .put("/v1/config?dry_run=true")
        .body("application/yaml", FILE)
        .expect(200)
        .await;
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
        .expect(200)
        .await;
    assert_eq!(applied.json["dry_run"], false);
    assert_eq!(applied.json["version"], 3);
    assert_eq!(applied.json["diff"].as_array().unwrap().len(), 4);
    assert_eq!(app.version().await, 3);
    app.get(&resource_path("old/one")).expect(404).await;
    let delta = app.get("/v1/changes?since=2").expect(200).await;
    assert_eq!(delta.json["deleted_resources"], json!(["old/one"]));
    assert_eq!(delta.json["resources"].as_array().unwrap().len(), 2);

    // Export: the file, normalized.
    let yaml = app
        .get("/v1/config?format=yaml")
        .anonymous()
        .expect(200)
        .await;
    assert_eq!(yaml.headers[header::CONTENT_TYPE], "application/yaml");
    assert_eq!(yaml.etag(), 3);
    let (expected, _) = charon_core::config::Config::from_yaml(FILE).unwrap();
    assert_eq!(yaml.text, expected.to_yaml());
    let by_accept = app
        .get("/v1/config")
        .header("accept", "application/yaml")
        .expect(200)
        .await;
    assert_eq!(by_accept.text, yaml.text);
    let json_export = app.get("/v1/config").expect(200).await;
    assert_eq!(json_export.json, expected.to_value());
    app.get("/v1/config?format=toml").expect(400).await;

    // Importing the export changes nothing; nor does JSON of the same.
    let again = app
        .put("/v1/config")
        .body("application/yaml", &yaml.text)
        .expect(200)
        .await;
    assert_eq!(again.json["changed"], false);
    assert_eq!(again.json["version"], 3);
    assert_eq!(again.json["diff"], json!([]));
    let again = app
        .put("/v1/config")
        .json(json_export.json.clone())
        .expect(200)
        .await;
    assert_eq!(again.json["changed"], false);
    assert_eq!(app.version().await, 3);

    // Normalization of an import is reported with paths in the file.
    let adjusted = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - {name: a, kind: rate, tiers: [{limit: 1, window: 10s, active: 5s}]}\n",
        )
        .expect(200)
        .await;
    assert_eq!(
        adjusted.json["adjustments"][0]["path"],
        "resources[0].tiers[0].window"
    );
    assert_eq!(adjusted.json["version"], 4);
    let exported = app.get("/v1/config").expect(200).await;
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
        .expect(400).await;
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
        .expect(400)
        .await;
    assert!(bad.json["message"].as_str().unwrap().contains("YAML"));
    let dup = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - {name: a, kind: copy, domain_limit: 1}\n  - {name: a, kind: copy, domain_limit: 2}\n",
        )
        .expect(400).await;
    assert_eq!(dup.problem_paths(), ["resources[1].name"]);
    // A bad envoy: section is refused by path (tests/config_service/envoy.rs has the rest).
    let envoy = app
        .put("/v1/config")
        .body(
            "application/yaml",
            "resources: []\nenvoy:\n  domains:\n    - { domain: edge, descriptors: [ { key: health, resource: nowhere } ] }\n",
        )
        .expect(400).await;
    assert_eq!(
        envoy.problem_paths(),
        ["envoy.domains[0].descriptors[0].resource"]
    );
    let empty = app
        .put("/v1/config")
        .body("application/yaml", "  \n")
        .expect(400)
        .await;
    assert!(empty.json["message"].as_str().unwrap().contains("empty"));
    app.put("/v1/config")
        .body("application/json", "{")
        .expect(400)
        .await;
    app.put("/v1/config")
        .body("image/png", "resources: []")
        .expect(415)
        .await;
    app.put("/v1/config?dry_run=maybe")
        .body("application/yaml", "resources: []")
        .expect(400)
        .await;
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
                .expect(201)
                .await;
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
    let unencoded = app.get("/v1/resources/api/search").expect(404).await;
    assert!(unencoded.json["message"].as_str().unwrap().contains("%2F"));
    app.get("/v1/nothing").expect(404).await;
    // Names no one can store (PostgreSQL refuses NUL in text) are simply
    // not there, or invalid when written.
    app.get(&resource_path("a\0b")).expect(404).await;
    app.delete(&resource_path("a\0b")).expect(404).await;
    app.get("/v1/namespaces/%00").expect(404).await;
    app.delete("/v1/namespaces/%00").expect(404).await;
    app.put("/v1/namespaces/%00")
        .json(json!({}))
        .expect(400)
        .await;
    app.get("/v1/resources?namespace=%00").expect(200).await;
    app.get("/v1/changes?since=1&epoch=%00").expect(200).await;
    let wrong = app.method(Method::PATCH, "/v1/changes").expect(405).await;
    assert_eq!(wrong.json["error"], "method_not_allowed");
    assert!(wrong.headers.contains_key(header::ALLOW));
    // The same on the routes of a resource's parts.
    for path in ["domains", "domains/d", "groups", "groups/g"] {
        let path = format!("{}/{path}", resource_path("api/search"));
        let wrong = app.method(Method::PATCH, &path).expect(405).await;
        assert_eq!(wrong.json["error"], "method_not_allowed", "{path}");
        assert!(wrong.headers.contains_key(header::ALLOW), "{path}");
    }
}

/// A documented path with its parameters filled in.
fn concrete(path: &str) -> String {
    path.replace("{name}", "api%2Fsearch")
        .replace("{domain}", "d")
        .replace("{group}", "g")
        .replace("{namespace}", "n")
        .replace("{version}", "1")
}

/// Every operation the OpenAPI document lists exists (a request to it is
/// not answered 405 or "no such endpoint"); schemathesis checks the rest
/// (`tests/schemathesis.sh`).
#[tokio::test]
async fn every_documented_operation_is_served() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    let doc: Value = serde_json::from_str(charon_config_service::openapi_json()).unwrap();
    assert_eq!(app.get("/openapi.json").expect(200).await.json, doc);
    let mut count = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = concrete(path);
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
    assert_eq!(count, 25, "operations documented");
}

/// Each kind's resource schema names exactly the fields the configuration
/// parser accepts for that kind: a field added to one is added to both.
#[test]
fn each_resource_schema_lists_the_fields_the_parser_accepts() {
    let doc: Value = serde_json::from_str(charon_config_service::openapi_json()).unwrap();
    let schemas = &doc["components"]["schemas"];
    for kind in charon_core::config::KINDS {
        let name = format!("{}{}Resource", kind[..1].to_uppercase(), &kind[1..]);
        let properties = schemas[&name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {name}"));
        let mut documented: Vec<&str> = properties.keys().map(String::as_str).collect();
        let mut parsed = charon_core::config::resource_fields(kind).unwrap().to_vec();
        documented.sort_unstable();
        parsed.sort_unstable();
        assert_eq!(documented, parsed, "{name}");
    }
}

/// Every `$ref` in `v`, with where it is.
fn refs<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r);
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The generated OpenAPI document is valid JSON, OpenAPI 3.1, and lists
/// exactly the routes the router serves (a method it does not list answers
/// 405); every `$ref` resolves; every operation has the answers all
/// operations of its kind share.
#[tokio::test]
async fn the_openapi_document_describes_the_router() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    let doc: Value = serde_json::from_str(charon_config_service::openapi_json()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let routed = [
        "/openapi.json",
        "/v1/resources",
        "/v1/resources/{name}",
        "/v1/resources/{name}/domains",
        "/v1/resources/{name}/domains/{domain}",
        "/v1/resources/{name}/groups",
        "/v1/resources/{name}/groups/{group}",
        "/v1/resources/{name}/groups/{group}/domains/{domain}",
        "/v1/namespaces",
        "/v1/namespaces/{namespace}",
        "/v1/config",
        "/v1/changes",
        "/v1/audit",
        "/v1/audit/{version}",
    ];
    assert_eq!(paths.keys().collect::<Vec<_>>(), routed);

    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        let pointer = r.strip_prefix('#').unwrap();
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        if schema.get("properties").is_some() {
            assert_eq!(schema["additionalProperties"], false, "{name} is open");
        }
    }

    for (path, item) in paths {
        let concrete = concrete(path);
        for method in ["get", "put", "post", "delete"] {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let status = app.method(m, &concrete).send().await.status;
            let Some(op) = item.get(method) else {
                assert_eq!(status, 405, "{method} {path} is served but not documented");
                continue;
            };
            assert_ne!(status, 405, "{method} {path}");
            if path == "/openapi.json" {
                continue;
            }
            let answers = op["responses"].as_object().unwrap();
            let write = method != "get";
            let mut shared = vec!["400", "401", "503"];
            if write {
                shared.extend(["403", "412"]);
                assert!(
                    op["parameters"]
                        .as_array()
                        .unwrap()
                        .contains(&json!({"$ref": "#/components/parameters/IfMatch"})),
                    "{method} {path} takes If-Match"
                );
            }
            if op.get("requestBody").is_some() {
                shared.extend(["413", "415"]);
            }
            for status in shared {
                assert!(answers.contains_key(status), "{method} {path}: no {status}");
            }
            for (status, answer) in answers {
                if status.starts_with('2') {
                    assert!(
                        answer["headers"].get("ETag").is_some(),
                        "{method} {path} {status}: no ETag"
                    );
                }
            }
        }
    }
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
        .expect(201)
        .await;
    let epoch = app.get("/v1/changes").send().await.json["epoch"].clone();
    app.state.close().await;
    let app = db.app().await;
    let changes = app.get("/v1/changes").expect(200).await;
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
    let reply = app.get("/v1/resources").expect(503).await;
    assert_eq!(reply.json["error"], "unavailable");
    let reply = app
        .put("/v1/namespaces/n")
        .json(json!({}))
        .expect(503)
        .await;
    assert_eq!(reply.json["error"], "unavailable");
}

// ---- kind: bucket | window | queue, soft_limit, ban (SPEC §7–10) ----

fn orders() -> Value {
    json!({
        "kind": "bucket", "burst": 300, "count": 300, "period": "180m",
        "soft_limit": "80%", "domains": {"12345678": {"count": 600}}
    })
}

async fn buckets_windows_and_queues_are_stored_normalized(db: TestDb) {
    let app = db.app().await;
    let bucket = resource_path("acme/new-orders");
    let created = app.put(&bucket).json(orders()).expect(201).await;
    assert_eq!(created.json["resource"]["kind"], "bucket");
    let read = app.get(&bucket).expect(200).await;
    assert_eq!(
        read.json,
        json!({
            "name": "acme/new-orders", "kind": "bucket", "burst": 300, "count": 300,
            "period": "3h", "soft_limit": "80%", "domains": {"12345678": {"count": 600}}
        })
    );
    // The normalized form is a fixed point.
    let same = app.put(&bucket).json(read.json.clone()).expect(200).await;
    assert_eq!(same.json["changed"], false);

    let window = resource_path("edge/login");
    app.put(&window)
        .json(
            json!({"kind": "window", "algorithm": "sliding_counter", "limit": 2000,
                     "window": "20m", "ban": "1h"}),
        )
        .expect(201)
        .await;
    let read = app.get(&window).expect(200).await;
    assert_eq!(
        read.json,
        json!({"name": "edge/login", "kind": "window", "algorithm": "sliding_counter",
               "limit": 2000, "window": "20m", "ban": "1h"})
    );

    let queue = resource_path("batch/exports");
    app.put(&queue)
        .json(json!({"kind": "queue", "rate": 10, "period": "1000ms", "size": 50}))
        .expect(201)
        .await;
    assert_eq!(
        app.get(&queue).expect(200).await.json,
        json!({"name": "batch/exports", "kind": "queue", "rate": 10, "period": "1s", "size": 50})
    );

    // A capacity lease (SPEC §12): learning mode written out.
    let lease = resource_path("bigtable/qps");
    app.put(&lease)
        .json(
            json!({"kind": "lease", "capacity": 45.5, "algorithm": "fair_share",
                     "lease_length": "60000ms", "refresh_interval": "5s"}),
        )
        .expect(201)
        .await;
    assert_eq!(
        app.get(&lease).expect(200).await.json,
        json!({"name": "bigtable/qps", "kind": "lease", "capacity": 45.5,
               "algorithm": "fair_share", "lease_length": "1m", "refresh_interval": "5s",
               "learning_mode": "1m"})
    );

    // Rate resources keep soft_limit and ban, per override too.
    let rate = resource_path("api/search");
    let mut search = search();
    search["soft_limit"] = json!("90%");
    search["ban"] = json!("15m");
    app.put(&rate).json(search).expect(201).await;
    let read = app.get(&rate).expect(200).await;
    assert_eq!(
        (&read.json["soft_limit"], &read.json["ban"]),
        (&json!("90%"), &json!("15m"))
    );

    // Overrides, one domain at a time.
    let o = format!("{bucket}/domains/slow");
    let put = app
        .put(&o)
        .json(json!({"burst": 10, "ban": "60s"}))
        .expect(201)
        .await;
    assert_eq!(
        put.json["resource"]["domains"]["slow"],
        json!({"burst": 10, "ban": "1m"})
    );
    assert_eq!(
        app.get(&o).expect(200).await.json,
        json!({"burst": 10, "ban": "1m"})
    );
    let list = app.get(&format!("{bucket}/domains")).expect(200).await;
    let domains: Vec<&String> = list.json["domains"].as_object().unwrap().keys().collect();
    assert_eq!(domains, ["12345678", "slow"]);
    app.put(&format!("{window}/domains/x"))
        .json(json!({"algorithm": "fixed", "soft_limit": "50%"}))
        .expect(201)
        .await;
    app.put(&format!("{rate}/domains/x"))
        .json(json!({"soft_limit": "50%"}))
        .expect(201)
        .await;
    // Groups stay copy-only.
    let wrong = app
        .put(&format!("{queue}/groups/g"))
        .json(json!({"limit": 1}))
        .expect(422)
        .await;
    assert_eq!(wrong.json["error"], "wrong_kind");
}

async fn bad_buckets_windows_and_queues_answer_400_with_the_path(db: TestDb) {
    let app = db.app().await;
    let bucket = resource_path("acme/new-orders");
    let bad = app
        .put(&bucket)
        .json(
            json!({"kind": "bucket", "burst": 0, "count": 1, "period": "0s",
                     "soft_limit": "120%", "ban": "0s", "tiers": []}),
        )
        .expect(400)
        .await;
    let mut problems: Vec<String> = bad.json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}: {}",
                p["path"].as_str().unwrap(),
                p["message"].as_str().unwrap()
            )
        })
        .collect();
    problems.sort();
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems[0].starts_with("ban: \"0s\" must be positive"),
        "{problems:#?}"
    );
    assert_eq!(problems[1], "burst: 0 must be at least 1");
    assert!(
        problems[2].starts_with("soft_limit: \"120%\" must be above 0% and at most 100%"),
        "{problems:#?}"
    );
    assert!(
        problems[3].starts_with("tiers: not a field of a bucket resource"),
        "{problems:#?}"
    );
    // Bounds are checked in the order of Params::new: burst, then period.
    let bad = app
        .put(&bucket)
        .json(json!({"kind": "bucket", "burst": 0, "count": 1, "period": "1s"}))
        .expect(400)
        .await;
    assert_eq!(bad.json["problems"][0]["path"], "burst");
    assert_eq!(bad.json["problems"][0]["message"], "0 must be at least 1");
    assert_eq!(
        app.put(&bucket)
            .json(json!({"kind": "bucket", "burst": 1, "count": 1, "period": "0s"}))
            .problems()
            .await,
        ["period"]
    );
    assert_eq!(
        app.put(&bucket)
            .json(json!({"kind": "bucket", "burst": 9_007_199_254_740_991_u64, "count": 1, "period": "1s"}))
            .problems()
            .await,
        ["burst"]
    );
    assert_eq!(
        app.put(&resource_path("w"))
            .json(json!({"kind": "window", "algorithm": "sliding_counter",
                         "limit": 9_007_199_254_740_991_u64, "window": "1m"}))
            .problems()
            .await,
        ["limit"]
    );
    assert_eq!(
        app.put(&resource_path("q"))
            .json(json!({"kind": "queue", "rate": 1, "period": "1s"}))
            .problems()
            .await,
        ["size"]
    );
    assert_eq!(
        app.put(&resource_path("l"))
            .json(json!({"kind": "lease", "capacity": -1, "algorithm": "fair",
                         "lease_length": "1s", "refresh_interval": "5s"}))
            .problems()
            .await,
        ["capacity", "algorithm"]
    );
    assert_eq!(
        app.put(&resource_path("l"))
            .json(
                json!({"kind": "lease", "capacity": 1, "algorithm": "static",
                         "lease_length": "1s", "refresh_interval": "5s"})
            )
            .problems()
            .await,
        ["refresh_interval"]
    );
    assert_eq!(app.version().await, 0, "nothing stored");

    // An override: problems relative to the body sent.
    app.put(&bucket).json(orders()).expect(201).await;
    let o = format!("{bucket}/domains/x");
    let mut paths = app
        .put(&o)
        .json(json!({"count": 0, "soft_limit": 80, "hard_limit": 1}))
        .problems()
        .await;
    paths.sort();
    assert_eq!(paths, ["count", "hard_limit", "soft_limit"]);
    assert_eq!(
        app.put(&o).json(json!({"count": 0})).problems().await,
        ["count"]
    );
    // A combination that breaks an exactness bound is the override's.
    assert_eq!(
        app.put(&o)
            .json(json!({"burst": 9_007_199_254_740_991_u64}))
            .problems()
            .await,
        ["burst"]
    );
    assert_eq!(app.version().await, 1, "only the valid resource");
}

const KINDS_FILE: &str = "resources:
  - { name: b, kind: bucket, burst: 5, count: 1, period: 1s, ban: 1h, domains: { d: { count: 2 } } }
  - { name: w, kind: window, algorithm: fixed, limit: 7, window: 1m, soft_limit: 80% }
  - { name: q, kind: queue, rate: 10, period: 1s, size: 5 }
  - { name: r, kind: rate, soft_limit: 50%, tiers: [ { limit: 1, window: 1s } ] }
";

async fn the_new_kinds_import_and_export(db: TestDb) {
    let app = db.app().await;
    app.put("/v1/config")
        .body("application/yaml", KINDS_FILE)
        .expect(200)
        .await;
    let exported = app.get("/v1/config?format=json").expect(200).await;
    let kinds: Vec<&str> = exported.json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["bucket", "queue", "rate", "window"]);
    let version = app.version().await;
    // Importing what was exported changes nothing.
    let again = app
        .put("/v1/config")
        .json(exported.json.clone())
        .expect(200)
        .await;
    assert_eq!(again.json["changed"], false, "{}", again.text);
    assert_eq!(app.version().await, version);
    assert_eq!(
        exported.json["resources"][0]["domains"]["d"],
        json!({"count": 2})
    );
    assert_eq!(exported.json["resources"][3]["soft_limit"], "80%");
}

/// A database created before the bucket, window and queue kinds (only
/// migration 0001, whose `CHECK` admitted `rate` and `copy`) is migrated on
/// open: what it holds is kept, and the new kinds are accepted.
#[tokio::test]
async fn a_database_from_before_the_new_kinds_is_migrated() {
    use sqlx::ConnectOptions;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.db");
    let first = tempfile::tempdir().unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/0001_initial.sql"),
        first.path().join("0001_initial.sql"),
    )
    .unwrap();
    let document = json!({"name": "api/search", "kind": "rate", "tiers": [
        {"limit": 5, "window": "1s", "cooldown": "0s", "skippable": false}]});
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        sqlx::migrate::Migrator::new(first.path())
            .await
            .unwrap()
            .run(&mut conn)
            .await
            .unwrap();
        for statement in [
            "INSERT INTO charon_meta (id, version, history_floor, epoch) VALUES (1, 1, 0, 'before')",
            "INSERT INTO charon_changes (version, entity, name) VALUES (1, 'resource', 'api/search')",
        ] {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
        sqlx::query(
            "INSERT INTO charon_resources (name, kind, document, created_version, updated_version) \
             VALUES ('api/search', 'rate', $1, 1, 1)",
        )
        .bind(document.to_string())
        .execute(&mut conn)
        .await
        .unwrap();
        let refused = sqlx::query(
            "INSERT INTO charon_resources (name, kind, document, created_version, updated_version) \
             VALUES ('b', 'bucket', '{}', 1, 1)",
        )
        .execute(&mut conn)
        .await;
        assert!(refused.is_err(), "0001 admits rate and copy only");
    }
    let db = TestDb::at(&file);
    let app = db.app().await;
    assert_eq!(
        app.get(&resource_path("api/search")).expect(200).await.json,
        document
    );
    assert_eq!(app.version().await, 1);
    app.put(&resource_path("acme/new-orders"))
        .json(orders())
        .expect(201)
        .await;
    assert_eq!(
        app.get(&resource_path("acme/new-orders"))
            .expect(200)
            .await
            .json["kind"],
        "bucket"
    );
}
