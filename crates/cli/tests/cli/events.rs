//! Decision events (`charon serve --events`, docs/events.md) and `charon
//! top`, against real `charon serve` processes: exact events for a known
//! workload, rotation, sampling, a full disk (`/dev/full`, and a small
//! tmpfs that fills up and frees again), a FIFO nobody reads (a stalled
//! sink), and `charon top` drawn in a real terminal (tmux).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{bin, strict_client};
use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_testkit::{CharonProcess, SmallFs, wait_until};
use serde_json::Value;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 60s } ]
  - name: q
    kind: queue
    rate: 1
    period: 10s
    size: 5
  - name: vm
    kind: copy
    domain_limit: 3
  - name: open
    kind: rate
    tiers: [ { limit: 1000000, window: 1s } ]
"#;

fn start(extra: &[&str]) -> CharonProcess {
    CharonProcess::start(bin(), LIMITS, extra)
}

/// A metric's value: the line that starts with `series `.
fn metric(server: &CharonProcess, series: &str) -> u64 {
    let metrics = server.http_get("/metrics").expect("/metrics").1;
    crate::support::metric_in(&metrics, series)
        .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

fn written(server: &CharonProcess) -> u64 {
    metric(server, "charon_events_written_total")
}

fn dropped(server: &CharonProcess, reason: &str) -> u64 {
    metric(
        server,
        &format!("charon_events_dropped_total{{reason=\"{reason}\"}}"),
    )
}

/// Waits (at most 10 s) until `charon_events_written_total` is `n`.
fn wait_written(server: &CharonProcess, n: u64) {
    let reached = wait_until(Duration::from_secs(10), || written(server) >= n);
    assert!(reached, "{} events written, expected {n}", written(server));
    assert_eq!(written(server), n, "more events than decisions");
}

/// The events in a file, parsed.
fn events_in(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

/// `n` requests of one hit of `resource` for `domain`, one after another.
async fn requests(client: &charon_client::Client, resource: &str, domain: &str, n: u64) {
    for _ in 0..n {
        client
            .request(resource, domain)
            .send()
            .await
            .expect("a decision");
    }
}

/// A known workload through every path that decides (session requests,
/// a unary call, a queue, copies reserved and released, a client error)
/// gives exactly one event per decision, with its outcome and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_one_event_with_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let server = start(&["--events", path.to_str().unwrap()]);
    let c = strict_client(&server);
    requests(&c, "api", "d1", 7).await; // 5 granted, 2 rejected
    let g = c
        .request("api", "d2")
        .copies(7)
        .send()
        .await
        .expect("partial");
    assert_eq!(g.granted, 5);
    assert!(matches!(
        c.request("nope", "d1").send().await,
        Err(ref e) if e.is_client()
    ));
    requests(&c, "q", "d3", 2).await; // now, then after a delay
    let mut hold = c.reserve("vm", "d4").copies(2).send().await.expect("hold");
    hold.release_all().await.expect("release");
    let mut unary = LimiterClient::connect(server.endpoint())
        .await
        .expect("gRPC");
    let reply = unary
        .request(v1::RateRequest {
            resource: "api".into(),
            domain: "d5".into(),
            ..Default::default()
        })
        .await
        .expect("unary")
        .into_inner();
    assert_eq!(reply.granted, 1);

    wait_written(&server, 14);
    let events = events_in(&path);
    assert_eq!(events.len(), 14);
    let mut by: BTreeMap<(String, String), u64> = BTreeMap::new();
    for e in &events {
        let key = (
            e["operation"].as_str().unwrap().to_owned(),
            e["outcome"].as_str().unwrap().to_owned(),
        );
        *by.entry(key).or_default() += 1;
        assert!(e["server"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
        let time = e["time"].as_str().unwrap();
        humantime::parse_rfc3339(time).unwrap_or_else(|_| panic!("time {time:?}"));
    }
    let expected: BTreeMap<(String, String), u64> = [
        (("request", "granted"), 5 + 1 + 1),
        (("request", "rejected"), 2),
        (("request", "partial"), 1),
        (("request", "client_error"), 1),
        (("request", "delayed"), 1),
        (("reserve", "granted"), 1),
        (("release", "granted"), 1),
    ]
    .into_iter()
    .map(|((o, r), n)| ((o.to_owned(), r.to_owned()), n))
    .collect();
    assert_eq!(by, expected, "{events:#?}");

    let find = |domain: &str, outcome: &str| {
        events
            .iter()
            .find(|e| e["domain"] == domain && e["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {outcome} event of {domain}: {events:#?}"))
    };
    let partial = find("d2", "partial");
    assert_eq!(
        (&partial["requested"], &partial["granted"], &partial["tier"]),
        (&Value::from(7), &Value::from(5), &Value::from(1))
    );
    let rejected = find("d1", "rejected");
    assert_eq!(
        (&rejected["granted"], &rejected["remaining"]),
        (&Value::from(0), &Value::from(0))
    );
    assert!(
        find("d3", "delayed")["delay_ms"]
            .as_u64()
            .is_some_and(|d| d > 0)
    );
    let reserve = events.iter().find(|e| e["operation"] == "reserve").unwrap();
    assert_eq!(
        (&reserve["granted"], &reserve["held"]),
        (&Value::from(2), &Value::from(2))
    );
    let release = events.iter().find(|e| e["operation"] == "release").unwrap();
    assert_eq!(
        (&release["granted"], &release["held"]),
        (&Value::from(2), &Value::from(0))
    );
    assert_eq!(find("d1", "client_error")["resource"], "nope");
    for reason in ["queue_full", "rate_cap", "write_error"] {
        assert_eq!(dropped(&server, reason), 0, "{reason}");
    }

    // The live view and `charon top` on the file agree on the busiest pair.
    let (status, body) = server
        .http_get("/v1/top?window=60s&limit=2")
        .expect("/v1/top");
    assert_eq!(status, 200, "{body}");
    let top: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(top["decisions"], 14, "{top}");
    assert_eq!(top["limited"], 4, "{top}");
    assert_eq!(top["busiest"][0]["domain"], "d1", "{top}");
    assert_eq!(top["busiest"][0]["decisions"], 7, "{top}");
    assert_eq!(top["most_limited"][0]["domain"], "d1", "{top}");
    assert_eq!(top["most_limited"][0]["limited"], 2, "{top}");
    assert_eq!(top["busiest"].as_array().map(Vec::len), Some(2));
    let out = Command::new(bin())
        .args(["top", "--once", "--window", "60s", "--events"])
        .arg(&path)
        .output()
        .expect("charon top");
    assert!(out.status.success(), "{out:?}");
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(screen.contains("14 decisions, 4 limited"), "{screen}");
    let (pair, counts) = first_row(&screen, "BUSIEST").expect("a row");
    assert_eq!(pair, ("api".to_owned(), "d1".to_owned()), "{screen}");
    assert_eq!(counts, [7, 2], "{screen}");
}

/// The first pair listed under `title` in a `charon top` screen.
fn first_row(screen: &str, title: &str) -> Option<((String, String), Vec<u64>)> {
    let mut lines = screen.lines().skip_while(|l| l.trim() != title);
    lines.next()?; // the title
    lines.next()?; // the column names
    let row = lines.next()?;
    let words: Vec<&str> = row.split_whitespace().collect();
    if words.len() < 4 {
        return None;
    }
    let counts = words[2..].iter().filter_map(|w| w.parse().ok()).collect();
    Some(((words[0].to_owned(), words[1].to_owned()), counts))
}

/// Without `--events` there is no stream and no live view.
#[test]
fn the_live_view_needs_events() {
    let server = start(&[]);
    let (status, body) = server.http_get("/v1/top").expect("/v1/top");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--events"), "{body}");
    let metrics = server.http_get("/metrics").expect("metrics").1;
    assert!(!metrics.contains("charon_events_"), "{metrics}");
    let server = start(&["--events", "/dev/null"]);
    for bad in ["window=0s", "window=61s", "window=x", "limit=0", "limit=x"] {
        let (status, body) = server.http_get(&format!("/v1/top?{bad}")).expect("/v1/top");
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

/// Past `--events-max-bytes` the file is rotated to PATH.1 … PATH.N, and
/// only `--events-keep` of them are kept; no file grows past the bound and
/// the newest events are in PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_n_files_under_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let server = start(&[
        "--events",
        path.to_str().unwrap(),
        "--events-max-bytes",
        "2K",
        "--events-keep",
        "2",
    ]);
    let c = strict_client(&server);
    for i in 0..100 {
        requests(&c, "open", &format!("d{i:03}"), 1).await;
    }
    wait_written(&server, 100);
    let numbered = |i: u32| dir.path().join(format!("events.jsonl.{i}"));
    assert!(numbered(1).exists() && numbered(2).exists());
    assert!(!numbered(3).exists(), "only 2 rotated files are kept");
    let mut kept = Vec::new();
    for p in [numbered(2), numbered(1), path.clone()] {
        let size = std::fs::metadata(&p).unwrap().len();
        assert!(size <= 2048, "{} is {size} bytes", p.display());
        kept.extend(events_in(&p));
    }
    // Oldest first across the files, ending with the last decision.
    let domains: Vec<&str> = kept.iter().map(|e| e["domain"].as_str().unwrap()).collect();
    let mut sorted = domains.clone();
    sorted.sort_unstable();
    assert_eq!(domains, sorted, "files in order");
    assert_eq!(domains.last(), Some(&"d099"));
    assert!(domains.len() < 100, "older files were removed");
}

/// `--events-sample 0.25`: about a quarter of the decisions become events
/// (binomial: 4000 decisions put the ratio within ±0.03 but once in a
/// billion runs).
#[test]
fn sampling_keeps_about_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let server = start(&[
        "--events",
        path.to_str().unwrap(),
        "--events-sample",
        "0.25",
        "--events-max-per-second",
        "0",
    ]);
    let out = Command::new(bin())
        .args([
            "bench",
            "--server",
            &server.endpoint(),
            "--resource",
            "open",
        ])
        .args(["--domains", "50", "--concurrency", "8", "--rate", "4000"])
        .args(["--duration", "1s", "--warmup", "0s", "--json"])
        .output()
        .expect("bench");
    assert!(out.status.success(), "{out:?}");
    let decisions = metric(
        &server,
        "charon_decisions_total{operation=\"request\",resource=\"open\",outcome=\"granted\"}",
    );
    assert!(decisions >= 3000, "{decisions} decisions");
    std::thread::sleep(Duration::from_millis(500));
    let written = written(&server);
    let ratio = written as f64 / decisions as f64;
    assert!(
        (0.22..=0.28).contains(&ratio),
        "{written} events of {decisions} decisions: {ratio}"
    );
    assert_eq!(events_in(&path).len() as u64, written);
}

/// Over `--events-max-per-second` events are dropped as `rate_cap`,
/// never decisions.
#[test]
fn the_cap_drops_events_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let server = start(&[
        "--events",
        path.to_str().unwrap(),
        "--events-max-per-second",
        "10",
    ]);
    let out = Command::new(bin())
        .args([
            "bench",
            "--server",
            &server.endpoint(),
            "--resource",
            "open",
        ])
        .args([
            "--rate",
            "1000",
            "--duration",
            "1s",
            "--warmup",
            "0s",
            "--json",
        ])
        .output()
        .expect("bench");
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["errors"], 0, "{v}");
    std::thread::sleep(Duration::from_millis(500));
    let (written, capped) = (written(&server), dropped(&server, "rate_cap"));
    let decisions = metric(
        &server,
        "charon_decisions_total{operation=\"request\",resource=\"open\",outcome=\"granted\"}",
    );
    assert_eq!(
        written + capped,
        decisions,
        "every decision written or capped"
    );
    // At most 10 in any second of the server's clock (the cap's seconds
    // are those of the events' times), and the cap was reached.
    let mut per_second: BTreeMap<String, u64> = BTreeMap::new();
    for e in events_in(&path) {
        let second = e["time"].as_str().unwrap()[..19].to_owned();
        *per_second.entry(second).or_default() += 1;
    }
    assert_eq!(per_second.values().sum::<u64>(), written);
    assert!(per_second.values().all(|&n| n <= 10), "{per_second:?}");
    assert!(per_second.values().any(|&n| n == 10), "{per_second:?}");
    assert!(capped > 0);
}

/// A full disk (`/dev/full`: every write fails with ENOSPC): decisions
/// are answered as ever, every event is dropped as `write_error`, and the
/// failure is logged once, not per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_drops_events_not_decisions() {
    let server = start(&["--events", "/dev/full"]);
    let c = strict_client(&server);
    for i in 0..200 {
        let g = c
            .request("api", format!("d{i}"))
            .send()
            .await
            .expect("decided");
        assert_eq!(g.granted, 1);
    }
    let counted = wait_until(Duration::from_secs(10), || {
        dropped(&server, "write_error") == 200
    });
    assert!(counted, "write_error = {}", dropped(&server, "write_error"));
    assert_eq!(written(&server), 0);
    assert_eq!(dropped(&server, "queue_full"), 0);
    let log = server.log();
    assert_eq!(
        log.matches("cannot write to /dev/full").count(),
        1,
        "logged at most every 30 s:\n{log}"
    );
}

/// A disk that fills up and frees again (a small tmpfs): events are
/// dropped while it is full, and written again once there is room, by the
/// same server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_come_back_when_the_disk_has_room_again() {
    let Some(fs) = SmallFs::for_test("events_come_back_when_the_disk_has_room_again", 1 << 20)
    else {
        return;
    };
    let path = fs.path().join("events.jsonl");
    let server = start(&["--events", path.to_str().unwrap()]);
    let c = strict_client(&server);
    requests(&c, "open", "before", 10).await;
    wait_written(&server, 10);
    fs.fill();
    requests(&c, "open", "full", 50).await;
    // (The file's last page had room for a few lines.)
    let counted = wait_until(Duration::from_secs(10), || {
        written(&server) + dropped(&server, "write_error") == 60
    });
    let lost = dropped(&server, "write_error");
    assert!(counted && lost > 0, "write_error = {lost}");
    fs.free();
    // The sink rests a second after a failure before it is opened again.
    std::thread::sleep(Duration::from_millis(1200));
    requests(&c, "open", "after", 10).await;
    wait_written(&server, 70 - lost);
    let events = events_in(&path);
    let count = |d: &str| events.iter().filter(|e| e["domain"] == d).count() as u64;
    assert_eq!(count("before"), 10);
    assert_eq!(count("full"), 50 - lost);
    assert_eq!(count("after"), 10, "written again");
    assert!(server.log().contains("writing to"), "recovery is logged");
}

/// A stalled sink: a FIFO nobody reads blocks the writer thread (in
/// `open`). Decisions are all answered, the queue fills and the rest are
/// dropped as `queue_full`, exactly; once a reader attaches, the queued
/// events and new ones flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sink_fills_the_queue_and_drains_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("events.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let server = start(&["--events", fifo.to_str().unwrap(), "--events-queue", "100"]);
    let c = strict_client(&server);
    for i in 0..500 {
        let g = c
            .request("open", format!("d{i}"))
            .send()
            .await
            .expect("decided");
        assert_eq!(g.granted, 1);
    }
    assert_eq!(dropped(&server, "queue_full"), 400);
    assert_eq!(written(&server), 0);

    let reader = std::thread::spawn(move || {
        let file = std::fs::File::open(&fifo).expect("open the FIFO");
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line.expect("a line");
            lines.push(serde_json::from_str::<Value>(&line).expect("JSON"));
            if lines.len() == 110 {
                break;
            }
        }
        lines
    });
    wait_written(&server, 100);
    requests(&c, "open", "later", 10).await;
    wait_written(&server, 110);
    let lines = reader.join().expect("reader");
    assert_eq!(lines[0]["domain"], "d0", "the oldest queued first");
    assert_eq!(lines[99]["domain"], "d99");
    assert!(lines[100..].iter().all(|e| e["domain"] == "later"));
    assert_eq!(dropped(&server, "queue_full"), 400);
}

/// `charon top` in a real terminal (tmux, 200×50) against a server whose
/// busiest pair is known: the captured screen lists it first, with its
/// count, and the most limited pair first in its list; a key that is not q
/// changes nothing, q quits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_in_a_terminal_shows_the_busiest_pair_first() {
    let Some(tmux) = Tmux::new("top") else {
        println!("SKIPPED top_in_a_terminal_shows_the_busiest_pair_first: tmux is not installed");
        return;
    };
    let server = start(&["--events", "/dev/null"]);
    let c = strict_client(&server);
    requests(&c, "open", "hot", 40).await;
    requests(&c, "open", "warm", 20).await;
    requests(&c, "api", "cold", 8).await; // 5 granted, 3 rejected
    wait_written(&server, 68);

    let command = format!(
        "{} top --server {} --interval 200ms --window 60s",
        bin().display(),
        server.http_url()
    );
    tmux.session("top", &command);
    let mut screen = String::new();
    let drawn = wait_until(Duration::from_secs(10), || {
        screen = tmux.screen("top");
        first_row(&screen, "MOST LIMITED").is_some()
    });
    assert!(drawn, "no table on screen:\n{screen}");
    assert!(screen.contains("68 decisions, 3 limited"), "{screen}");
    let (pair, counts) = first_row(&screen, "BUSIEST").unwrap();
    assert_eq!(pair, ("open".to_owned(), "hot".to_owned()), "{screen}");
    assert_eq!(counts, [40, 0], "{screen}");
    let (pair, counts) = first_row(&screen, "MOST LIMITED").unwrap();
    assert_eq!(pair, ("api".to_owned(), "cold".to_owned()), "{screen}");
    assert_eq!(counts, [3, 8], "{screen}");
    assert!(screen.contains("(q quits)"), "{screen}");

    // A key that is not q changes nothing; q quits (the session ends with
    // its only process).
    tmux.run(&["send-keys", "-t", "top", "x"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        tmux.run(&["has-session", "-t", "top"]).status.success(),
        "x does not quit"
    );
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let quit = wait_until(Duration::from_secs(10), || {
        !tmux.run(&["has-session", "-t", "top"]).status.success()
    });
    assert!(quit, "q did not quit charon top");
}

/// `charon top` in a terminal gives the terminal back as it was once `q`
/// quits it: the shell it ran from echoes what is typed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_quits_on_q_and_gives_the_terminal_back() {
    let Some(tmux) = Tmux::new("q") else {
        println!("SKIPPED top_quits_on_q_and_gives_the_terminal_back: tmux is not installed");
        return;
    };
    let server = start(&["--events", "/dev/null"]);
    tmux.session("sh", "sh");
    let command = format!(
        "{} top --server {} --interval 100ms; echo top-exited-$?",
        bin().display(),
        server.http_url()
    );
    tmux.run(&["send-keys", "-t", "sh", &command, "Enter"]);
    tmux.shows("sh", "(q quits)");
    tmux.run(&["send-keys", "-t", "sh", "q"]);
    tmux.shows("sh", "top-exited-0");
    // Echo is back: what is typed now shows.
    tmux.run(&["send-keys", "-t", "sh", "echoed-again"]);
    tmux.shows("sh", "echoed-again");
}

/// A test's private tmux server (200×50 sessions), killed when dropped.
struct Tmux(String);

impl Tmux {
    /// `None` when tmux is not installed.
    fn new(name: &str) -> Option<Self> {
        Command::new("tmux").arg("-V").output().ok()?;
        Some(Self(format!("charon-test-{name}-{}", std::process::id())))
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux")
    }

    /// A detached session `name` running `command`.
    fn session(&self, name: &str, command: &str) {
        let started = self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "200",
            "-y",
            "50",
            command,
        ]);
        assert!(started.status.success(), "{started:?}");
    }

    fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", name]).stdout).into_owned()
    }

    /// Waits until session `name` shows `text`.
    fn shows(&self, name: &str, text: &str) {
        let shown = wait_until(Duration::from_secs(10), || self.screen(name).contains(text));
        assert!(shown, "{text:?} not on screen:\n{}", self.screen(name));
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Envoy's `ShouldRateLimit` and capacity leases pass the same point:
/// one event per decided descriptor (over its limit: `rejected`), and one
/// per resource of a `GetCapacity` call (the client id as the domain, the
/// wants and the lease as real numbers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_descriptors_and_leases_are_events() {
    use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use charon_proto::v1::capacity_client::CapacityClient;

    const CONFIG: &str = r#"
resources:
  - { name: e/api, kind: bucket, burst: 1, count: 1, period: 1h }
  - { name: db/qps, kind: lease, capacity: 10, algorithm: fair_share,
      lease_length: 1m, refresh_interval: 10s, learning_mode: 0s }
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: client
          resource: e/api
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let server = CharonProcess::start(bin(), CONFIG, &["--events", path.to_str().unwrap()]);
    let mut envoy = RateLimitServiceClient::connect(server.endpoint())
        .await
        .expect("gRPC");
    for _ in 0..2 {
        envoy
            .should_rate_limit(crate::support::envoy_request("edge", "client", "c1"))
            .await
            .expect("ShouldRateLimit");
    }
    let mut leases = CapacityClient::connect(server.endpoint())
        .await
        .expect("gRPC");
    for wants in [4.0, 20.0] {
        leases
            .get_capacity(v1::GetCapacityRequest {
                client_id: format!("lc-{wants}"),
                resources: vec![v1::ResourceWant {
                    resource: "db/qps".into(),
                    wants,
                    has: 0.0,
                    subclients: 0,
                }],
            })
            .await
            .expect("GetCapacity");
    }
    wait_written(&server, 4);
    let events = events_in(&path);
    let summary: Vec<(&str, &str, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["operation"].as_str().unwrap(),
                e["resource"].as_str().unwrap(),
                e["domain"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("envoy", "e/api", "c1", "granted"),
            ("envoy", "e/api", "c1", "rejected"),
            ("get_capacity", "db/qps", "lc-4", "granted"),
            ("get_capacity", "db/qps", "lc-20", "partial"),
        ],
        "{events:#?}"
    );
    assert_eq!(events[1]["remaining"], 0);
    assert_eq!(
        (&events[2]["requested"], &events[2]["granted"]),
        (&Value::from(4.0), &Value::from(4.0))
    );
}
