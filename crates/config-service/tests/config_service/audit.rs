//! The audit trail (issue 16): every commit records the name of the token
//! that made it, the diff of the normalized YAML and the configuration it
//! left, in the commit's own transaction; `GET /v1/audit` pages them. The
//! same scenarios run on SQLite and on a private PostgreSQL.

use crate::support;

use charon_config_service::{StoreOptions, Tokens};
use serde_json::{Value, json};
use support::{TestDb, resource_path};

on_both_databases!(
    named_tokens_are_recorded_with_their_diffs,
    audit_reads_follow_the_read_rules,
    a_refused_commit_leaves_no_audit_entry,
    audit_paging_and_bounds,
    audit_rows_beyond_the_kept_versions_are_pruned,
);

const ALICE: &str = "alice-secret";
const BOB: &str = "bob-secret";
const VIEWER: &str = "viewer-secret";

fn tokens() -> Tokens {
    Tokens::parse(&format!(
        "write:alice={ALICE},write:bob={BOB},read:viewer={VIEWER}"
    ))
    .unwrap()
}

fn rate(hard_limit: u64) -> Value {
    json!({"kind": "rate", "hard_limit": hard_limit, "tiers": [{"limit": 5, "window": "1s"}]})
}

/// Versions 1 to 5: resource `a` made, then changed four times.
async fn five_commits(app: &support::TestApp) {
    for n in 1..=5 {
        app.put(&resource_path("a"))
            .token(ALICE)
            .json(rate(n))
            .expect(if n == 1 { 201 } else { 200 })
            .await;
    }
}

fn entries(reply: &support::Reply) -> Vec<Value> {
    reply.json["entries"].as_array().unwrap().clone()
}

async fn named_tokens_are_recorded_with_their_diffs(db: TestDb) {
    let app = db.app_with(tokens(), StoreOptions::default()).await;
    let path = resource_path("api/search");
    app.put(&path)
        .token(ALICE)
        .json(rate(100))
        .expect(201)
        .await;
    app.put(&path).token(BOB).json(rate(80)).expect(200).await;
    // The same again changes nothing: no version, no audit entry.
    let same = app.put(&path).token(BOB).json(rate(80)).expect(200).await;
    assert_eq!(same.json["changed"], false);
    // A whole-configuration import is recorded with its token too.
    app.put("/v1/config")
        .token(ALICE)
        .body(
            "application/yaml",
            "namespaces: {api: {allow_unconfigured: true}}\nresources: []\n",
        )
        .expect(200)
        .await;

    let log = app.get("/v1/audit").anonymous().expect(200).await;
    assert_eq!(log.etag(), 3);
    let e = entries(&log);
    let summary: Vec<(u64, &str)> = e
        .iter()
        .map(|e| (e["version"].as_u64().unwrap(), e["token"].as_str().unwrap()))
        .collect();
    assert_eq!(summary, [(3, "alice"), (2, "bob"), (1, "alice")]);
    assert!(log.json.get("next_before").is_none(), "{}", log.text);
    for entry in &e {
        // RFC 3339, UTC, milliseconds; no configuration in the list.
        let time = entry["time"].as_str().unwrap();
        assert!(time.len() == 24 && time.ends_with('Z'), "{time}");
        assert!(entry.get("config").is_none());
        let change = entry["change"].as_str().unwrap();
        assert!(
            change.starts_with("--- a/config.yaml\n+++ b/config.yaml\n@@"),
            "{change}"
        );
        for secret in [ALICE, BOB, VIEWER] {
            assert!(!log.text.contains(secret));
        }
    }
    let change = |i: usize| e[i]["change"].as_str().unwrap().to_owned();
    assert!(change(2).contains("+  hard_limit: 100"), "{}", change(2));
    assert!(
        change(1).contains("-  hard_limit: 100\n+  hard_limit: 80"),
        "{}",
        change(1)
    );
    assert!(change(0).contains("-- name: api/search"), "{}", change(0));
    assert!(change(0).contains("+  api:"), "{}", change(0));

    // One entry with the whole configuration it left, which imports back.
    let one = app.get("/v1/audit/2").anonymous().expect(200).await;
    assert_eq!(one.json["token"], "bob");
    let config = one.json["config"].as_str().unwrap().to_owned();
    assert!(config.contains("hard_limit: 80"), "{config}");
    let back = app
        .put("/v1/config")
        .token(BOB)
        .body("application/yaml", &config)
        .expect(200)
        .await;
    assert_eq!(back.json["version"], 4);
    let export = app.get("/v1/config?format=yaml").expect(200).await;
    assert_eq!(export.text, config);
    let log = app.get("/v1/audit?limit=1").expect(200).await;
    let newest = &entries(&log)[0];
    assert_eq!(
        (newest["version"].as_u64(), newest["token"].as_str()),
        (Some(4), Some("bob"))
    );
    // Version 4 undid version 3: its diff is 3's reversed.
    assert!(
        newest["change"]
            .as_str()
            .unwrap()
            .contains("+- name: api/search")
    );
}

async fn audit_reads_follow_the_read_rules(db: TestDb) {
    let app = db
        .app_with(tokens().reads_need_token(true), StoreOptions::default())
        .await;
    app.put(&resource_path("a"))
        .token(ALICE)
        .json(rate(1))
        .expect(201)
        .await;
    for path in ["/v1/audit", "/v1/audit/1"] {
        let refused = app.get(path).anonymous().expect(401).await;
        assert_eq!(refused.json["error"], "unauthorized");
        app.get(path).token("wrong").expect(401).await;
        app.get(path).token(VIEWER).expect(200).await;
        app.get(path).token(BOB).expect(200).await;
    }
    // A read token reads the configuration a rollback would import, but
    // cannot import it.
    let one = app.get("/v1/audit/1").token(VIEWER).expect(200).await;
    let config = one.json["config"].as_str().unwrap();
    app.put("/v1/config")
        .token(VIEWER)
        .body("application/yaml", config)
        .expect(403)
        .await;
}

async fn a_refused_commit_leaves_no_audit_entry(db: TestDb) {
    let app = db.app_with(tokens(), StoreOptions::default()).await;
    let path = resource_path("api/search");
    app.put(&path).token(ALICE).json(rate(10)).expect(201).await;
    // Refused inside the write transaction (after the version was bumped
    // and the audit's "before" read): nothing committed, no entry.
    app.put(&path)
        .token(BOB)
        .if_match(0)
        .json(rate(20))
        .expect(412)
        .await;
    app.put("/v1/config")
        .token(BOB)
        .if_match(0)
        .body("application/yaml", "resources: []\n")
        .expect(412)
        .await;
    // Invalid: refused before the commit.
    app.put(&path)
        .token(BOB)
        .json(json!({"kind": "rate", "hard_limit": -1}))
        .expect(400)
        .await;
    let log = app.get("/v1/audit").expect(200).await;
    let e = entries(&log);
    assert_eq!(e.len(), 1, "{}", log.text);
    assert_eq!(e[0]["token"], "alice");
    // The next commit still diffs against what version 1 left.
    app.put(&path).token(BOB).json(rate(30)).expect(200).await;
    let log = app.get("/v1/audit?limit=1").expect(200).await;
    let change = entries(&log)[0]["change"].as_str().unwrap().to_owned();
    assert!(
        change.contains("-  hard_limit: 10\n+  hard_limit: 30"),
        "{change}"
    );
    assert_eq!(entries(&log)[0]["version"], 2);
}

async fn audit_paging_and_bounds(db: TestDb) {
    let app = db.app_with(tokens(), StoreOptions::default()).await;
    five_commits(&app).await;
    let mut seen = Vec::new();
    let mut url = "/v1/audit?limit=2".to_owned();
    loop {
        let page = app.get(&url).expect(200).await;
        seen.extend(
            entries(&page)
                .iter()
                .map(|e| e["version"].as_u64().unwrap()),
        );
        match page.json["next_before"].as_u64() {
            Some(b) => url = format!("/v1/audit?limit=2&before={b}"),
            None => break,
        }
    }
    assert_eq!(seen, [5, 4, 3, 2, 1]);
    for bad in ["limit=0", "limit=1001", "limit=-1", "before=x"] {
        let reply = app.get(&format!("/v1/audit?{bad}")).expect(400).await;
        assert_eq!(reply.json["error"], "invalid", "{bad}");
    }
    app.get("/v1/audit?limit=1000").expect(200).await;
    let missing = app.get("/v1/audit/6").expect(404).await;
    assert_eq!(missing.json["error"], "not_found");
    app.get("/v1/audit/0").expect(404).await;
    app.get("/v1/audit/x").expect(400).await;
}

/// An audit row that cannot be written fails its commit: nothing of it
/// is committed (SQLite: a trigger refuses the insert).
#[tokio::test]
async fn an_audit_write_failure_fails_the_commit() {
    refused_audit_fails_the_commit("INSERT").await;
}

/// Old audit rows that cannot be pruned fail the commit that would prune
/// them, as an insert does (SQLite: a trigger refuses the delete).
#[tokio::test]
async fn an_audit_prune_failure_fails_the_commit() {
    refused_audit_fails_the_commit("DELETE").await;
}

/// With `audit_versions` 1 (every commit after the first prunes), a
/// trigger refusing `statement` on `charon_audit` after the first commit:
/// the second commit fails whole, the version stays 1.
async fn refused_audit_fails_the_commit(statement: &str) {
    let db = TestDb::sqlite();
    let options = StoreOptions {
        audit_versions: 1,
        ..StoreOptions::default()
    };
    let app = db.app_with(tokens(), options).await;
    let path = resource_path("api/search");
    app.put(&path).token(ALICE).json(rate(10)).expect(201).await;
    {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db.location)
            .connect()
            .await
            .unwrap();
        sqlx::query(&format!(
            "CREATE TRIGGER refuse_audit BEFORE {statement} ON charon_audit \
             BEGIN SELECT RAISE(ABORT, 'audit refused'); END"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let failed = app.put(&path).token(BOB).json(rate(20)).send().await;
    assert!(failed.status.is_server_error(), "{}", failed.text);
    let read = app.get(&path).expect(200).await;
    assert_eq!(read.json["hard_limit"], 10);
    assert_eq!(app.version().await, 1);
}

/// With `audit_versions: 3`, five commits leave the last three rows; the
/// older ones are gone (404), in the commits' own transactions.
async fn audit_rows_beyond_the_kept_versions_are_pruned(db: TestDb) {
    let options = StoreOptions {
        audit_versions: 3,
        ..StoreOptions::default()
    };
    let app = db.app_with(tokens(), options).await;
    five_commits(&app).await;
    let log = app.get("/v1/audit").expect(200).await;
    let versions: Vec<u64> = entries(&log)
        .iter()
        .map(|e| e["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [5, 4, 3]);
    app.get("/v1/audit/2").expect(404).await;
    let kept = app.get("/v1/audit/3").expect(200).await;
    assert!(
        kept.json["config"]
            .as_str()
            .unwrap()
            .contains("hard_limit: 3"),
        "{}",
        kept.json
    );
}
