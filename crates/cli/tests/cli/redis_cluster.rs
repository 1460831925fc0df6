//! Issue 4: several `charon serve` processes sharing one private Redis.
//! Limits hold across servers under concurrent load; a server killed with
//! SIGKILL has its holds removed by the survivors; a server that lost its
//! membership resigns; Redis stopped and restarted gives server errors,
//! then recovery, and no count goes negative.

use crate::support::{bin, holder, strict_client};

use std::time::{Duration, Instant};

use charon_client::Client;
use charon_testkit::{CharonProcess, RedisServer};

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    global_limit: 60
    tiers: [ { limit: 1000, window: 1s } ]
  - name: vm
    kind: copy
    domain_limit: 8
    global_limit: 10
    groups: [ { name: probation, limit: 4, domains: [n0, n1, n2, n3, n4, n5] } ]
"#;

fn servers(redis: &RedisServer, n: usize, extra: &[&str]) -> Vec<CharonProcess> {
    let url = redis.url();
    let mut args = vec!["--store", url.as_str()];
    args.extend_from_slice(extra);
    (0..n)
        .map(|_| CharonProcess::start(bin(), LIMITS, &args))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_and_group_limits_hold_across_servers_under_concurrent_load() {
    let redis = RedisServer::start();
    let servers = servers(&redis, 3, &[]);
    let clients: Vec<Client> = servers.iter().map(strict_client).collect();

    // Copies: 30 concurrent reserves of one copy each, spread over three
    // servers and 12 domains (6 of them in the probation group).
    let mut tasks = Vec::new();
    for i in 0..30usize {
        let c = clients[i % 3].clone();
        let domain = if i % 2 == 0 {
            format!("n{}", i % 6)
        } else {
            format!("d{}", i % 6)
        };
        tasks.push(tokio::spawn(async move {
            let h = c
                .reserve("vm", domain.clone())
                .send()
                .await
                .expect("reserve");
            let groups = h.groups().to_vec();
            let n = h.copies();
            std::mem::forget(h); // keep the copies for the rest of the test
            (domain, n, groups)
        }));
    }
    let mut granted = 0;
    let mut probation = 0;
    for t in tasks {
        let (domain, n, groups) = t.await.expect("task");
        granted += n;
        if domain.starts_with('n') {
            probation += n;
            if n > 0 {
                assert_eq!(groups, ["probation"]);
            }
        }
    }
    assert_eq!(
        granted, 10,
        "exactly the global limit, across three servers"
    );
    assert!(
        probation <= 4,
        "the probation group never went over its limit: {probation}"
    );

    // Rates: 200 concurrent hits over three servers within about a second
    // against a global limit of 60 per second.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..200usize {
        let c = clients[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let g = c
                .request("api", format!("t{}", i % 20))
                .send()
                .await
                .expect("request");
            let r = g.reply.expect("reply");
            (g.granted, r.global_hits_last_second, r.global_limited)
        }));
    }
    let mut hits = 0;
    let mut limited = 0;
    for t in tasks {
        let (g, global, was_limited) = t.await.expect("task");
        assert!(global <= 60, "the global count never exceeds G: {global}");
        hits += g;
        limited += u64::from(was_limited);
    }
    assert!(limited > 0, "some requests were limited by G");
    if started.elapsed() < Duration::from_millis(900) {
        assert_eq!(hits, 60, "all within one second: exactly G granted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_with_sigkill_has_its_holds_removed_by_the_survivors() {
    let redis = RedisServer::start();
    let mut servers = servers(&redis, 2, &["--liveness-ttl", "2s"]);
    let mut on_a = holder(&servers[0], "vm", "d", 6);
    let b = strict_client(&servers[1]);
    let mut mine = b
        .reserve("vm", "e")
        .copies(4)
        .send()
        .await
        .expect("reserve");
    assert_eq!(mine.copies(), 4, "10 in all: 6 on server A, 4 here");
    let r = b.reserve("vm", "f").send().await.expect("reserve");
    assert!(!r.is_granted(), "full");

    servers[0].kill();
    on_a.kill().expect("SIGKILL the client");
    on_a.wait().expect("the client exits");
    let started = Instant::now();
    let mut freed = None;
    while started.elapsed() < Duration::from_secs(10) {
        // B's own liveness renewal may be late on a busy machine: its copy
        // operations then answer a server error until it renews (not what
        // this test is about), and the next try goes through.
        let mut h = match b.reserve("vm", "f").copies(8).send().await {
            Ok(h) => h,
            Err(e) if e.is_server() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => panic!("reserve: {e:?}"),
        };
        if h.is_granted() {
            freed = Some((
                started.elapsed(),
                h.copies(),
                h.reply().map(|r| r.global_holds),
            ));
            h.release_all().await.expect("release");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (took, copies, global) =
        freed.unwrap_or_else(|| panic!("server A's copies never came back:\n{}", servers[1].log()));
    assert!(
        took <= Duration::from_secs(6),
        "cleaned up after {took:?} (liveness ttl 2 s)"
    );
    assert_eq!(
        (copies, global),
        (6, Some(10)),
        "A's 6 copies are free again and B's 4 are still held"
    );
    // The survivor's own hold is exact: it releases exactly what it holds.
    mine.release_all().await.expect("release");
    let h = b
        .reserve("vm", "g")
        .copies(8)
        .send()
        .await
        .expect("reserve");
    assert_eq!(
        (h.copies(), h.reply().map(|r| r.global_holds)),
        (8, Some(8))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_membership_lapsed_resigns_and_exits_non_zero() {
    let redis = RedisServer::start();
    let mut servers = servers(&redis, 2, &["--liveness-ttl", "1s"]);
    let a_pid = servers[0].pid();
    charon_testkit::signal(a_pid, "STOP");
    // Until B has counted A dead and removed its contributions.
    let fenced = crate::support::within(Duration::from_secs(15), async || {
        servers[1]
            .log()
            .contains("removed the contributions (and waiters) of a dead server")
    })
    .await;
    assert!(fenced.is_some(), "B fenced A:\n{}", servers[1].log());
    charon_testkit::signal(a_pid, "CONT");
    let status = servers[0]
        .wait_exit(Duration::from_secs(10))
        .expect("server A stops by itself");
    assert_eq!(status.code(), Some(3), "resigned:\n{}", servers[0].log());
    assert!(servers[0].log().contains("resign"), "{}", servers[0].log());
    // B is unaffected.
    let h = strict_client(&servers[1])
        .reserve("vm", "d")
        .copies(2)
        .send()
        .await
        .expect("reserve");
    assert_eq!(h.copies(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_and_restarted_under_load_gives_server_errors_then_recovery() {
    let mut redis = RedisServer::start();
    let servers = servers(&redis, 1, &["--store-timeout", "300ms"]);
    let c = strict_client(&servers[0]);
    assert!(c.request("api", "d").send().await.expect("ok").is_granted());
    let mut held = c
        .reserve("vm", "d")
        .copies(2)
        .send()
        .await
        .expect("reserve");
    assert_eq!(held.copies(), 2);

    redis.kill();
    let mut server_errors = 0;
    for _ in 0..10 {
        match c.request("api", "d").send().await {
            Err(ref e) if e.is_server() => server_errors += 1,
            Ok(g) => panic!("no grant without Redis: {g:?}"),
            Err(e) => panic!("a server error, not {e:?}"),
        }
    }
    assert_eq!(server_errors, 10);
    let (code, body) = servers[0].http_get("/readyz").expect("readyz");
    assert_eq!(code, 503, "{body}");

    redis.restart();
    let started = Instant::now();
    let mut recovered = false;
    while started.elapsed() < Duration::from_secs(15) {
        if let Ok(g) = c.request("api", "d").send().await {
            recovered = g.is_granted();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "requests are granted again after Redis came back:\n{}",
        servers[0].log()
    );
    // Copies wait (server errors, /readyz 503) until the counts Redis lost
    // are rebuilt from the sessions' holds.
    let rebuilt = crate::support::within(Duration::from_secs(15), async || {
        servers[0].http_get("/readyz").map(|r| r.0) == Some(200)
    })
    .await;
    assert!(
        rebuilt.is_some(),
        "ready again:
{}",
        servers[0].log()
    );
    // The copies held before Redis lost its data are counted again...
    let h = c
        .reserve("vm", "e")
        .copies(3)
        .send()
        .await
        .expect("reserve");
    let r = h.reply().expect("reply");
    assert_eq!(
        (h.copies(), r.global_holds, r.domain_holds),
        (3, 5, 3),
        "2 held from before the restart, 3 now"
    );
    // ...and given back exactly once.
    held.release_all().await.expect("release");
    let r = c
        .reserve("vm", "f")
        .copies(8)
        .min_copies(1)
        .send()
        .await
        .expect("reserve");
    assert_eq!(r.copies(), 7, "10 less the 3 still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_can_be_named_in_the_configuration_file() {
    let redis = RedisServer::start();
    let config = format!("server:\n  store: {}\n{LIMITS}", redis.url());
    let server = CharonProcess::start(bin(), &config, &[]);
    assert!(server.log().contains("store redis"), "{}", server.log());
    let h = strict_client(&server)
        .reserve("vm", "d")
        .copies(2)
        .send()
        .await
        .expect("reserve");
    assert_eq!(h.copies(), 2);
    let (code, body) = server.http_get("/readyz").expect("readyz");
    assert_eq!(code, 200);
    assert!(body.contains("store: redis"), "{body}");
}
