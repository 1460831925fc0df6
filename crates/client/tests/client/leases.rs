//! The client's capacity leases (SPEC §12) against an in-process server:
//! the top half never hands out units faster than the lease allows, a
//! refused lease is a client error, adaptive wants follow use, and giving
//! the lease back frees it for others.

use std::time::{Duration, Instant};

use charon_client::{Client, ClientOptions, LeaseMode, LeaseOptions, LeaseSource};
use charon_testkit::InProcessServer;

const CONFIG: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 50, algorithm: fair_share,
      lease_length: 2s, refresh_interval: 100ms, learning_mode: 0s }
  - { name: api, kind: rate, tiers: [ { limit: 5, window: 1s } ] }
"#;

#[tokio::test]
async fn acquire_never_goes_faster_than_the_lease() {
    let server = InProcessServer::start(CONFIG).await;
    let client = Client::connect(ClientOptions::new(server.endpoint())).unwrap();
    let lease = client
        .lease("db/qps", LeaseOptions::new("a", 50.0))
        .await
        .unwrap();
    let s = lease.status();
    assert_eq!((s.capacity, s.source), (50.0, LeaseSource::Server));
    assert!(lease.try_acquire(), "the first unit at once");
    assert!(!lease.try_acquire(), "the next one 20 ms later");
    let started = Instant::now();
    let mut taken = 1u32;
    while started.elapsed() < Duration::from_millis(500) {
        lease.acquire().await;
        taken += 1;
    }
    let most = 50.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(
        f64::from(taken) <= most,
        "{taken} units in {:?}",
        started.elapsed()
    );
    assert!(taken >= 5, "only {taken} units in half a second");
    assert!(lease.release().await.unwrap(), "it held a lease");
}

#[tokio::test]
async fn a_lease_on_the_wrong_resource_is_a_client_error() {
    let server = InProcessServer::start(CONFIG).await;
    let client = Client::connect(ClientOptions::new(server.endpoint())).unwrap();
    for (resource, wants) in [
        ("api", 1.0),
        ("nope", 1.0),
        ("db/qps", -1.0),
        ("db/qps", f64::NAN),
    ] {
        let e = client
            .lease(resource, LeaseOptions::new("a", wants))
            .await
            .expect_err(resource);
        assert!(e.is_client(), "{resource}: {e:?}");
    }
}

#[tokio::test]
async fn adaptive_wants_follow_use_and_a_release_frees_the_lease() {
    let server = InProcessServer::start(CONFIG).await;
    let client = Client::connect(ClientOptions::new(server.endpoint())).unwrap();
    let mut options = LeaseOptions::new("idle", 40.0);
    options.adaptive = true;
    let idle = client.lease("db/qps", options).await.unwrap();
    assert_eq!(
        idle.capacity(),
        40.0,
        "the first ask is for all it may want"
    );
    // Unused, its wants fall to nothing at the next refreshes.
    while idle.status().wants > 0.0 {
        idle.changed().await;
    }
    let busy = client
        .lease("db/qps", LeaseOptions::new("busy", 50.0))
        .await
        .unwrap();
    // The idle one shrank, so the busy one may have it all.
    let deadline = Instant::now() + Duration::from_secs(5);
    while busy.capacity() < 50.0 {
        assert!(Instant::now() < deadline, "{:?}", busy.status());
        busy.changed().await;
    }
    drop(idle);
    assert!(busy.release().await.unwrap());
    // Pessimistic with no server: nothing at all.
    let mut options = ClientOptions::new("http://127.0.0.1:9");
    options.request_timeout = Duration::from_millis(200);
    let nowhere = Client::connect(options).unwrap();
    let mut lo = LeaseOptions::new("p", 5.0);
    lo.mode = LeaseMode::Pessimistic;
    let lease = nowhere.lease("db/qps", lo).await.unwrap();
    assert_eq!(lease.status().source, LeaseSource::Pessimistic);
    assert!(!lease.try_acquire());
    assert!(lease.last_error().is_some_and(|e| e.is_server()));
}
