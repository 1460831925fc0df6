//! The HTTP listener of a real `charon serve` (the one that also serves
//! `/metrics` and `/healthz`) under unauthenticated load on the simulator's
//! replay API. Run with `--nocapture` for one `FAULT` line per test.

use crate::support::bin;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use charon_testkit::CharonProcess;
use serde_json::{Value, json};

const LIMITS: &str = "\
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 1s } ]
";

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The most RSS 32 concurrent worst-case replays may add to an idle
/// server (docs/operations-notes/bounded-input.md).
const REPLAY_RSS_BOUND_MIB: u64 = 100;

/// The largest replay of `detail: "replies"` the bounds allow: 10 000
/// events of two copies each, over 10 tiers (events × tiers = 100 000,
/// MAX_EVENT_TIERS).
fn replies_worst_case() -> Value {
    let tiers: Vec<Value> = (0..10)
        .map(|i| json!({"limit": 1_000 * (i + 1), "window": "60s", "active": "1s", "cooldown": "1s"}))
        .collect();
    let events: Vec<Value> = (0..10_000u64)
        .map(|t| json!({"t": 1_000_000 + t * 3, "copies": 2, "min_copies": 1}))
        .collect();
    json!({"name": "worst/replies", "tiers": tiers, "events": events, "detail": "replies"})
}

/// The largest replay of `detail: "full"` the bounds allow: 600 events
/// listed with all 32 tiers each (19 200 tier states, under
/// MAX_LISTED_TIER_STATES).
fn full_worst_case() -> Value {
    let tiers: Vec<Value> = (0..32)
        .map(|i| json!({"limit": 10 * (i + 1), "window": "2ms"}))
        .collect();
    let events: Vec<Value> = (0..600u64)
        .map(|t| json!({"t": t, "copies": 3, "min_copies": 1}))
        .collect();
    json!({"name": "worst/full", "tiers": tiers, "events": events, "detail": "full"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simulator_replay_memory_is_bounded() {
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let url = format!("{}/simulator/api/run", server.http_url());
    let http = reqwest::Client::new();
    // Warm up with one small replay, then take the idle size.
    let small = json!({"tiers": [{"limit": 5, "window": "1s"}], "events": [{"t": 0}]});
    let warm = http.post(&url).json(&small).send().await.expect("answers");
    assert_eq!(warm.status().as_u16(), 200);
    let pid = server.pid();
    let idle = rss_kib(pid);

    let bodies = [
        Arc::new(serde_json::to_vec(&replies_worst_case()).expect("encode")),
        Arc::new(serde_json::to_vec(&full_worst_case()).expect("encode")),
    ];
    let sizes = [bodies[0].len(), bodies[1].len()];
    // Two storms: what the first leaves with the allocator, the second
    // reuses; nothing adds up.
    let mut peaks = Vec::new();
    let mut afters = Vec::new();
    let mut firsts = Vec::new();
    let mut not_ok = Vec::new();
    let mut health = Vec::new();
    for _storm in 0..2 {
        let (answers, peak, h) = storm(&server, &url, &bodies, idle).await;
        // (kind, final status, first status, requests replayed)
        let count = |kind: usize, status: u16| {
            answers
                .iter()
                .filter(|a| a.0 == kind && a.2 == status)
                .count()
        };
        firsts.push(format!(
            "replies 200x{} 429x{}, full 200x{} 429x{}",
            count(0, 200),
            count(0, 429),
            count(1, 200),
            count(1, 429)
        ));
        not_ok.extend(answers.iter().copied().filter(|a| {
            a.1 != 200
                || (a.2 != 200 && a.2 != 429)
                || a.3 != Some(if a.0 == 0 { 10_000 } else { 600 })
        }));
        peaks.push(peak.saturating_sub(idle) / 1024);
        afters.push(rss_kib(pid).saturating_sub(idle) / 1024);
        health.push(h);
    }
    let added_mib = peaks.iter().copied().max().unwrap_or(0);
    println!(
        "FAULT simulator_replay_memory: injected 2 storms of 32 concurrent POST \
         /simulator/api/run, each 16 of 10000 events x 10 tiers (detail replies, {} B) and 16 of \
         600 events x 32 tiers (detail full, {} B), from clients that retry after Retry-After; \
         expected 429 + Retry-After or 200 (every replay done in the end), /healthz answered, \
         peak RSS under idle + {REPLAY_RSS_BOUND_MIB} MiB; observed first attempts [{}]; not \
         done: {not_ok:?}; /healthz {health:?}; RSS idle {} MiB, peak +{:?} MiB, after each \
         storm +{:?} MiB",
        sizes[0],
        sizes[1],
        firsts.join("] ["),
        idle / 1024,
        peaks,
        afters,
    );
    assert!(not_ok.is_empty(), "{not_ok:?}");
    assert!(health.iter().all(|h| *h == Some(200)), "{health:?}");
    assert!(
        added_mib < REPLAY_RSS_BOUND_MIB,
        "the replays added {added_mib} MiB"
    );
}

type Answer = (usize, u16, u16, Option<u64>);

/// 32 concurrent replays, alternately of each body, by clients that wait
/// Retry-After after a 429; every answer, the peak RSS seen meanwhile and
/// what `/healthz` answered during the storm.
async fn storm(
    server: &CharonProcess,
    url: &str,
    bodies: &[Arc<Vec<u8>>; 2],
    idle: u64,
) -> (Vec<Answer>, u64, Option<u16>) {
    let http = reqwest::Client::new();
    let pid = server.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(idle));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (http, url, body) = (http.clone(), url.to_owned(), bodies[i % 2].clone());
        // A client that does as a 429 says: waits Retry-After, tries again.
        tasks.push(tokio::spawn(async move {
            let mut first = None;
            for _ in 0..120 {
                let r = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.as_ref().clone())
                    .send()
                    .await;
                let Ok(r) = r else {
                    return (i % 2, 0, first.unwrap_or(0), None);
                };
                let status = r.status().as_u16();
                first.get_or_insert(status);
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                if status == 429 {
                    let Some(seconds) = retry_after else {
                        return (i % 2, 429, first.unwrap_or(0), None);
                    };
                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                    continue;
                }
                let v: Value = r.json().await.unwrap_or(Value::Null);
                return (
                    i % 2,
                    status,
                    first.unwrap_or(0),
                    v["totals"]["requests"].as_u64(),
                );
            }
            (i % 2, 429, first.unwrap_or(0), None)
        }));
    }
    // The listener answers health checks meanwhile.
    let health = server.http_get("/healthz").map(|(code, _)| code);
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("task"));
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    (answers, peak.load(Ordering::Relaxed), health)
}
