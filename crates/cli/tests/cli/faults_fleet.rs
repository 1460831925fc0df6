//! The failures of `docs/operations.md` that are not Redis' or the
//! configuration database's own, under real `charon serve` processes with
//! their DEFAULT timings (refresh 2 s, liveness ttl 10 s, keep-alive 20 s,
//! client request timeout 1 s): the configuration service down, a limiting
//! server frozen (SIGSTOP) in a Redis fleet, a client frozen while it holds
//! copies. The timings `docs/operations.md` gives come from the `FAULT`
//! line each test prints (`--nocapture`).

use std::time::{Duration, Instant};

use crate::support::{bin, config_service, holder, strict_client, within};
use charon_client::{Client, ClientOptions, Error, Source};
use charon_testkit::{CharonProcess, RedisServer};
use serde_json::json;

const LIMITS: &str = crate::support::FLEET_LIMITS;

const TOKEN: &str = "fleet-token";

/// How many copies of `vm` `domain` gets through `c` now (released at once).
async fn free_copies(c: &Client, domain: &str) -> Result<u64, Error> {
    let mut h = c.reserve("vm", domain).copies(10).send().await?;
    let n = h.copies();
    h.release_all().await?;
    Ok(n)
}

async fn put_api_limit(service: &CharonProcess, limit: u64) -> u16 {
    reqwest::Client::new()
        .put(format!("{}/v1/resources/api", service.http_url()))
        .bearer_auth(TOKEN)
        .json(&json!({"kind": "rate", "tiers": [ {"limit": limit, "window": "60s"} ]}))
        .send()
        .await
        .expect("the configuration API answers")
        .status()
        .as_u16()
}

/// What `api` grants a fresh domain asking for 100 (the tier limit in force).
async fn api_limit(c: &Client, domain: &str) -> Result<u64, Error> {
    Ok(c.request("api", domain).copies(100).send().await?.granted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_service_down_limiters_keep_deciding_and_catch_up() {
    let mut service = config_service(TOKEN);
    assert_eq!(put_api_limit(&service, 2).await, 201);
    let api = service.http_url();
    let limiter = CharonProcess::start_args(
        bin(),
        &["--config-url", &api, "--config-cache", "{dir}/view.json"],
        "/readyz",
    );
    let c = strict_client(&limiter);
    assert_eq!(api_limit(&c, "before").await.expect("decided"), 2);

    service.kill();
    let down = Instant::now();
    let (mut decided, mut errors, mut noticed) = (0u32, 0u32, None);
    while down.elapsed() < Duration::from_secs(6) {
        match api_limit(&c, &format!("down-{decided}-{errors}")).await {
            Ok(2) => decided += 1,
            Ok(n) => panic!("decided by a configuration it never had: {n}"),
            Err(_) => errors += 1,
        }
        let ready = limiter.http_get("/readyz").expect("readyz answers");
        assert_eq!(ready.0, 200, "still ready on its last view: {}", ready.1);
        if noticed.is_none() && ready.1.contains("could not be reached") {
            noticed = Some(down.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let noticed = noticed.unwrap_or_else(|| panic!("/readyz never said so:\n{}", limiter.log()));
    assert_eq!(
        errors, 0,
        "no decision depends on the configuration service"
    );

    // A limiting server (re)started while the service is down starts from
    // the cached view.
    let cache = limiter.dir().join("view.json");
    let cache = cache.display().to_string();
    let started = Instant::now();
    let second = CharonProcess::start_args(
        bin(),
        &["--config-url", &api, "--config-cache", &cache],
        "/readyz",
    );
    let second_ready = started.elapsed();
    let c2 = strict_client(&second);
    assert_eq!(api_limit(&c2, "second").await.expect("decided"), 2);

    // The service comes back; a change reaches both limiters within a
    // refresh interval (2 s) of the write.
    let back = Instant::now();
    service.restart();
    let status = put_api_limit(&service, 4).await;
    assert_eq!(status, 200, "{}", service.log());
    let mut n = 0;
    let caught_up = within(Duration::from_secs(10), async || {
        n += 1;
        api_limit(&c, &format!("after-{n}")).await.ok() == Some(4)
            && api_limit(&c2, &format!("after-{n}")).await.ok() == Some(4)
    })
    .await
    .unwrap_or_else(|| panic!("never caught up:\n{}", limiter.log()));
    let ready = limiter.http_get("/readyz").expect("readyz");
    assert!(!ready.1.contains("could not be reached"), "{}", ready.1);
    println!(
        "FAULT config_service_down: injected SIGKILL of the configuration service for 6 s, a second \
         limiting server started during the outage, then the service restarted and a limit changed; \
         expected decisions by the last view, no server error, the restarted limiter deciding from \
         its cache, the change in force within the refresh (2 s); observed {decided} decisions and \
         {errors} errors during the outage, /readyz 200 naming the outage {noticed:?} after the kill, \
         the second limiter ready in {second_ready:?} from its cache, the change in force on both \
         {caught_up:?} after the write ({:?} after the restart)",
        back.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_in_a_redis_fleet_is_fenced_and_its_clients_degrade() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut frozen = CharonProcess::start(bin(), LIMITS, &["--store", url.as_str()]);
    let survivor = CharonProcess::start(bin(), LIMITS, &["--store", url.as_str()]);
    let mut held = holder(&frozen, "vm", "x", 6);
    let probe = strict_client(&survivor);
    assert_eq!(free_copies(&probe, "y").await.expect("reserve"), 4);
    let lenient = Client::connect(ClientOptions::new(frozen.endpoint())).expect("client");
    assert_eq!(
        lenient.request("api", "d").send().await.expect("ok").source,
        Source::Server
    );

    frozen.signal("STOP");
    let stopped = Instant::now();
    let asked = Instant::now();
    let g = lenient
        .request("api", "d")
        .copies(5)
        .min_copies(1)
        .send()
        .await
        .expect("degraded, not an error");
    let degraded_after = asked.elapsed();
    assert_eq!((g.granted, g.source), (1, Source::Degraded));
    assert!(
        free_copies(&probe, "y").await.expect("reserve") == 4,
        "the frozen server's copies still count while it may be alive"
    );
    let freed = within(Duration::from_secs(45), async || {
        free_copies(&probe, "y").await.ok() == Some(10)
    })
    .await
    .unwrap_or_else(|| panic!("never freed:\n{}", survivor.log()));
    let freed_after = stopped.elapsed();

    frozen.signal("CONT");
    let resumed = Instant::now();
    let exit = frozen
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the fenced server went on:\n{}", frozen.log()));
    let exited_after = resumed.elapsed();
    assert_eq!(exit.code(), Some(3), "{}", frozen.log());
    assert!(frozen.log().contains("fenced"), "{}", frozen.log());
    let _ = held.kill();
    let _ = held.wait();
    assert_eq!(free_copies(&probe, "y").await.expect("reserve"), 10);
    println!(
        "FAULT server_frozen: injected SIGSTOP of one of two servers on one Redis (defaults: ttl \
         10 s) while a client held 6 of 10 copies through it, then SIGCONT; expected its clients to \
         degrade after their request timeout (1 s), its copies freed by the other server after \
         about ttl + ttl/3, and the resumed server to exit 3 (fenced); observed a degraded grant \
         after {degraded_after:?}, the copies free on the other server {freed_after:?} after the \
         stop (seen {freed:?} into the polling), exit {:?} {exited_after:?} after SIGCONT",
        exit.code()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_client_loses_its_copies_within_the_default_keepalive() {
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let mut held = holder(&server, "vm", "x", 10);
    let probe = strict_client(&server);
    assert_eq!(free_copies(&probe, "y").await.expect("reserve"), 0);
    charon_testkit::signal(held.id(), "STOP");
    let took = within(Duration::from_secs(45), async || {
        free_copies(&probe, "y").await.ok() == Some(10)
    })
    .await;
    charon_testkit::signal(held.id(), "KILL");
    let _ = held.wait();
    let took = took.unwrap_or_else(|| panic!("never freed:\n{}", server.log()));
    assert!(
        took <= Duration::from_secs(30),
        "the keep-alive (20 s) bounds it: {took:?}"
    );
    let metrics = server.http_get("/metrics").expect("metrics").1;
    assert!(metrics.contains("charon_copies_held 0"), "{metrics}");
    println!(
        "FAULT client_frozen: injected SIGSTOP of a client process holding 10 of 10 copies \
         (server keep-alive default 20 s); expected its session ended and its copies free within \
         about 20 s; observed the copies free {took:?} after the stop"
    );
}

/// A configuration service that accepts TCP connections and never answers
/// (a hung process, a full accept queue behind a proxy): every connection
/// it accepted, held open until the test ends.
struct StalledService {
    url: String,
    accepted: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl StalledService {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let held = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                held.lock().expect("the held connections").push(conn);
            }
        });
        Self { url, accepted }
    }

    /// Connections accepted so far: one per request the feed tried (a
    /// request that timed out leaves its connection).
    fn connections(&self) -> usize {
        self.accepted.lock().expect("the held connections").len()
    }
}

/// The feed's time limit of each call to the configuration service.
const FEED_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_configuration_service_leaves_limiters_deciding() {
    // A cached view, written by a limiter of a real service.
    let service = config_service(TOKEN);
    assert_eq!(put_api_limit(&service, 2).await, 201);
    let first = CharonProcess::start_args(
        bin(),
        &[
            "--config-url",
            &service.http_url(),
            "--config-cache",
            "{dir}/view.json",
        ],
        "/readyz",
    );
    let cache = first.dir().join("view.json");
    within(Duration::from_secs(10), async || cache.exists())
        .await
        .expect("the view is cached");
    let cache = cache.display().to_string();

    // A limiter started against the stalled service, from that cache.
    let stalled = StalledService::start();
    let started = Instant::now();
    let limiter = CharonProcess::start_args(
        bin(),
        &["--config-url", &stalled.url, "--config-cache", &cache],
        "/readyz",
    );
    let ready_in = started.elapsed();
    let c = strict_client(&limiter);
    let (mut decided, mut errors, mut noticed) = (0u32, 0u32, None);
    let mut slowest_readyz = Duration::ZERO;
    let mut hup = None;
    while started.elapsed() < FEED_TIMEOUT * 3 {
        match api_limit(&c, &format!("stalled-{decided}-{errors}")).await {
            Ok(2) => decided += 1,
            Ok(n) => panic!("decided by a configuration it never had: {n}"),
            Err(_) => errors += 1,
        }
        let asked = Instant::now();
        let ready = limiter.http_get("/readyz").expect("readyz answers");
        slowest_readyz = slowest_readyz.max(asked.elapsed());
        assert_eq!(ready.0, 200, "ready on its cached view: {}", ready.1);
        if noticed.is_none() && ready.1.contains("could not be reached") {
            noticed = Some(started.elapsed());
            // A refresh asked for while the service stalls is one more
            // attempt with the same time limit, not a hang.
            limiter.signal("HUP");
            hup = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts = stalled.connections();
    println!(
        "FAULT config_service_stalled: injected a configuration service that accepts connections \
         and never answers, a limiter started against it from a cached view, SIGHUP once the \
         stall was reported; expected a start from the cache, decisions by the cached view \
         without a server error, /readyz 200 answering at once and naming the outage within \
         the feed's time limit ({FEED_TIMEOUT:?}), each refresh given up after it and tried \
         again; observed ready in {ready_in:?}, {decided} decisions and {errors} errors in \
         {:?}, the outage named {noticed:?} after the start, the slowest /readyz \
         {slowest_readyz:?}, {attempts} connections (refresh attempts) to the stalled service \
         ({:?} since the SIGHUP)",
        started.elapsed(),
        hup.map(|h| h.elapsed()),
    );
    assert!(
        ready_in < FEED_TIMEOUT,
        "started from the cache without waiting for the service"
    );
    assert_eq!(
        errors, 0,
        "no decision depends on the configuration service"
    );
    assert!(decided > 0);
    let noticed = noticed.unwrap_or_else(|| panic!("/readyz never said so:\n{}", limiter.log()));
    assert!(
        noticed < FEED_TIMEOUT + Duration::from_secs(3),
        "named within the feed's time limit: {noticed:?}"
    );
    assert!(
        slowest_readyz < Duration::from_secs(1),
        "/readyz never waits for the service: {slowest_readyz:?}"
    );
    assert!(
        attempts >= 2,
        "each refresh gives up after the time limit and the next one tries again: {attempts}"
    );
}
