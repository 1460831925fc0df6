//! Running the real `charon` binary from tests.

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Path of the binary cargo built for these tests.
pub fn charon() -> Command {
    Command::new(env!("CARGO_BIN_EXE_charon"))
}

/// Runs `charon simulate` with `config` on `input`; returns the output
/// lines parsed, and the exit status.
pub fn simulate_raw(config: &str, input: &[u8]) -> (Vec<Value>, std::process::ExitStatus, String) {
    simulate_in(config, input, "memory")
}

/// [`simulate_raw`] with `--store STORE`.
pub fn simulate_in(
    config: &str,
    input: &[u8],
    store: &str,
) -> (Vec<Value>, std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, config).expect("write config");
    let mut child = charon()
        .arg("simulate")
        .arg("--config")
        .arg(&path)
        .args(["--store", store])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn charon");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("charon runs");
    writer.join().expect("writer");
    let lines = String::from_utf8(out.stdout)
        .expect("stdout is UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad output line {l:?}: {e}")))
        .collect();
    (
        lines,
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `charon simulate` with `config` on `input`, which must succeed;
/// its output lines as written.
pub fn simulate_text(config: &str, input: &[u8]) -> Vec<String> {
    let (lines, status, stderr) = simulate_raw(config, input);
    assert!(status.success(), "charon simulate failed: {stderr}");
    lines.iter().map(ToString::to_string).collect()
}

/// Runs `charon simulate` on events in both stores, the in-memory one and
/// `--store redis://…` on a private redis-server, checks that they print
/// the same lines, and returns them; panics if either fails.
pub fn simulate(config: &str, events: &[Value]) -> Vec<Value> {
    let mut input = Vec::new();
    for e in events {
        serde_json::to_writer(&mut input, e).expect("encode");
        input.push(b'\n');
    }
    let (lines, status, stderr) = simulate_raw(config, &input);
    assert!(status.success(), "charon simulate failed: {stderr}");
    assert_eq!(lines.len(), events.len(), "one reply per event");
    let redis = charon_testkit::RedisServer::start();
    let (in_redis, status, stderr) = simulate_in(config, &input, &redis.url());
    assert!(
        status.success(),
        "charon simulate --store redis failed: {stderr}"
    );
    for (i, (m, r)) in lines.iter().zip(&in_redis).enumerate() {
        assert_eq!(m, r, "event {i} ({}): memory vs Redis", events[i]);
    }
    assert_eq!(in_redis.len(), lines.len(), "one reply per event in Redis");
    lines
}

/// A `request` event.
pub fn req(t: u64, resource: &str, domain: &str) -> Value {
    serde_json::json!({"t": t, "op": "request", "resource": resource, "domain": domain})
}

/// (granted, tier, burst) of a request reply.
pub fn gtb(v: &Value) -> (u64, u64, bool) {
    (
        v["granted"]
            .as_u64()
            .unwrap_or_else(|| panic!("no granted in {v}")),
        v["tier"].as_u64().expect("tier"),
        v["burst"].as_bool().expect("burst"),
    )
}

/// The binary cargo built for these tests, as a path.
pub fn bin() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_charon"))
}

/// A client of `server` with degraded mode off (tests want to see server
/// errors), a short back-off and a generous time limit.
pub fn strict_client(server: &charon_testkit::CharonProcess) -> charon_client::Client {
    let mut o = charon_client::ClientOptions::new(server.endpoint());
    o.fail_open = false;
    o.backoff_base = Duration::from_millis(50);
    o.request_timeout = Duration::from_secs(3);
    charon_client::Client::connect(o).expect("client")
}

/// A `charon client hold` process holding `copies` of `resource` for
/// `domain` on `server`; returned once the copies are held.
pub fn holder(
    server: &charon_testkit::CharonProcess,
    resource: &str,
    domain: &str,
    copies: u64,
) -> std::process::Child {
    use std::io::BufRead;
    let mut child = charon()
        .args([
            "client",
            "hold",
            "--server",
            &server.endpoint(),
            resource,
            domain,
            "--copies",
            &copies.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("the holder prints its grant");
    let v: Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(v["granted"], copies, "{line}");
    child
}

/// Polls `done` every 50 ms for at most `limit`; how long it took.
pub async fn within(limit: Duration, mut done: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if done().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The limits of the fleet and Redis fault tests: a rate resource nobody
/// exhausts, and a copy resource of 10 (per domain and in all).
pub const FLEET_LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 1000000, window: 1s } ]
  - name: vm
    kind: copy
    domain_limit: 10
    global_limit: 10
"#;

/// A `PUT` of `body` as JSON with `token` to the configuration API: the
/// response, whatever its status (the API must answer).
pub async fn put_json(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: &Value,
) -> reqwest::Response {
    http.put(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("the API answers")
}

/// A raw gRPC client of `server`'s limiter (no retries, no degraded mode).
pub async fn grpc(
    server: &charon_testkit::CharonProcess,
) -> charon_proto::v1::limiter_client::LimiterClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    charon_proto::v1::limiter_client::LimiterClient::new(channel)
}

/// `charon serve --config-api-only` on a database of its own, accepting
/// `token`: a configuration service for limiters to follow (`--config-url`).
pub fn config_service(token: &str) -> charon_testkit::CharonProcess {
    charon_testkit::CharonProcess::start_args(
        bin(),
        &[
            "--config-api-only",
            "--db",
            "{dir}/config.db",
            "--config-token",
            token,
        ],
        "/healthz",
    )
}

/// Runs `charon bench --server ENDPOINT ARGS --json`, checks that it exited
/// 0, and returns its JSON report.
pub fn bench_json(endpoint: &str, args: &[&str]) -> Value {
    let out = charon()
        .args(["bench", "--server", endpoint])
        .args(args)
        .arg("--json")
        .output()
        .expect("run bench");
    assert!(
        out.status.success(),
        "charon bench exited {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("charon bench prints JSON")
}

/// A bench report's latency percentiles are in order.
pub fn assert_percentiles_ordered(v: &Value) {
    assert!(
        v["p50_us"].as_u64() <= v["p99_us"].as_u64()
            && v["p99_us"].as_u64() <= v["p999_us"].as_u64(),
        "{v}"
    );
}

/// `redis-cli -p PORT ARGS` against a test's private Redis: its output.
pub fn redis_cli(redis: &charon_testkit::RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Envoy's `ShouldRateLimit` request on `domain` with one descriptor of
/// one entry, `key=value` (hits_addend 0: one hit).
pub fn envoy_request(
    domain: &str,
    key: &str,
    value: &str,
) -> charon_proto::envoy::service::ratelimit::v3::RateLimitRequest {
    use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    charon_proto::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Runs a suite of ours written in another language (`bash SCRIPT`, which
/// installs what it needs into Charon's per-machine cache and then tests
/// this package's `charon` binary, given as `CHARON_BIN`) and fails with
/// its whole output unless it passes.
pub fn run_suite_script(script: &std::path::Path) {
    let out = Command::new("bash")
        .arg(script)
        .env("CHARON_BIN", bin())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    println!("{stdout}");
}

/// A series' value in a Prometheus text exposition: the line that starts
/// with `series ` (name and labels exactly as the exporter writes them).
pub fn metric_in<T: std::str::FromStr>(metrics: &str, series: &str) -> Option<T> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (at most 10 s) until `server`'s `/metrics` counts `n` callers
/// waiting for a copy of `resource`: a test that needs a waiter queued
/// before it goes on waits for that, not for a while.
pub fn wait_queued(server: &charon_testkit::CharonProcess, resource: &str, n: u64) {
    let series = format!("charon_copy_queue_length{{resource=\"{resource}\"}}");
    let queued = || {
        server
            .http_get("/metrics")
            .and_then(|(_, metrics)| metric_in(&metrics, &series))
    };
    assert!(
        charon_testkit::wait_until(Duration::from_secs(10), || queued() == Some(n)),
        "{series} stayed {:?}, not {n}",
        queued()
    );
}
