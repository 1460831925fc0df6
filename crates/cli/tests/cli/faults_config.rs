//! The embedded configuration service of a real `charon serve` under
//! faults: its database on a small filesystem that fills up and empties,
//! a write followed at once by a decision that depends on it, and the
//! files it creates. Run with `--nocapture` for one `FAULT` line per test.

use crate::support::{bin, grpc, put_json};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_testkit::{CharonProcess, SmallFs};
use serde_json::{Value, json};
use tonic::transport::Channel;

const TOKEN: &str = "faults-config-token";

/// `charon serve` on the embedded service, its database at `db`.
fn serve_embedded(db: &Path) -> CharonProcess {
    let db = db.display().to_string();
    CharonProcess::start_args(bin(), &["--db", &db, "--config-token", TOKEN], "/readyz")
}

/// One gRPC `Request` of one hit.
async fn request(
    grpc: &mut LimiterClient<Channel>,
    resource: &str,
    domain: &str,
) -> Result<v1::RateReply, tonic::Status> {
    grpc.request(v1::RateRequest {
        resource: resource.into(),
        domain: domain.into(),
        copies: None,
        min_copies: None,
        dry_run: false,
    })
    .await
    .map(tonic::Response::into_inner)
}

/// `/v1/resources/{name}` with the name percent-encoded.
fn resource_url(server: &CharonProcess, name: &str) -> String {
    format!(
        "{}/v1/resources/{}",
        server.http_url(),
        name.replace('/', "%2F")
    )
}

/// The status of a `PUT` of `body` to resource `name` with `token` (as
/// read from a token file).
async fn put_status(server: &CharonProcess, name: &str, token: &str, body: &Value) -> u16 {
    let url = resource_url(server, name);
    put_json(&reqwest::Client::new(), &url, token.trim(), body)
        .await
        .status()
        .as_u16()
}

/// What a write got.
#[derive(Debug)]
struct Answer {
    status: u16,
    version: Option<u64>,
    retry_after: Option<String>,
    in_force: Option<String>,
}

async fn put(http: &reqwest::Client, url: &str, body: &Value) -> Answer {
    let response = put_json(http, url, TOKEN, body).await;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after");
    let in_force = header("charon-config-in-force");
    let json: Value = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        version: (200..300)
            .contains(&status)
            .then(|| json["version"].as_u64())
            .flatten(),
        retry_after,
        in_force,
    }
}

fn tiers(limit: u64) -> Value {
    json!({"kind": "rate", "tiers": [{"limit": limit, "window": "1s"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_the_embedded_service_is_in_force_when_it_is_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = serve_embedded(&dir.path().join("charon.db"));
    let http = reqwest::Client::new();
    let url = resource_url(&server, "api/search");
    let mut grpc = grpc(&server).await;
    let mut stale = Vec::new();
    let mut not_in_force = 0;
    let started = Instant::now();
    for i in 0..100u64 {
        let limit = 1_000 + i;
        let answer = put(&http, &url, &tiers(limit)).await;
        assert!(
            answer.status == 200 || answer.status == 201,
            "write {i}: {answer:?}"
        );
        if answer.in_force.as_deref() != Some("true") {
            not_in_force += 1;
        }
        let seen = match request(&mut grpc, "api/search", "probe").await {
            Ok(reply) => reply.tier_limit,
            Err(status) => {
                stale.push((i, format!("{:?}", status.code())));
                continue;
            }
        };
        if seen != Some(limit) {
            stale.push((i, format!("{seen:?}")));
        }
    }
    let per_write = started.elapsed() / 100;
    println!(
        "FAULT write_then_request: injected 100 writes each followed at once by a gRPC Request \
         depending on it; expected every Request to see its write; observed {} stale {:?}, \
         {not_in_force} answers without charon-config-in-force: true, {per_write:?} per \
         write + request",
        stale.len(),
        &stale[..stale.len().min(10)],
    );
    assert!(stale.is_empty(), "{} of 100 stale: {stale:?}", stale.len());
    assert_eq!(not_in_force, 0);
}

/// A resource document of several kilobytes, so that every commit has to
/// grow SQLite's write-ahead log.
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

/// Names changed after `since` (`None`: a snapshot answered for a version
/// newer than the service's own).
async fn changed_since(server: &CharonProcess, since: u64) -> Option<Vec<String>> {
    let (code, body) = server
        .http_get(&format!("/v1/changes?since={since}"))
        .expect("changes");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    if v["snapshot"] != false && since > 0 {
        return None;
    }
    Some(
        v["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_acknowledged_on_a_full_disk_survive_a_crash_and_refusals_leave_nothing() {
    let Some(fs) = SmallFs::for_test("full_disk_serve", 2 << 20) else {
        return;
    };
    let db = fs.path().join("charon.db");
    let mut server = serve_embedded(&db);
    let http = reqwest::Client::new();
    let mut writes: Vec<(String, Answer)> = Vec::new();
    let mut slowest_refusal = Duration::ZERO;
    let mut write = async |server: &CharonProcess, i: usize| {
        let name = format!("fill/w{i}");
        let started = Instant::now();
        let answer = put(&http, &resource_url(server, &name), &fat(i)).await;
        let ok = (200..300).contains(&answer.status);
        if !ok {
            slowest_refusal = slowest_refusal.max(started.elapsed());
        }
        writes.push((name, answer));
        ok
    };
    for i in 0..3 {
        assert!(write(&server, i).await, "before the fault");
    }
    let filler = fs.fill();
    for i in 3..11 {
        write(&server, i).await;
    }
    let ready_while_full = server.http_get("/readyz").map(|r| r.0);
    fs.free();
    let freed = Instant::now();
    let mut i = 11;
    let mut recovered_after = None;
    while freed.elapsed() < Duration::from_secs(30) {
        i += 1;
        if write(&server, i).await {
            recovered_after = Some(freed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // poll interval
    }
    for _ in 0..3 {
        i += 1;
        write(&server, i).await;
    }
    // Every acknowledged write is in force before the crash.
    let mut grpc_before = grpc(&server).await;
    let mut not_in_force_before = Vec::new();
    for (name, answer) in &writes {
        if answer.version.is_some() && request(&mut grpc_before, name, "d").await.is_err() {
            not_in_force_before.push(name.clone());
        }
    }

    // A crash (SIGKILL), then a new process on the same file.
    server.kill();
    let server = serve_embedded(&db);
    let mut grpc_after = grpc(&server).await;
    let mut lost = Vec::new();
    let mut leaked = Vec::new();
    for (name, answer) in &writes {
        let known = request(&mut grpc_after, name, "d").await.is_ok();
        match answer.version {
            Some(v) => {
                let has = |n: Option<Vec<String>>| n.map(|n| n.contains(name));
                let at_v = has(changed_since(&server, v - 1).await) == Some(true)
                    && has(changed_since(&server, v).await) == Some(false);
                if !known || !at_v {
                    lost.push(format!("{name} (v{v})"));
                }
            }
            None if known => leaked.push(name.clone()),
            None => {}
        }
    }
    let statuses: Vec<u16> = writes.iter().map(|(_, a)| a.status).collect();
    let versions: Vec<u64> = writes.iter().filter_map(|(_, a)| a.version).collect();
    let refusals: Vec<&Answer> = writes
        .iter()
        .map(|(_, a)| a)
        .filter(|a| a.version.is_none())
        .collect();
    let metrics = server.http_get("/metrics").expect("metrics").1;
    let version_line = metrics
        .lines()
        .find(|l| l.starts_with("charon_config_version"))
        .unwrap_or("")
        .to_owned();
    println!(
        "FAULT full_disk_serve: injected the --db tmpfs (2 MiB) filled ({filler} B) during 8 \
         writes, freed, then SIGKILL and restart; expected every 2xx durable and in force, \
         every refusal a 503 with Retry-After that left nothing, recovery by itself; observed \
         statuses {statuses:?} (slowest refusal {slowest_refusal:?}), /readyz while full \
         {ready_while_full:?}, recovered \
         {recovered_after:?} after freeing, {} acknowledged (versions {versions:?}), {} lost \
         {lost:?}, {} refused, {} leaked {leaked:?}, not in force before the crash \
         {not_in_force_before:?}, after restart `{version_line}`",
        versions.len(),
        lost.len(),
        refusals.len(),
        leaked.len(),
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(
        leaked.is_empty(),
        "refused writes that left something: {leaked:?}"
    );
    assert!(not_in_force_before.is_empty(), "{not_in_force_before:?}");
    let expected: Vec<u64> = (1..=versions.len() as u64).collect();
    assert_eq!(versions, expected, "no gaps, no duplicates");
    assert!(
        refusals
            .iter()
            .all(|a| a.status == 503 && a.retry_after.is_some()),
        "{refusals:?}"
    );
    assert!(statuses.contains(&503), "the disk was really full");
    assert!(
        recovered_after.is_some(),
        "writes work again once space is back"
    );
    assert_eq!(
        version_line,
        format!("charon_config_version {}", versions.len())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_database_and_its_token_are_for_the_owner_only() {
    // No --config-token: the service makes one and keeps it beside the
    // database.
    let server = CharonProcess::start_args(bin(), &["--db", "{dir}/charon.db"], "/readyz");
    let token = std::fs::read_to_string(server.dir().join("charon.db.token")).expect("token");
    let status = put_status(&server, "api/x", &token, &tiers(3)).await;
    assert_eq!(status, 201);
    let mut modes = Vec::new();
    for file in [
        "charon.db",
        "charon.db-wal",
        "charon.db-shm",
        "charon.db.token",
    ] {
        let mode = std::fs::metadata(server.dir().join(file))
            .map(|m| format!("{:o}", m.permissions().mode() & 0o777))
            .unwrap_or_else(|e| e.to_string());
        modes.push((file, mode));
    }
    println!(
        "FAULT db_mode_serve: injected nothing (default umask); expected the database, its -wal \
         and -shm and the token file mode 600; observed {modes:?}"
    );
    assert!(modes.iter().all(|(_, m)| m == "600"), "{modes:?}");
}

/// Runs `charon serve` on the embedded service (no token given) and waits
/// for it to exit by itself: (exit code, stderr), or `None` if it was still
/// running after `limit` (then it is killed).
fn serve_until_exit(db: &Path, extra: &[&str], limit: Duration) -> Option<(Option<i32>, String)> {
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut child = crate::support::charon()
        .arg("serve")
        .args(["--db", &db.display().to_string()])
        .args(extra)
        .args([
            "--listen",
            &format!("127.0.0.1:{}", charon_testkit::free_port()),
        ])
        .args([
            "--http-listen",
            &format!("127.0.0.1:{}", charon_testkit::free_port()),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("spawn charon serve");
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let stderr = std::fs::read_to_string(log.path()).unwrap_or_default();
            return Some((status.code(), stderr));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_on_a_full_disk_fails_cleanly_and_leaves_no_empty_token() {
    let Some(fs) = SmallFs::for_test("full_disk_start", 1 << 20) else {
        return;
    };
    let db = fs.path().join("charon.db");
    let token_path = fs.path().join("charon.db.token");
    fs.fill();
    let first = serve_until_exit(&db, &[], Duration::from_secs(30));
    let token_left = std::fs::read_to_string(&token_path).ok();
    // With a token given, the database is the first thing to need space.
    let with_token = serve_until_exit(&db, &["--config-token", TOKEN], Duration::from_secs(30));
    let last_line = |run: &Option<(Option<i32>, String)>| {
        run.as_ref()
            .map(|(code, err)| (*code, err.lines().last().unwrap_or("").to_owned()))
    };

    // Space comes back: the next start makes its token and serves writes.
    fs.free();
    let mut server =
        CharonProcess::start_args(bin(), &["--db", &db.display().to_string()], "/readyz");
    let token = std::fs::read_to_string(&token_path).expect("a token now");
    let created = put_status(&server, "api/x", &token, &tiers(3)).await;

    // The disk fills while it is down: it starts anyway, and decides by
    // what the database holds.
    server.kill();
    fs.fill();
    let server = CharonProcess::start_args(bin(), &["--db", &db.display().to_string()], "/readyz");
    let decided = request(&mut grpc(&server).await, "api/x", "d").await;
    let refused = put_status(&server, "api/y", &token, &fat(1)).await;
    println!(
        "FAULT full_disk_start: injected a full tmpfs under --db at the first start, then again \
         under an existing database; expected exit 1 naming the file and the full disk and no \
         empty token left, then a normal start, then a start that decides by the stored limits \
         with writes 503; observed first start {:?}, token file left {token_left:?}, with a \
         token given {:?}, write after freeing {created}, decision on the full disk {:?}, write \
         on the full disk {refused}",
        last_line(&first),
        last_line(&with_token),
        decided.as_ref().map(|r| r.granted),
    );
    let (code, stderr) = first.expect("the first start exits by itself");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("charon.db") && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert_eq!(token_left, None, "no empty token file");
    let (code, last) = last_line(&with_token).expect("exits by itself");
    assert_eq!(code, Some(1));
    assert!(
        last.contains("charon.db") && last.contains("disk is full"),
        "{last}"
    );
    assert_eq!(created, 201);
    assert_eq!(decided.expect("decided").granted, 1);
    assert_eq!(refused, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_token_file_left_by_an_unfinished_start_is_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("charon.db");
    let token_path = dir.path().join("charon.db.token");
    std::fs::write(&token_path, "").expect("an empty token file");
    let server = CharonProcess::start_args(bin(), &["--db", &db.display().to_string()], "/readyz");
    let token = std::fs::read_to_string(&token_path).expect("token");
    let status = put_status(&server, "api/x", &token, &tiers(3)).await;
    println!(
        "FAULT empty_token: injected an empty charon.db.token; expected a new token written \
         and writes with it accepted; observed token of {} characters, write {status}",
        token.trim().len()
    );
    assert_eq!(token.trim().len(), 32, "{token:?}");
    assert_eq!(status, 201);
}
