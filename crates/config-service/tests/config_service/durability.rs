//! The configuration database failing under the API: a disk that fills
//! up and empties again, a database locked by another process, and who
//! may read the file. A write is acknowledged (2xx) only once it is
//! committed; every refusal is a 503 that left nothing behind; the service
//! recovers by itself.
//!
//! Run with `--nocapture` to see one `FAULT` line per test.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use charon_config_service::StoreOptions;
use charon_testkit::SmallFs;
use serde_json::{Value, json};
use support::{TestApp, TestDb, resource_path};

/// A resource document of several kilobytes (a few SQLite pages), so
/// that every commit has to grow the write-ahead log.
fn fat(i: usize) -> Value {
    let domains: serde_json::Map<String, Value> = (0..120)
        .map(|j| {
            (
                format!("tenant-{i}-{j}"),
                json!({"tiers": [{"limit": j + 1, "window": "1s"}]}),
            )
        })
        .collect();
    json!({"kind": "rate", "tiers": [{"limit": 5, "window": "1s"}], "domains": domains})
}

/// What one write got: its resource, status, version (if acknowledged),
/// and `Retry-After` (if refused).
#[derive(Debug)]
struct Outcome {
    name: String,
    status: u16,
    version: Option<u64>,
    retry_after: Option<String>,
}

async fn write(app: &TestApp, i: usize) -> Outcome {
    let name = format!("fill/w{i}");
    let reply = app.put(&resource_path(&name)).json(fat(i)).send().await;
    let status = reply.status.as_u16();
    let version = reply
        .status
        .is_success()
        .then(|| reply.json["version"].as_u64().unwrap());
    let retry_after = reply
        .headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    if !reply.status.is_success() {
        println!("  write {name}: {status} {}", reply.text);
    }
    Outcome {
        name,
        status,
        version,
        retry_after,
    }
}

/// Names changed after `since`, from the delta feed (`None`: the service
/// answered a snapshot, as it does for a version newer than its own).
async fn changed_since(app: &TestApp, since: u64) -> Option<Vec<String>> {
    let reply = app
        .get(&format!("/v1/changes?since={since}"))
        .send()
        .await
        .expect(200);
    // Since 0 is always a snapshot: the whole configuration.
    if reply.json["snapshot"] != false && since > 0 {
        return None;
    }
    Some(
        reply.json["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect(),
    )
}

/// `PRAGMA integrity_check` on the file, from a connection of its own.
async fn integrity_check(path: &str) -> String {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .unwrap();
    let answer: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    answer
}

/// What survived a restart, against what was answered: (acknowledged
/// writes lost or at another version, refused writes that left something).
async fn audit(app: &TestApp, outcomes: &[Outcome]) -> (Vec<String>, Vec<String>) {
    let mut lost = Vec::new();
    let mut leaked = Vec::new();
    for o in outcomes {
        let found = app
            .get(&resource_path(&o.name))
            .send()
            .await
            .status
            .as_u16();
        match o.version {
            Some(v) => {
                let changed = |names: Option<Vec<String>>| names.map(|n| n.contains(&o.name));
                let at_v = changed(changed_since(app, v - 1).await) == Some(true)
                    && changed(changed_since(app, v).await) == Some(false);
                if found != 200 || !at_v {
                    lost.push(format!("{} (v{v})", o.name));
                }
            }
            None if found != 404 => leaked.push(o.name.clone()),
            None => {}
        }
    }
    (lost, leaked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_full_disk_and_a_restart() {
    let Some(fs) = SmallFs::for_test("full_disk_api", 2 << 20) else {
        return;
    };
    let db = TestDb::at(&fs.path().join("charon.db"));
    let app = db.app().await;
    let mut outcomes = Vec::new();
    for i in 0..3 {
        outcomes.push(write(&app, i).await);
    }
    assert!(outcomes.iter().all(|o| o.status == 201), "{outcomes:?}");

    let filler = fs.fill();
    for i in 3..13 {
        outcomes.push(write(&app, i).await);
    }
    let while_full: Vec<u16> = outcomes[3..].iter().map(|o| o.status).collect();
    // Reads need no space: the feed of limiting servers goes on.
    let read_while_full = app.get("/v1/changes?since=0").send().await.status.as_u16();

    fs.free();
    let freed_at = Instant::now();
    let mut recovered_after = None;
    let mut i = 13;
    while freed_at.elapsed() < Duration::from_secs(30) {
        let o = write(&app, i).await;
        i += 1;
        let ok = o.status == 201;
        outcomes.push(o);
        if ok {
            recovered_after = Some(freed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // poll interval
    }
    for _ in 0..3 {
        outcomes.push(write(&app, i).await);
        i += 1;
    }

    // A restart: every connection closed, the file opened anew.
    app.state.close().await;
    let integrity = integrity_check(&db.location).await;
    let app = db.app().await;
    let (lost, leaked) = audit(&app, &outcomes).await;
    let acked: Vec<u64> = outcomes.iter().filter_map(|o| o.version).collect();
    let version_after = app.version().await;
    let refused: Vec<&Outcome> = outcomes.iter().filter(|o| o.version.is_none()).collect();
    println!(
        "FAULT full_disk_api: injected tmpfs of 2 MiB filled ({filler} B of filler) during 10 \
         writes, then freed; expected every 2xx durable, every refusal 503 + Retry-After leaving \
         nothing, recovery by itself; observed while full {while_full:?}, read while full \
         {read_while_full}, recovered {recovered_after:?} after freeing, {} acknowledged, \
         {} lost after restart {lost:?}, {} refused, {} leaked {leaked:?}, versions {acked:?}, \
         version after restart {version_after}, integrity_check {integrity}",
        acked.len(),
        lost.len(),
        refused.len(),
        leaked.len(),
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(
        leaked.is_empty(),
        "refused writes that left something: {leaked:?}"
    );
    assert_eq!(integrity, "ok");
    let expected: Vec<u64> = (1..=acked.len() as u64).collect();
    assert_eq!(acked, expected, "versions without gaps or duplicates");
    assert_eq!(version_after, acked.len() as u64);
    assert!(
        refused
            .iter()
            .all(|o| o.status == 503 && o.retry_after.is_some()),
        "refusals are 503 with Retry-After: {refused:?}"
    );
    assert!(
        while_full.contains(&503),
        "the disk was really full: {while_full:?}"
    );
    assert_eq!(read_while_full, 200);
    assert!(
        recovered_after.is_some(),
        "writes work again once space is back"
    );
}

/// A whole configuration whose `envoy:` section is fat (150 nodes, some
/// kilobytes: every commit has to grow the write-ahead log), its limits
/// numbered by `round` so that what is stored says which write it was.
fn envoy_config(round: u64) -> String {
    let mut yaml = String::from(
        "resources:\n  - { name: api/search, kind: bucket, burst: 10, count: 10, period: 1s }\n\
         envoy:\n  domains:\n    - domain: edge\n      descriptors:\n",
    );
    for j in 0..150 {
        yaml.push_str(&format!(
            "        - {{ key: tenant-{j}, rate_limit: {{ unit: minute, requests_per_unit: {} }} }}\n",
            round * 1000 + j + 1
        ));
    }
    yaml
}

/// The round of the `envoy:` section in force, as exported (`None`: none).
fn envoy_round(exported: &Value) -> Option<u64> {
    let nodes = exported["envoy"]["domains"][0]["descriptors"].as_array()?;
    assert_eq!(nodes.len(), 150, "the section is whole");
    let first = nodes[0]["rate_limit"]["requests_per_unit"].as_u64()?;
    let round = (first - 1) / 1000;
    for (j, n) in (0u64..).zip(nodes) {
        assert_eq!(
            n["rate_limit"]["requests_per_unit"].as_u64(),
            Some(round * 1000 + j + 1),
            "one write's section, not a mix: {n}"
        );
    }
    Some(round)
}

/// Imports of a configuration with an `envoy:` section while the disk is
/// full: each is refused with a server error (503 + Retry-After) that left
/// nothing, the section last acknowledged stays in force (and survives a
/// restart), reads go on, and imports work again once space is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_section_imports_on_a_full_disk_lose_nothing_acknowledged() {
    let Some(fs) = SmallFs::for_test("full_disk_envoy", 2 << 20) else {
        return;
    };
    let db = TestDb::at(&fs.path().join("charon.db"));
    let app = db.app().await;
    // (round, status, version if acknowledged, Retry-After if refused)
    let mut outcomes: Vec<(u64, u16, Option<u64>, Option<String>)> = Vec::new();
    let import = async |app: &TestApp, round: u64| {
        let reply = app
            .put("/v1/config")
            .body("application/yaml", &envoy_config(round))
            .send()
            .await;
        let status = reply.status.as_u16();
        if !reply.status.is_success() {
            println!("  import of round {round}: {status} {}", reply.text);
        }
        (
            round,
            status,
            reply
                .status
                .is_success()
                .then(|| reply.json["version"].as_u64().unwrap()),
            reply
                .headers
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned()),
        )
    };
    for round in 0..2 {
        outcomes.push(import(&app, round).await);
    }
    assert!(outcomes.iter().all(|o| o.1 == 200), "{outcomes:?}");

    let filler = fs.fill();
    for round in 2..12 {
        outcomes.push(import(&app, round).await);
    }
    let while_full: Vec<u16> = outcomes[2..].iter().map(|o| o.1).collect();
    let last_acked = |outcomes: &[(u64, u16, Option<u64>, Option<String>)]| {
        outcomes.iter().rev().find(|o| o.2.is_some()).map(|o| o.0)
    };
    // Reads need no space: the section in force is the last acknowledged.
    let read_while_full = app.get("/v1/config").send().await;
    let round_while_full = envoy_round(&read_while_full.json);

    fs.free();
    let freed_at = Instant::now();
    let mut round = 12;
    let mut recovered_after = None;
    while freed_at.elapsed() < Duration::from_secs(30) {
        let o = import(&app, round).await;
        round += 1;
        let ok = o.1 == 200;
        outcomes.push(o);
        if ok {
            recovered_after = Some(freed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // poll interval
    }

    // A restart: every connection closed, the file opened anew.
    app.state.close().await;
    let integrity = integrity_check(&db.location).await;
    let app = db.app().await;
    let exported = app.get("/v1/config").expect(200).await.json;
    let round_after = envoy_round(&exported);
    let feed = app.get("/v1/changes?since=0").expect(200).await.json;
    let round_in_feed = envoy_round(&feed);
    let acked: Vec<u64> = outcomes.iter().filter_map(|o| o.2).collect();
    let version_after = app.version().await;
    let refused: Vec<_> = outcomes.iter().filter(|o| o.2.is_none()).collect();
    println!(
        "FAULT full_disk_envoy: injected tmpfs of 2 MiB filled ({filler} B of filler) during 10 \
         imports of a configuration with a 150-node envoy: section, then freed; expected every \
         refusal 503 + Retry-After leaving nothing, the last acknowledged section in force and \
         durable, recovery by itself; observed while full {while_full:?}, read while full {} \
         (round {round_while_full:?}), recovered {recovered_after:?} after freeing, versions \
         {acked:?}, {} refused; after restart version {version_after}, round {round_after:?} \
         (feed {round_in_feed:?}), last acknowledged round {:?}, integrity_check {integrity}",
        read_while_full.status.as_u16(),
        refused.len(),
        last_acked(&outcomes),
    );
    assert!(
        while_full.contains(&503),
        "the disk was really full: {while_full:?}"
    );
    assert!(
        refused.iter().all(|o| o.1 == 503 && o.3.is_some()),
        "refusals are 503 with Retry-After: {refused:?}"
    );
    assert_eq!(read_while_full.status.as_u16(), 200);
    assert_eq!(round_while_full, last_acked(&outcomes[..12]));
    assert!(
        recovered_after.is_some(),
        "imports work again once space is back"
    );
    assert_eq!(
        round_after,
        last_acked(&outcomes),
        "nothing acknowledged lost"
    );
    assert_eq!(round_in_feed, round_after);
    let expected: Vec<u64> = (1..=acked.len() as u64).collect();
    assert_eq!(acked, expected, "versions without gaps or duplicates");
    assert_eq!(version_after, acked.len() as u64);
    assert_eq!(integrity, "ok");
}

/// Another process holding SQLite's write lock, released when its stdin
/// closes.
struct LockHolder(std::process::Child);

impl LockHolder {
    fn hold(db: &str) -> Self {
        let script = "import sqlite3, sys\n\
                      c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                      c.execute('BEGIN EXCLUSIVE')\n\
                      print('locked', flush=True)\n\
                      sys.stdin.read()\n\
                      c.execute('ROLLBACK')\n";
        let mut child = Command::new("python3")
            .args(["-c", script, db])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        Self(child)
    }

    fn release(mut self) {
        drop(self.0.stdin.take());
        assert!(self.0.wait().unwrap().success());
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_by_another_process_answers_503_not_500() {
    let db = TestDb::sqlite();
    let options = StoreOptions {
        lock_timeout: Duration::from_secs(1),
        ..StoreOptions::default()
    };
    let app = db.app_with(TestDb::tokens(), options).await;
    app.put(&resource_path("a/one"))
        .json(fat(1))
        .send()
        .await
        .expect(201);

    let lock = LockHolder::hold(&db.location);
    let started = Instant::now();
    let refused = app.put(&resource_path("a/two")).json(fat(2)).send().await;
    let waited = started.elapsed();
    let read = app
        .get(&resource_path("a/one"))
        .send()
        .await
        .status
        .as_u16();
    lock.release();

    // A lock held for less than the timeout only delays the write.
    let lock = LockHolder::hold(&db.location);
    let write = {
        let app = app.clone();
        tokio::spawn(async move { app.put(&resource_path("a/three")).json(fat(3)).send().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await; // the stall
    lock.release();
    let delayed = write.await.unwrap();
    let after = app.version().await;
    println!(
        "FAULT locked_db: injected BEGIN EXCLUSIVE held by another process (lock timeout 1s), \
         then one held 200 ms; expected 503 + Retry-After after the timeout, reads unaffected, \
         a shorter stall only delays; observed {} after {waited:?} (Retry-After {:?}), read {read}, \
         after the short stall {}, version {after}",
        refused.status,
        refused.headers.get("retry-after"),
        delayed.status,
    );
    assert_eq!(refused.status.as_u16(), 503, "{}", refused.text);
    assert_eq!(refused.json["error"], "unavailable");
    assert!(refused.headers.get("retry-after").is_some());
    assert_eq!(read, 200, "a reader does not wait for another writer");
    assert_eq!(delayed.status.as_u16(), 201, "{}", delayed.text);
    assert_eq!(after, 2, "the refused write left nothing: versions 1 and 2");
}

#[tokio::test]
async fn the_database_file_is_created_for_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("charon.db");
    let db = TestDb::at(&path);
    let app = db.app().await;
    app.put(&resource_path("a/one"))
        .json(fat(1))
        .send()
        .await
        .expect(201);
    let mut modes = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", path.display());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        modes.push((suffix, format!("{mode:o}")));
    }
    println!(
        "FAULT db_mode: injected nothing (umask of the test process); expected charon.db, -wal, \
         -shm mode 600; observed {modes:?}"
    );
    assert!(modes.iter().all(|(_, m)| m == "600"), "{modes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_writes_against_a_locked_database_is_refused_within_its_bounds() {
    let db = TestDb::sqlite();
    let options = StoreOptions {
        lock_timeout: Duration::from_secs(1),
        acquire_timeout: Duration::from_secs(1),
        ..StoreOptions::default()
    };
    let app = db.app_with(TestDb::tokens(), options).await;
    app.put(&resource_path("a/zero"))
        .json(fat(0))
        .send()
        .await
        .expect(201);
    let lock = LockHolder::hold(&db.location);
    let started = Instant::now();
    let flood: Vec<_> = (1..=32)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let reply = app
                    .put(&resource_path(&format!("a/{i}")))
                    .json(fat(i))
                    .send()
                    .await;
                (reply.status.as_u16(), started.elapsed())
            })
        })
        .collect();
    // Meanwhile the feed of limiting servers reads.
    let mut reads = Vec::new();
    tokio::time::sleep(Duration::from_millis(100)).await; // let the writers pile up
    for _ in 0..8 {
        reads.push(app.get("/v1/changes?since=0").send().await.status.as_u16());
    }
    let mut statuses = std::collections::BTreeMap::new();
    let mut slowest = Duration::ZERO;
    for task in flood {
        let (status, took) = task.await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
        slowest = slowest.max(took);
    }
    lock.release();
    let after = app
        .put(&resource_path("a/after"))
        .json(fat(99))
        .send()
        .await;
    let version = app.version().await;
    println!(
        "FAULT locked_db_flood: injected 32 concurrent writes while another process holds the \
         write lock (lock timeout 1 s, acquire timeout 1 s); expected every one \
         refused with 503, none waiting for ever, reads meanwhile answered, writes fine once \
         released; observed statuses {statuses:?}, slowest answer {slowest:?}, reads {reads:?}, \
         after release {}, version {version}",
        after.status
    );
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [503]);
    assert!(reads.iter().all(|&r| r == 200), "reads starved: {reads:?}");
    assert_eq!(after.status.as_u16(), 201, "{}", after.text);
    assert_eq!(version, 2, "the refused writes left nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_meta_row_locked_by_another_session_answers_503_not_500() {
    use sqlx::{Connection, Executor};
    let pg = tokio::task::spawn_blocking(charon_testkit::Postgres::start)
        .await
        .unwrap();
    let url = pg.create_database("locked");
    let db = TestDb::postgres(url.clone());
    let options = StoreOptions {
        lock_timeout: Duration::from_secs(1),
        ..StoreOptions::default()
    };
    let app = db.app_with(TestDb::tokens(), options).await;
    app.put(&resource_path("a/one"))
        .json(fat(1))
        .send()
        .await
        .expect(201);

    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    other.execute("BEGIN").await.unwrap();
    other
        .execute("SELECT version FROM charon_meta WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let started = Instant::now();
    let write = app.put(&resource_path("a/two")).json(fat(2)).send();
    // Bounded here so that a write waiting for ever fails the test.
    let refused = tokio::time::timeout(Duration::from_secs(30), write).await;
    let waited = started.elapsed();
    let read = app
        .get(&resource_path("a/one"))
        .send()
        .await
        .status
        .as_u16();
    other.execute("ROLLBACK").await.unwrap();
    let refused = refused.unwrap_or_else(|_| panic!("no answer after {waited:?}"));
    let after = app.put(&resource_path("a/three")).json(fat(3)).send().await;
    let version = app.version().await;
    println!(
        "FAULT locked_db_postgres: injected the meta row held FOR UPDATE by another session \
         (lock_timeout 1s); expected 503 + Retry-After after the timeout, reads unaffected, \
         writes fine once released; observed {} after {waited:?} (Retry-After {:?}), read \
         {read}, after release {}, version {version}",
        refused.status,
        refused.headers.get("retry-after"),
        after.status,
    );
    assert_eq!(refused.status.as_u16(), 503, "{}", refused.text);
    assert!(refused.headers.get("retry-after").is_some());
    assert_eq!(read, 200);
    assert_eq!(after.status.as_u16(), 201, "{}", after.text);
    assert_eq!(version, 2, "the refused write left nothing");
}
