//! The client library against a real server in this process (tonic over
//! loopback, no spawned binaries): every operation, back-off bounded by
//! `max_wait`, client against server errors, degraded mode and the kill
//! switch.

use std::time::{Duration, Instant};

use charon_client::{Client, ClientOptions, Source};
use charon_testkit::InProcessServer;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 2, window: 60s } ]
  - name: quick
    kind: rate
    tiers: [ { limit: 1, window: 300ms } ]
  - name: vm
    kind: copy
    domain_limit: 4
    groups: [ { name: probation, limit: 1, domains: [newbie] } ]
  - name: gpu
    kind: copy
    domain_limit: 3
"#;

fn client(server: &InProcessServer, fail_open: bool) -> Client {
    let mut options = ClientOptions::new(server.endpoint());
    options.fail_open = fail_open;
    options.backoff_base = Duration::from_millis(20);
    Client::connect(options).expect("a client")
}

#[tokio::test]
async fn request_grants_then_rejects_without_error() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, false);
    let grant = c
        .request("api", "d")
        .copies(3)
        .send()
        .await
        .expect("answer");
    assert_eq!((grant.granted, grant.source), (2, Source::Server));
    assert_eq!(grant.reply.as_ref().map(|r| r.tier_limit), Some(Some(2)));
    let rejected = c.request("api", "d").send().await.expect("answer");
    assert!(!rejected.is_granted() && !rejected.is_degraded());
    // min_copies above what is left: nothing granted.
    let other = c
        .request("api", "e")
        .copies(3)
        .min_copies(3)
        .send()
        .await
        .expect("answer");
    assert_eq!(other.granted, 0);
    let stats = c.stats();
    assert_eq!(
        (stats.requests, stats.rejections, stats.server_errors),
        (3, 2, 0)
    );
    server.stop().await;
}

#[tokio::test]
async fn backoff_waits_for_a_grant_within_max_wait() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, false);
    assert!(
        c.request("quick", "d")
            .send()
            .await
            .expect("ok")
            .is_granted()
    );
    let grant = c
        .request("quick", "d")
        .max_wait(Duration::from_secs(3))
        .send()
        .await
        .expect("answer");
    assert!(grant.is_granted(), "granted once the window moved on");
    assert!(
        grant.waited >= Duration::from_millis(15),
        "{:?}",
        grant.waited
    );
    server.stop().await;
}

#[tokio::test]
async fn backoff_gives_up_at_max_wait() {
    let server = InProcessServer::start(LIMITS).await;
    let mut options = ClientOptions::new(server.endpoint());
    options.fail_open = false;
    // Sleeps about 100, 200, 400 ms: uncapped, the third would end at
    // about 700 ms.
    options.backoff_base = Duration::from_millis(100);
    let c = Client::connect(options).expect("a client");
    let first = c.request("api", "d").copies(2).send().await.expect("ok");
    assert_eq!(first.granted, 2);
    let max_wait = Duration::from_millis(400);
    let started = Instant::now();
    let grant = c
        .request("api", "d")
        .max_wait(max_wait)
        .send()
        .await
        .expect("answer");
    let elapsed = started.elapsed();
    assert!(!grant.is_granted());
    // It retried and stopped at max_wait: the last sleep is cut to what is
    // left of it.
    assert!(elapsed >= max_wait, "{elapsed:?}");
    assert!(
        elapsed < max_wait + Duration::from_millis(150),
        "bounded by max_wait: {elapsed:?}"
    );
    assert!(grant.waited >= max_wait && grant.waited <= elapsed);
    server.stop().await;
}

#[tokio::test]
async fn holds_reserve_release_transfer_seize_and_drop() {
    let server = InProcessServer::start(LIMITS).await;
    let a = client(&server, false);
    let b = client(&server, false);
    let mut hold = a.reserve("vm", "d").copies(3).send().await.expect("hold");
    assert_eq!((hold.copies(), hold.source()), (3, Source::Server));
    assert_eq!((hold.resource(), hold.domain()), ("vm", "d"));
    hold.release(1).await.expect("release");
    assert_eq!(hold.copies(), 2);
    assert!(matches!(hold.release(5).await, Err(ref e) if e.is_client()));
    let id = hold
        .transfer(1, Duration::from_secs(30))
        .await
        .expect("transfer");
    assert_eq!(hold.copies(), 1);
    let seized = b.seize(&id).await.expect("seize");
    assert_eq!((seized.copies(), seized.domain()), (1, "d"));
    assert!(
        matches!(b.seize(&id).await, Err(ref e) if e.is_client()),
        "once"
    );
    // 1 (hold) + 1 (seized) held: 2 more fit.
    let more = a.reserve("vm", "d").copies(4).send().await.expect("hold");
    assert_eq!(more.copies(), 2);
    drop(more);
    drop(seized);
    hold.release_all().await.expect("release");
    assert_eq!(hold.copies(), 0);
    // Everything is back.
    let all = a.reserve("vm", "d").copies(4).send().await.expect("hold");
    assert_eq!(all.copies(), 4);
    // Groups.
    let newbie = a
        .reserve("vm", "newbie")
        .copies(2)
        .send()
        .await
        .expect("hold");
    assert_eq!(
        (newbie.copies(), newbie.groups()),
        (1, &["probation".to_owned()][..])
    );
    server.stop().await;
}

#[tokio::test]
async fn multi_takes_the_same_count_of_each() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, false);
    let grant = c
        .multi("t")
        .copy("vm")
        .copy("gpu")
        .rate("api")
        .copies(1, 8)
        .send()
        .await
        .expect("multi");
    assert_eq!(grant.copies, 2, "vm 4, gpu 3, api 2: 2 of each");
    assert!(grant.holds.iter().all(|h| h.copies() == 2));
    server.stop().await;
}

#[tokio::test]
async fn client_errors_are_errors_even_when_failing_open() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, true);
    for e in [
        c.request("nope", "d").send().await.map(|_| ()),
        c.request("vm", "d").send().await.map(|_| ()),
        c.reserve("api", "d").send().await.map(|_| ()),
        c.seize("no-such-transfer").await.map(|_| ()),
        c.request("api", "d")
            .copies(1)
            .min_copies(2)
            .send()
            .await
            .map(|_| ()),
    ] {
        assert!(matches!(e, Err(ref e) if e.is_client()), "{e:?}");
    }
    assert_eq!(c.stats().degraded_grants, 0);
    server.stop().await;
}

#[tokio::test]
async fn server_errors_fail_or_degrade() {
    let server = InProcessServer::start(LIMITS).await;
    server.answer_server_errors();
    let strict = client(&server, false);
    let e = strict
        .request("api", "d")
        .send()
        .await
        .expect_err("server error");
    assert!(e.is_server(), "{e:?}");
    let e = strict
        .reserve("vm", "d")
        .send()
        .await
        .expect_err("server error");
    assert!(e.is_server(), "{e:?}");
    assert!(strict.stats().server_errors >= 2);

    let open = client(&server, true);
    let grant = open
        .request("api", "d")
        .copies(5)
        .min_copies(2)
        .send()
        .await
        .expect("degraded");
    assert_eq!((grant.granted, grant.source), (2, Source::Degraded));
    let mut hold = open
        .reserve("vm", "d")
        .copies(3)
        .min_copies(1)
        .send()
        .await
        .expect("degraded");
    assert!(hold.is_degraded());
    assert_eq!(hold.copies(), 1);
    // Degraded copies cannot be handed over; seize cannot degrade.
    assert!(
        hold.transfer(1, Duration::from_secs(1))
            .await
            .expect_err("no")
            .is_server()
    );
    assert!(open.seize("x").await.expect_err("no").is_server());
    assert_eq!(open.stats().degraded_grants, 2);
    server.stop().await;
}

#[tokio::test]
async fn a_server_that_is_gone_degrades() {
    let server = InProcessServer::start(LIMITS).await;
    let endpoint = server.endpoint();
    let c = client(&server, true);
    let mut before = c.reserve("vm", "d").copies(2).send().await.expect("hold");
    assert_eq!(before.source(), Source::Server);
    server.stop().await;
    let grant = c.request("api", "d").send().await.expect("degraded");
    assert_eq!((grant.granted, grant.source), (1, Source::Degraded));
    let hold = c.reserve("vm", "d").send().await.expect("degraded");
    assert!(hold.is_degraded());
    // Releasing a hold whose session ended is no error: the server
    // released it.
    before.release_all().await.expect("release");
    assert!(c.stats().server_errors >= 2);
    // A client made while nothing listens works too.
    let late = Client::connect(ClientOptions::new(endpoint)).expect("client");
    assert!(
        late.request("api", "d")
            .send()
            .await
            .expect("degraded")
            .is_degraded()
    );
}

#[tokio::test]
async fn the_kill_switch_turns_rejections_into_grants() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, false);
    assert_eq!(
        c.request("api", "d")
            .copies(2)
            .send()
            .await
            .expect("ok")
            .granted,
        2
    );
    c.set_kill_switch(true);
    assert!(c.kill_switch());
    let grant = c.request("api", "d").send().await.expect("answer");
    assert_eq!((grant.granted, grant.source), (1, Source::KillSwitch));
    assert_eq!(
        grant.reply.map(|r| r.granted),
        Some(0),
        "the server rejected"
    );
    c.set_kill_switch(false);
    assert!(
        !c.request("api", "d")
            .send()
            .await
            .expect("answer")
            .is_granted()
    );
    assert_eq!(c.stats().kill_switch_grants, 1);
    server.stop().await;
}

const METERS: &str = r#"
resources:
  - name: tokens
    kind: bucket
    burst: 10
    count: 1
    period: 1h
  - name: exports
    kind: queue
    rate: 1
    period: 1h
    size: 3
"#;

#[tokio::test]
async fn dry_run_charge_refund_and_the_reply_context() {
    let server = InProcessServer::start(METERS).await;
    let c = client(&server, false);
    // A dry run before the work, a charge of what it cost after it.
    let dry = c
        .request("tokens", "d")
        .copies(10)
        .dry_run(true)
        .send()
        .await
        .expect("answer");
    assert_eq!(dry.granted, 10);
    let charged = c.charge("tokens", "d", 12).await.expect("charged");
    assert_eq!((charged.granted, charged.remaining), (12, Some(0)));
    let rejected = c.request("tokens", "d").send().await.expect("answer");
    assert!(!rejected.is_granted());
    let wait = rejected.retry_after().expect("a wait");
    assert!(wait > Duration::from_secs(2 * 3600), "{wait:?}");
    let refunded = c.refund("tokens", "d", 3).await.expect("refunded");
    assert_eq!((refunded.granted, refunded.remaining), (3, Some(1)));
    assert!(
        c.request("tokens", "d")
            .send()
            .await
            .expect("answer")
            .is_granted()
    );
    // No refunds on a queue, a queue's delay.
    assert!(matches!(
        c.refund("exports", "d", 1).await,
        Err(ref e) if e.is_client()
    ));
    assert_eq!(
        c.request("exports", "d")
            .send()
            .await
            .expect("answer")
            .delay(),
        Duration::ZERO
    );
    let second = c.request("exports", "d").send().await.expect("answer");
    assert!(second.delay() > Duration::from_secs(3500), "{second:?}");
    server.stop().await;
}

/// A sink for log lines, shared with the subscriber that writes them.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lines").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Degraded grants are counted, each of them, and logged at warning
/// level, at most one line every 10 s: a server that is down is never
/// silent, and never floods the application's log. The line names the
/// address and the cause.
#[tokio::test(flavor = "current_thread")]
async fn degraded_grants_are_logged_at_most_once_in_ten_seconds() {
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let nowhere = format!("http://127.0.0.1:{}", charon_testkit::free_port());
    let client = Client::connect(ClientOptions::new(&nowhere)).expect("client");
    for _ in 0..5 {
        let g = client.request("api", "d").send().await.expect("degraded");
        assert_eq!(g.source, Source::Degraded);
    }
    assert_eq!(client.stats().degraded_grants, 5);
    let text = String::from_utf8(lines.0.lock().expect("lines").clone()).expect("UTF-8");
    let logged: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("degraded grant"))
        .collect();
    assert_eq!(logged.len(), 1, "{text}");
    assert!(
        logged[0].contains("WARN")
            && logged[0].contains(&nowhere)
            && logged[0].contains("connection refused"),
        "{text}"
    );
}
