//! Capacity leases (SPEC §12) through real `charon serve` processes and
//! `charon.v1.Capacity`:
//!
//! - two servers on one private Redis, six clients (three on each) asking
//!   for a fair share of 60: a sampler reads the leases page of both
//!   servers all along and never sees more than 60 leased; after three
//!   refresh rounds the leases are the fair shares, and again three rounds
//!   after a change of demand; a client that stops refreshing loses its
//!   lease at expiry and the others grow into it; one server SIGKILLed,
//!   its clients move to the other and keep their leases (they are in
//!   Redis); `/metrics` shows the resource's capacity and leases;
//! - `charon client lease` processes: one SIGKILLed loses its lease at
//!   expiry and the others grow into it; without a server each runs in its
//!   mode once its lease expired;
//! - a root, two leaves (`--lease-parent`) and two clients on each: the
//!   root's grants never exceed its capacity, the clients settle on the
//!   fair shares, and the leaves fall back to safe capacity once the root
//!   is gone and their grants expired;
//! - bad input on the embedded default: NaN and negative wants, unknown
//!   resources, a lease on a rate resource (and a rate request on a lease
//!   resource), a resource named twice, more than 100 resources, an empty
//!   client id: client errors (INVALID_ARGUMENT; NOT_FOUND for an unknown
//!   resource, FAILED_PRECONDITION for the wrong kind, as for every other
//!   operation), and nothing changed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::{bin, redis_cli};
use charon_proto::v1;
use charon_proto::v1::capacity_client::CapacityClient;
use charon_testkit::{CharonProcess, RedisServer};
use serde_json::Value;
use tonic::transport::Channel;

const CAPACITY: f64 = 60.0;
const CONFIG: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 60, algorithm: fair_share,
      lease_length: 3s, refresh_interval: 500ms, learning_mode: 0s }
  - { name: api, kind: rate, tiers: [ { limit: 5, window: 1s } ] }
"#;

async fn client(server: &CharonProcess) -> CapacityClient<Channel> {
    CapacityClient::connect(server.endpoint())
        .await
        .expect("connect")
}

fn ask(client: &str, wants: f64, has: f64) -> v1::GetCapacityRequest {
    v1::GetCapacityRequest {
        client_id: client.to_owned(),
        resources: vec![v1::ResourceWant {
            resource: "db/qps".into(),
            wants,
            has,
            subclients: 0,
        }],
    }
}

/// `client` gives its lease on `db/qps` back: whether it held one.
async fn release(c: &mut CapacityClient<Channel>, client: &str) -> Vec<bool> {
    c.release_capacity(v1::ReleaseCapacityRequest {
        client_id: client.to_owned(),
        resources: vec!["db/qps".into()],
    })
    .await
    .expect("released")
    .into_inner()
    .released
}

/// The leases page of `server`: (sum leased, leases by client).
fn page(server: &CharonProcess) -> Option<(f64, Vec<(String, f64)>)> {
    let (status, body) = server.http_get("/v1/leases")?;
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    let r = v["resources"]
        .as_array()?
        .iter()
        .find(|r| r["resource"] == "db/qps")?;
    let leases = r["leases"]
        .as_array()?
        .iter()
        .map(|l| {
            (
                l["client"].as_str().unwrap_or_default().to_owned(),
                l["capacity"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    Some((r["leased"].as_f64()?, leases))
}

/// Reads the leases pages of some servers every 10 ms until stopped: how
/// many answers, and the most leased in any of them.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, f64)>,
}

impl Sampler {
    fn start(http_urls: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ports: Vec<u16> = http_urls
            .iter()
            .map(|u| {
                u.rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("a port")
            })
            .collect();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let (mut samples, mut most) = (0u64, 0f64);
                while !stop.load(Ordering::Relaxed) {
                    for &port in &ports {
                        if let Some((200, body)) = charon_testkit::http_get(port, "/v1/leases") {
                            let v: Value = serde_json::from_str(&body).expect("JSON");
                            let leased = v["resources"][0]["leased"].as_f64().unwrap_or(0.0);
                            most = most.max(leased);
                            samples += 1;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                (samples, most)
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> (u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler")
    }
}

/// The six clients: each refreshes once per round, all at once, with what
/// it holds; returns their leases in order.
struct Clients {
    names: Vec<String>,
    wants: Vec<f64>,
    has: Vec<f64>,
    /// Which server each asks (an index into `conns`).
    via: Vec<usize>,
    conns: Vec<CapacityClient<Channel>>,
}

impl Clients {
    async fn round(&mut self, skip: &[usize]) -> Vec<f64> {
        let mut calls = Vec::new();
        for i in 0..self.names.len() {
            if skip.contains(&i) {
                continue;
            }
            let mut c = self.conns[self.via[i]].clone();
            let req = ask(&self.names[i], self.wants[i], self.has[i]);
            calls.push(tokio::spawn(async move { (i, c.get_capacity(req).await) }));
        }
        for call in calls {
            let (i, reply) = call.await.expect("the call's task");
            let lease = reply.expect("a lease").into_inner().leases;
            assert_eq!(lease.len(), 1);
            self.has[i] = lease[0].capacity;
        }
        self.has.clone()
    }

    async fn rounds(&mut self, n: usize, skip: &[usize]) -> Vec<f64> {
        for _ in 1..n {
            self.round(skip).await;
        }
        self.round(skip).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_share_fairly_and_never_over_commit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut servers = [
        CharonProcess::start(bin(), CONFIG, &["--store", url.as_str()]),
        CharonProcess::start(bin(), CONFIG, &["--store", url.as_str()]),
    ];
    let conns = vec![client(&servers[0]).await, client(&servers[1]).await];

    // The sampler: both servers' view of Redis, as often as they answer.
    let sampler = Sampler::start(servers.iter().map(CharonProcess::http_url).collect());
    let mut c = Clients {
        names: (0..6).map(|i| format!("client-{i}")).collect(),
        wants: vec![30.0, 20.0, 10.0, 10.0, 5.0, 5.0],
        has: vec![0.0; 6],
        via: vec![0, 1, 0, 1, 0, 1],
        conns,
    };
    // Max-min fairness of 60: 10 each, the four at or under 10 satisfied
    // (30), the rest split between the two that want more.
    assert_eq!(
        c.rounds(3, &[]).await,
        [15.0, 15.0, 10.0, 10.0, 5.0, 5.0],
        "the fair shares after three rounds"
    );

    // Demand changes: client 1 wants 2; client 0 grows into the rest.
    c.wants[1] = 2.0;
    assert_eq!(
        c.rounds(3, &[]).await,
        [28.0, 2.0, 10.0, 10.0, 5.0, 5.0],
        "the fair shares three rounds after a change of demand"
    );

    // Client 2 stops refreshing: its 10 stay leased until its lease lapses
    // (3 s), then client 0 (wants 30) grows into it.
    let (_, before) = page(&servers[0]).expect("the leases page");
    assert!(
        before
            .iter()
            .any(|(n, cap)| n == "client-2" && *cap == 10.0)
    );
    assert_eq!(c.round(&[2]).await[0], 28.0, "client 2's lease still holds");
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let after = c.rounds(3, &[2]).await;
    assert_eq!(
        after[0], 30.0,
        "client 0 grew into the lapsed lease: {after:?}"
    );
    let (leased, leases) = page(&servers[1]).expect("the leases page");
    assert!(!leases.iter().any(|(n, _)| n == "client-2"), "{leases:?}");
    assert_eq!(leased, 30.0 + 2.0 + 10.0 + 5.0 + 5.0);

    // /metrics shows the resource.
    let (_, metrics) = servers[0].http_get("/metrics").expect("metrics");
    for line in [
        "charon_lease_capacity{resource=\"db/qps\"} 60",
        "charon_lease_leased{resource=\"db/qps\"} 52",
        "charon_lease_clients{resource=\"db/qps\"} 5",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }

    // Server 0 crashes: its clients ask server 1, and keep their leases.
    servers[0].kill();
    c.via = vec![1; 6];
    let moved = c.rounds(2, &[2]).await;
    assert_eq!(moved, after, "the same leases from the other server");

    let (samples, most) = sampler.stop();
    assert!(samples > 50, "only {samples} samples");
    assert!(
        most <= CAPACITY,
        "over-committed: {most} leased of {CAPACITY}"
    );
    println!("LEASES {samples} samples of the leases pages, at most {most} of {CAPACITY} leased");
}

#[tokio::test]
async fn bad_lease_requests_are_client_errors_that_change_nothing() {
    let server = CharonProcess::start(bin(), CONFIG, &[]);
    let mut c = client(&server).await;
    let want = |resource: &str, wants: f64| v1::ResourceWant {
        resource: resource.into(),
        wants,
        has: 0.0,
        subclients: 0,
    };
    let many: Vec<v1::ResourceWant> = (0..101).map(|i| want(&format!("r{i}"), 1.0)).collect();
    let cases: Vec<(&str, v1::GetCapacityRequest, &str)> = vec![
        ("NaN", ask("a", f64::NAN, 0.0), "wants is not a number"),
        ("negative", ask("a", -1.0, 0.0), "wants is -1"),
        ("infinite has", ask("a", 1.0, f64::INFINITY), "has is inf"),
        (
            "unknown",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: vec![want("nope", 1.0)],
            },
            "unknown resource \"nope\"",
        ),
        (
            "rate resource",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: vec![want("api", 1.0)],
            },
            "get_capacity needs a lease-limited resource",
        ),
        (
            "twice",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: vec![want("db/qps", 1.0), want("db/qps", 2.0)],
            },
            "named twice",
        ),
        (
            "too many",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: many,
            },
            "101 resources in one call; at most 100",
        ),
        ("no client", ask("", 1.0, 0.0), "client_id"),
        (
            "none",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: vec![],
            },
            "at least one resource",
        ),
        (
            "subclients",
            v1::GetCapacityRequest {
                client_id: "a".into(),
                resources: vec![v1::ResourceWant {
                    subclients: u64::MAX,
                    ..want("db/qps", 1.0)
                }],
            },
            "subclients must be at most",
        ),
    ];
    for (what, req, message) in cases {
        let e = c.get_capacity(req).await.expect_err(what);
        let code = match what {
            "unknown" => tonic::Code::NotFound,
            "rate resource" => tonic::Code::FailedPrecondition,
            _ => tonic::Code::InvalidArgument,
        };
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert_eq!(
            e.metadata()
                .get("charon-error-class")
                .and_then(|v| v.to_str().ok()),
            Some("client"),
            "{what}"
        );
        assert!(e.message().contains(message), "{what}: {:?}", e.message());
    }
    let e = c
        .release_capacity(v1::ReleaseCapacityRequest {
            client_id: "a".into(),
            resources: vec!["api".into()],
        })
        .await
        .expect_err("a rate resource");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    // A rate request on the lease resource is the limiter's client error.
    let mut limiter = v1::limiter_client::LimiterClient::connect(server.endpoint())
        .await
        .expect("connect");
    let e = limiter
        .request(v1::RateRequest {
            resource: "db/qps".into(),
            domain: "d".into(),
            ..Default::default()
        })
        .await
        .expect_err("a lease resource");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("lease-limited"), "{}", e.message());

    // The HTML page escapes what clients name themselves.
    let lease = c
        .get_capacity(ask("<b>&", 1.0, 0.0))
        .await
        .expect("a lease")
        .into_inner()
        .leases;
    assert_eq!(lease[0].capacity, 1.0);
    let (status, html) = server.http_get("/leases").expect("the leases page");
    assert_eq!(status, 200);
    assert!(html.contains("<h2>db/qps</h2>"), "{html}");
    assert!(html.contains("<td>&lt;b&gt;&amp;<td>1<td>1"), "{html}");
    assert_eq!(release(&mut c, "<b>&").await, [true]);

    // Nothing changed: the page is empty, and a client alone gets it all.
    let (leased, leases) = page(&server).expect("the leases page");
    assert_eq!((leased, leases.len()), (0.0, 0));
    let lease = c
        .get_capacity(ask("z", 1_000.0, 0.0))
        .await
        .expect("a lease")
        .into_inner()
        .leases;
    assert_eq!(lease[0].capacity, CAPACITY);
    assert_eq!(lease[0].safe_capacity, CAPACITY);
    assert_eq!(lease[0].refresh_interval_ms, 500);
    assert_eq!(release(&mut c, "z").await, [true]);
}

/// A `charon client lease` process, its JSON lines collected as they come.
struct LeaseProcess {
    child: std::process::Child,
    lines: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl LeaseProcess {
    fn start(server: &CharonProcess, client_id: &str, wants: &str, mode: &str) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(bin())
            .args(["client", "lease", "db/qps", "--server"])
            .arg(server.endpoint())
            .args(["--wants", wants, "--client-id", client_id, "--mode", mode])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn charon client lease");
        let out = child.stdout.take().expect("stdout");
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).expect("a JSON line");
                sink.lock().expect("lines").push(v);
            }
        });
        Self { child, lines }
    }

    /// Waits until the last line satisfies `ok`; returns it.
    fn wait_for(&self, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(last) = self.lines.lock().expect("lines").last()
                && ok(last)
            {
                return last.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: not seen; lines: {:?}",
                self.lines.lock().expect("lines")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LeaseProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn from(source: &str, capacity: f64) -> impl Fn(&Value) -> bool + '_ {
    move |v| v["source"] == source && v["capacity"].as_f64() == Some(capacity)
}

/// Three `charon client lease` processes share 30 through two servers on
/// one Redis: a SIGKILLed one loses its lease at expiry and the others
/// grow into it; with both servers gone, each keeps its lease until it
/// expires, then runs in its mode (safe: the safe capacity the server
/// gave; pessimistic: nothing).
#[test]
fn client_processes_share_a_killed_one_lapses_and_modes_apply_without_a_server() {
    const CLIENTS: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 30, algorithm: fair_share,
      lease_length: 2s, refresh_interval: 200ms, learning_mode: 0s }
"#;
    let redis = RedisServer::start();
    let url = redis.url();
    let mut servers = [
        CharonProcess::start(bin(), CLIENTS, &["--store", url.as_str()]),
        CharonProcess::start(bin(), CLIENTS, &["--store", url.as_str()]),
    ];
    let server = &servers[0];
    let safe = LeaseProcess::start(server, "c-safe", "20", "safe");
    let pessimistic = LeaseProcess::start(&servers[1], "c-pessimistic", "20", "pessimistic");
    let mut doomed = LeaseProcess::start(&servers[1], "c-doomed", "20", "optimistic");
    for c in [&safe, &pessimistic, &doomed] {
        c.wait_for("a third of 30 each", from("server", 10.0));
    }
    doomed.child.kill().expect("SIGKILL");
    let _ = doomed.child.wait();
    // Its 10 stay leased until its lease lapses (2 s), then the others grow.
    for c in [&safe, &pessimistic] {
        let v = c.wait_for("half of 30 each", from("server", 15.0));
        assert_eq!(v["safe_capacity"], 15.0, "30 among two clients");
    }
    for s in &servers {
        let (leased, leases) = page(s).expect("the leases page");
        assert_eq!(leased, 30.0);
        assert_eq!(leases.len(), 2, "{leases:?}");
    }

    // The servers go away: the leases in hand hold until they expire, then
    // each mode applies.
    for s in &mut servers {
        s.kill();
    }
    let failing = |v: &Value| v["failures"].as_u64().unwrap_or(0) > 0;
    let v = safe.wait_for("a failed refresh", failing);
    assert_eq!(
        (v["source"].as_str(), v["capacity"].as_f64()),
        (Some("server"), Some(15.0)),
        "the lease in hand first: {v}"
    );
    safe.wait_for("the safe capacity", from("safe", 15.0));
    pessimistic.wait_for("nothing", from("pessimistic", 0.0));
}

/// A root, two leaves (`--lease-parent`) and two clients on each (SPEC §12
/// tree): the root shares 100 between the leaves by their clients' wants
/// (as many subclients as they have), each leaf shares its grant among its
/// clients; the root's grants never add up to more than 100 (sampled all
/// along), and the clients' leases add up to 100 once settled. Killing the
/// root: the leaves keep sharing their grant until it expires, then the
/// root's safe capacity (10 per subclient).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_servers_shares_the_roots_capacity_and_falls_back_to_safe() {
    const TREE: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 100, algorithm: fair_share,
      lease_length: 2s, refresh_interval: 200ms, learning_mode: 0s, safe_capacity: 10 }
"#;
    let mut root = CharonProcess::start(bin(), TREE, &[]);
    let parent = root.endpoint();
    let leaves = [
        CharonProcess::start(bin(), TREE, &["--lease-parent", parent.as_str()]),
        CharonProcess::start(bin(), TREE, &["--lease-parent", parent.as_str()]),
    ];
    let sampler = Sampler::start(vec![root.http_url()]);
    let mut c = Clients {
        names: ["a1", "a2", "b1", "b2"].map(str::to_owned).to_vec(),
        wants: vec![40.0, 40.0, 30.0, 30.0],
        has: vec![0.0; 4],
        via: vec![0, 0, 1, 1],
        conns: vec![client(&leaves[0]).await, client(&leaves[1]).await],
    };
    // 4 subclients at the root: 25 each, so 50 per leaf, 25 per client.
    let settled = |has: &[f64]| has.iter().all(|&h| h == 25.0);
    let mut rounds = 0;
    while !settled(&c.round(&[]).await) {
        rounds += 1;
        assert!(rounds < 100, "not settled: {:?}", c.has);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut leased = 0.0;
    for leaf in &leaves {
        let (sum, leases) = page(leaf).expect("a leaf's page");
        assert_eq!(leases.len(), 2);
        leased += sum;
    }
    assert_eq!(leased, 100.0, "the clients hold the root's capacity in all");
    let (_, at_root) = page(&root).expect("the root's page");
    assert_eq!(
        at_root.len(),
        2,
        "the root sees the two leaves: {at_root:?}"
    );
    assert!(at_root.iter().all(|(_, cap)| *cap == 50.0), "{at_root:?}");

    let (samples, most) = sampler.stop();
    assert!(samples > 10, "only {samples} samples");
    assert!(most <= 100.0, "the root granted {most} of 100");

    // The root goes away: after the leaves' grants expire (2 s), each
    // shares the safe capacity for its two subclients, 20: 10 per client.
    root.kill();
    let mut rounds = 0;
    while !c.round(&[]).await.iter().all(|&h| h == 10.0) {
        rounds += 1;
        assert!(rounds < 100, "not on safe capacity: {:?}", c.has);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("TREE {samples} samples of the root's page, at most {most} of 100 granted");
}

/// Redis comes back empty (FLUSHALL) under two clients holding 30 each of
/// 60: the leases are gone from Redis but the clients still hold them. The
/// server notices the lost state (a new generation, within a third of its
/// liveness ttl) and re-enters learning mode, so a newcomer gets what it
/// has (nothing) and the two keep theirs: never more than 60 held. Without
/// learning mode the newcomer would get all 60 on an empty set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_empty_puts_the_server_in_learning_mode() {
    const EMPTY: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 60, algorithm: fair_share,
      lease_length: 5s, refresh_interval: 200ms, learning_mode: 1s }
"#;
    let redis = RedisServer::start();
    let url = redis.url();
    let server = CharonProcess::start(
        bin(),
        EMPTY,
        &["--store", url.as_str(), "--liveness-ttl", "900ms"],
    );
    let mut c = Clients {
        names: ["a", "b", "newcomer"].map(str::to_owned).to_vec(),
        wants: vec![60.0, 60.0, 60.0],
        has: vec![0.0; 3],
        via: vec![0; 3],
        conns: vec![client(&server).await],
    };
    // Learning mode from the first decision (a and b say they have 0, so
    // they get 0): wait it out, then the fair shares.
    assert_eq!(c.round(&[2]).await[..2], [0.0, 0.0]);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(c.rounds(3, &[2]).await[..2], [30.0, 30.0]);

    redis_cli(&redis, &["FLUSHALL"]);
    // The next renewal (a third of 900 ms) finds the generation gone.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let after = c.round(&[]).await;
    assert_eq!(after, [30.0, 30.0, 0.0], "learning: what each says it has");
    let (leased, _) = page(&server).expect("the leases page");
    assert_eq!(leased, 60.0);
}

/// Redis stalls (SIGSTOP) under held leases: for less than the store
/// timeout a refresh only waits; for longer it is a server error
/// (UNAVAILABLE, class server) within the timeout, not a hang; once Redis
/// resumes, the leases are as they were and refreshes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_delays_or_fails_refreshes_and_loses_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = CharonProcess::start(
        bin(),
        CONFIG,
        &["--store", url.as_str(), "--store-timeout", "700ms"],
    );
    let mut c = Clients {
        names: ["a", "b"].map(str::to_owned).to_vec(),
        wants: vec![60.0, 60.0],
        has: vec![0.0; 2],
        via: vec![0; 2],
        conns: vec![client(&server).await],
    };
    assert_eq!(c.rounds(3, &[]).await, [30.0, 30.0]);

    // Shorter than the timeout: the refresh waits for Redis and succeeds.
    redis.stop();
    let resume = std::thread::spawn({
        let pid = redis.pid();
        move || {
            std::thread::sleep(Duration::from_millis(200));
            charon_testkit::signal(pid, "CONT");
        }
    });
    assert_eq!(c.round(&[]).await, [30.0, 30.0], "slow, not failed");
    resume.join().expect("resume");

    // Longer than the timeout: a server error, answered in time.
    redis.stop();
    let started = std::time::Instant::now();
    let e = c.conns[0]
        .clone()
        .get_capacity(ask("a", 60.0, 30.0))
        .await
        .expect_err("Redis is stopped");
    let waited = started.elapsed();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        e.metadata()
            .get("charon-error-class")
            .and_then(|v| v.to_str().ok()),
        Some("server")
    );
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    redis.resume();
    assert_eq!(c.rounds(2, &[]).await, [30.0, 30.0], "as they were");
    let (leased, leases) = page(&server).expect("the leases page");
    assert_eq!((leased, leases.len()), (60.0, 2));
}
