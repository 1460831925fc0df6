//! The feed of limiting servers against a service on a real TCP port: it
//! picks up changes made through the API, keeps its last view while the
//! service is down, and resumes when it is back.

#![allow(clippy::unwrap_used)]

// The configuration service's own test support (a service on a private
// database, requests through its router, a real server on a free port):
// shared by path rather than copied, so both crates test against the same
// service set-up.
#[path = "../../config-service/tests/config_service/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_config_client::{ConfigClientError, ConfigFeed, FeedError, FeedOptions};
use charon_core::ManualClock;
use charon_core::config::{Config, ResourceKind};
use charon_core::request::Amount;
use charon_limiter::Limiter;
use charon_store::MemoryStore;
use serde_json::json;
use support::{Served, TestApp, TestDb, resource_path};

async fn seed(app: &TestApp) {
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "rate", "tiers": [{"limit": 3, "window": "1s"}]}))
        .send()
        .await
        .expect(201);
    app.put(&resource_path("sandbox/vm"))
        .json(json!({"kind": "copy", "domain_limit": 5,
            "groups": [{"name": "probation", "limit": 1, "domains": ["new-1"]}]}))
        .send()
        .await
        .expect(201);
}

fn tier_limit(config: &Config) -> u64 {
    let (rate, _) = config.rate("api/search").unwrap();
    rate.tiers[0].limit
}

fn groups_of(config: &Config, domain: &str) -> Vec<String> {
    let (copy, _) = config.copy("sandbox/vm", "reserve").unwrap();
    copy.limits_for(domain)
        .groups
        .into_iter()
        .map(|g| g.name)
        .collect()
}

#[tokio::test]
async fn refresh_applies_deltas_and_keeps_the_view_while_the_service_is_down() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let port = served.port;
    let mut feed = ConfigFeed::new(&served.url, FeedOptions::default()).unwrap();
    assert!(!feed.is_loaded());
    assert_eq!(feed.version(), 0);

    let (version, config) = feed.refresh().await.unwrap().expect("first load");
    assert_eq!(version, 2);
    assert_eq!(tier_limit(&config), 3);
    assert!(groups_of(&config, "new-2").is_empty());
    assert!(feed.refresh().await.unwrap().is_none(), "up to date");

    // A tier limit lowered, a domain added to a group, a namespace opened.
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "rate", "tiers": [{"limit": 1, "window": "1s"}]}))
        .send()
        .await
        .expect(200);
    app.put(&format!(
        "{}/groups/probation/domains/new-2",
        resource_path("sandbox/vm")
    ))
    .send()
    .await
    .expect(201);
    app.put("/v1/namespaces/open")
        .json(json!({"allow_unconfigured": true}))
        .send()
        .await
        .expect(201);
    let (version, config) = feed.refresh().await.unwrap().expect("changed");
    assert_eq!(version, 5);
    assert_eq!(tier_limit(&config), 1);
    assert_eq!(groups_of(&config, "new-2"), ["probation"]);
    assert!(config.rate("open/anything").is_ok());

    // The service stops: the feed reports it and keeps its view.
    served.stop().await;
    let error = feed.refresh().await.unwrap_err();
    assert!(
        matches!(
            error,
            FeedError::Service(ConfigClientError::Unreachable { .. })
        ),
        "{error:?}"
    );
    assert_eq!(feed.version(), 5);
    assert_eq!(tier_limit(&feed.config()), 1);

    // Changed while it was down (through the router; the database is
    // there), then back on the same port: the feed resumes with a delta.
    app.delete(&resource_path("sandbox/vm"))
        .send()
        .await
        .expect(200);
    app.delete("/v1/namespaces/open").send().await.expect(200);
    let served = Served::start(app.state.clone(), port).await;
    let (version, config) = feed.refresh().await.unwrap().expect("changed");
    assert_eq!(version, 7);
    assert!(config.resource("sandbox/vm").is_none());
    assert!(config.rate("open/anything").is_err());
    assert_eq!(tier_limit(&config), 1);
    served.stop().await;
}

/// The `envoy:` section travels with the feed: on the first snapshot, in a
/// delta when it changes, as a removal when it goes; and the cache file
/// keeps it for a restart.
#[tokio::test]
async fn the_feed_hands_servers_the_envoy_section() {
    use charon_core::envoy::Matched;
    let db = TestDb::sqlite();
    let app = db.app().await;
    let with = |limit: u64| {
        format!(
            "resources:\n  - {{ name: api/search, kind: bucket, burst: 10, count: 10, period: 1s }}\n\
             envoy:\n  domains:\n    - domain: edge\n      descriptors:\n\
             \x20       - {{ key: tenant, rate_limit: {{ unit: minute, requests_per_unit: {limit} }} }}\n\
             \x20       - {{ key: user, resource: api/search }}\n"
        )
    };
    app.put("/v1/config")
        .body("application/yaml", &with(100))
        .send()
        .await
        .expect(200);
    let served = Served::start(app.state.clone(), 0).await;
    let dir = tempfile::tempdir().unwrap();
    let options = || FeedOptions {
        cache_file: Some(dir.path().join("view.json")),
        ..FeedOptions::default()
    };
    let mut feed = ConfigFeed::new(&served.url, options()).unwrap();
    let per_minute = |config: &Config| match config
        .envoy()
        .expect("an envoy: section")
        .match_descriptor("edge", &[("tenant", "acme")])
        .unwrap()
    {
        Matched::Limited(l) => l.rate_limit.unwrap().requests_per_unit(),
        other => panic!("{other:?}"),
    };
    let (_, config) = feed.refresh().await.unwrap().expect("first load");
    assert_eq!(per_minute(&config), 100);
    assert!(feed.refresh().await.unwrap().is_none(), "up to date");

    app.put("/v1/config")
        .body("application/yaml", &with(7))
        .send()
        .await
        .expect(200);
    let (_, config) = feed.refresh().await.unwrap().expect("the section changed");
    assert_eq!(per_minute(&config), 7);
    // A restart from the cache file has it too.
    let cached = ConfigFeed::new("http://127.0.0.1:9", options()).unwrap();
    assert_eq!(per_minute(&cached.config()), 7);

    // A resource edit leaves the section in the view.
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "bucket", "burst": 5, "count": 5, "period": "1s"}))
        .send()
        .await
        .expect(200);
    let (_, config) = feed.refresh().await.unwrap().expect("the resource changed");
    assert_eq!(per_minute(&config), 7);

    app.put("/v1/config")
        .body(
            "application/yaml",
            "resources:\n  - { name: api/search, kind: bucket, burst: 5, count: 5, period: 1s }\n",
        )
        .send()
        .await
        .expect(200);
    let (_, config) = feed.refresh().await.unwrap().expect("the section went");
    assert!(config.envoy().is_none());
    served.stop().await;
}

#[tokio::test]
async fn another_database_or_lost_history_resyncs_from_a_snapshot() {
    let first = TestDb::sqlite();
    let app = first.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let port = served.port;
    let mut feed = ConfigFeed::new(&served.url, FeedOptions::default()).unwrap();
    feed.refresh().await.unwrap().expect("loaded");
    served.stop().await;

    // A new database (a restore, a new deployment) at a higher version
    // than the feed has seen: the epoch tells, and the feed starts over.
    let second = TestDb::sqlite();
    let other = second.app().await;
    for i in 0..3 {
        other
            .put(&resource_path(&format!("other/{i}")))
            .json(json!({"kind": "copy", "domain_limit": 1}))
            .send()
            .await
            .expect(201);
    }
    let served = Served::start(other.state.clone(), port).await;
    let (version, config) = feed.refresh().await.unwrap().expect("changed");
    assert_eq!(version, 3);
    let names: Vec<&str> = config.resources().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["other/0", "other/1", "other/2"]);
    served.stop().await;
}

#[tokio::test]
async fn a_cache_file_gives_a_view_before_the_service_answers() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let dir = tempfile::tempdir().unwrap();
    let options = FeedOptions {
        cache_file: Some(dir.path().join("view.json")),
        ..FeedOptions::default()
    };
    let mut feed = ConfigFeed::new(&served.url, options.clone()).unwrap();
    feed.refresh().await.unwrap().expect("loaded");
    served.stop().await;

    // A restart while the service is down: the cached view is in force.
    let mut restarted = ConfigFeed::new("http://127.0.0.1:9", options).unwrap();
    assert!(restarted.is_loaded());
    assert_eq!(restarted.version(), 2);
    assert_eq!(tier_limit(&restarted.config()), 3);
    assert!(restarted.refresh().await.is_err());
    assert_eq!(restarted.version(), 2);
}

/// Polls until `done` or fails after `timeout`.
async fn eventually(timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The acceptance test of issue 5 at the library level: a limiter whose
/// configuration comes from a spawned feed decides by a change made
/// through the API within the refresh interval, and by its last view while
/// the service is down.
#[tokio::test]
async fn a_limiter_decides_by_the_view_of_a_running_feed() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let port = served.port;

    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::new(Config::default(), Arc::new(MemoryStore::new(clock.clone())));
    let interval = Duration::from_millis(200);
    let target = limiter.clone();
    let handle = ConfigFeed::new(&served.url, FeedOptions::default())
        .unwrap()
        .spawn(interval, move |_, config| {
            target.replace_config((*config).clone());
        });
    eventually(Duration::from_secs(5), || handle.version() == 2).await;
    assert!(handle.status().loaded);

    let one = Amount::exactly(1).unwrap();
    let granted = |reply: charon_core::rate::RateReply| reply.granted;
    for _ in 0..3 {
        assert_eq!(
            granted(limiter.request("api/search", "d", one).await.unwrap()),
            1
        );
    }
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        0
    );
    let mut session = limiter.session();
    assert_eq!(
        session
            .reserve("sandbox/vm", "new-1", one)
            .await
            .unwrap()
            .granted,
        1
    );
    assert_eq!(
        session
            .reserve("sandbox/vm", "new-2", one)
            .await
            .unwrap()
            .granted,
        1,
        "new-2 is in no group yet"
    );

    // Through the API: a tier limit lowered, a domain added to a group.
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "rate", "tiers": [{"limit": 1, "window": "1s"}]}))
        .send()
        .await
        .expect(200);
    app.put(&format!(
        "{}/groups/probation/domains/new-2",
        resource_path("sandbox/vm")
    ))
    .send()
    .await
    .expect(201);
    let changed_at = Instant::now();
    eventually(Duration::from_secs(5), || handle.version() == 4).await;
    assert!(
        changed_at.elapsed() < interval * 3,
        "picked up within the refresh interval"
    );
    assert!(matches!(
        limiter.config().resource("api/search").unwrap().kind,
        ResourceKind::Rate(_)
    ));
    clock.advance(2_000);
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        1
    );
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        0
    );
    // new-2 now shares probation's single copy, which new-1 holds.
    let reply = session.reserve("sandbox/vm", "new-2", one).await.unwrap();
    assert_eq!(reply.granted, 0);
    assert_eq!(reply.groups[0].name, "probation");

    // The service goes away: the limiter goes on with the last view.
    served.stop().await;
    assert!(handle.refresh().await.is_err());
    let status = handle.status();
    assert!(status.last_error.is_some());
    assert!(status.consecutive_failures >= 1);
    assert_eq!(status.version, 4);
    clock.advance(2_000);
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        1
    );
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        0
    );

    // Back: the next refresh (periodic or on demand) resumes.
    app.put(&resource_path("api/search"))
        .json(json!({"kind": "rate", "tiers": [{"limit": 2, "window": "1s"}]}))
        .send()
        .await
        .expect(200);
    let served = Served::start(app.state.clone(), port).await;
    assert_eq!(handle.refresh().await.unwrap(), 5);
    assert!(handle.status().last_error.is_none());
    clock.advance(2_000);
    for _ in 0..2 {
        assert_eq!(
            granted(limiter.request("api/search", "d", one).await.unwrap()),
            1
        );
    }
    assert_eq!(
        granted(limiter.request("api/search", "d", one).await.unwrap()),
        0
    );
    handle.stop();
    served.stop().await;
}

/// Copies the SQLite files of `location` (the database and its WAL) to a
/// backup directory, or back from `restore`.
fn copy_database(location: &str, restore: Option<&tempfile::TempDir>) -> tempfile::TempDir {
    let db = std::path::Path::new(location);
    let dir = db.parent().unwrap();
    let stem = db.file_name().unwrap().to_str().unwrap();
    let files = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(stem))
            .collect()
    };
    match restore {
        None => {
            let backup = tempfile::tempdir().unwrap();
            for f in files(dir) {
                std::fs::copy(&f, backup.path().join(f.file_name().unwrap())).unwrap();
            }
            backup
        }
        Some(backup) => {
            for f in files(dir) {
                std::fs::remove_file(f).unwrap();
            }
            for f in files(backup.path()) {
                std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
            }
            tempfile::tempdir().unwrap()
        }
    }
}

/// A database restored from a backup keeps its epoch: a delta cannot tell
/// that history was rewound, the periodic full resync does.
#[tokio::test]
async fn a_periodic_snapshot_repairs_a_view_after_a_restore() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    // The backup, at version 2.
    app.state.close().await;
    let backup = copy_database(&db.location, None);
    let app = db.app().await;
    let served = Served::start(app.state.clone(), 0).await;
    let port = served.port;
    let delta_only = FeedOptions {
        resync_every: None,
        ..FeedOptions::default()
    };
    let resyncing = FeedOptions {
        resync_every: Some(Duration::ZERO),
        ..FeedOptions::default()
    };
    let mut feeds = [
        ConfigFeed::new(&served.url, delta_only).unwrap(),
        ConfigFeed::new(&served.url, resyncing).unwrap(),
    ];
    app.delete(&resource_path("sandbox/vm"))
        .send()
        .await
        .expect(200); // 3
    app.put("/v1/namespaces/x")
        .json(json!({}))
        .send()
        .await
        .expect(201); // 4
    for feed in &mut feeds {
        assert_eq!(feed.refresh().await.unwrap().unwrap().0, 4);
        assert!(
            feed.refresh().await.unwrap().is_none(),
            "no spurious change"
        );
    }
    served.stop().await;
    app.state.close().await;

    // Restored to version 2, then two other commits: version 4 again.
    copy_database(&db.location, Some(&backup));
    let app = db.app().await;
    for name in ["a/1", "a/2"] {
        app.put(&resource_path(name))
            .json(json!({"kind": "copy", "domain_limit": 1}))
            .send()
            .await
            .expect(201);
    }
    let served = Served::start(app.state.clone(), port).await;
    let [delta_only, resyncing] = &mut feeds;
    // The delta-only feed believes it is up to date, and is wrong.
    assert!(delta_only.refresh().await.unwrap().is_none());
    assert!(delta_only.config().resource("a/1").is_none());
    // The resyncing one has the truth.
    let (version, config) = resyncing.refresh().await.unwrap().expect("repaired");
    assert_eq!(version, 4);
    assert!(config.resource("a/1").is_some());
    assert!(config.resource("sandbox/vm").is_some());
    served.stop().await;
}

#[tokio::test]
async fn waiting_for_a_version_returns_once_on_change_has_it_or_gives_up_at_its_bound() {
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let seen = Arc::new(std::sync::Mutex::new(0u64));
    let record = seen.clone();
    // A long interval: only waiting can bring the view forward.
    let handle = ConfigFeed::new(&served.url, FeedOptions::default())
        .unwrap()
        .spawn(Duration::from_secs(3600), move |version, _| {
            *record.lock().unwrap() = version;
        });
    let written = app
        .put(&resource_path("api/search"))
        .json(json!({"kind": "rate", "tiers": [{"limit": 9, "window": "1s"}]}))
        .send()
        .await
        .expect(200)
        .etag();
    assert!(
        handle
            .wait_for_version(written, Duration::from_secs(20))
            .await
    );
    assert_eq!(*seen.lock().unwrap(), written, "on_change had it first");
    assert_eq!(tier_limit(&handle.config()), 9);

    // The service goes away: a version it never made is waited for only
    // as long as asked.
    served.stop().await;
    let started = Instant::now();
    let reached = handle
        .wait_for_version(written + 1, Duration::from_millis(300))
        .await;
    let waited = started.elapsed();
    println!(
        "FAULT feed_wait_bound: injected a stopped service while waiting for a version; \
         expected false after the 300 ms bound; observed {reached} after {waited:?}"
    );
    assert!(!reached);
}

#[tokio::test]
async fn a_cache_write_on_a_full_disk_keeps_the_previous_cache_whole() {
    let Some(fs) = charon_testkit::SmallFs::for_test("cache_full_disk", 1 << 20) else {
        return;
    };
    let db = TestDb::sqlite();
    let app = db.app().await;
    seed(&app).await;
    let served = Served::start(app.state.clone(), 0).await;
    let cache = fs.path().join("view.json");
    let options = FeedOptions {
        cache_file: Some(cache.clone()),
        ..FeedOptions::default()
    };
    let mut feed = ConfigFeed::new(&served.url, options.clone()).unwrap();
    feed.refresh().await.unwrap().expect("loaded");
    let before = std::fs::read(&cache).unwrap();

    fs.fill();
    // A change big enough that its cache cannot be written.
    for i in 0..40 {
        let domains: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|j| {
                (
                    format!("t-{i}-{j}"),
                    json!({"tiers": [{"limit": 1, "window": "1s"}]}),
                )
            })
            .collect();
        app.put(&resource_path(&format!("big/r{i}")))
            .json(json!({"kind": "rate", "tiers": [], "domains": domains}))
            .send()
            .await
            .expect(201);
    }
    let applied = feed.refresh().await.unwrap().map(|(v, _)| v);
    let after = std::fs::read(&cache).unwrap();
    let leftovers: Vec<String> = std::fs::read_dir(fs.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "filler" && n != "view.json")
        .collect();
    fs.free();
    served.stop().await;
    let restarted = ConfigFeed::new("http://127.0.0.1:9", options).unwrap();
    println!(
        "FAULT cache_full_disk: injected a full tmpfs under the cache file while a view of 40 \
         new resources arrived; expected the view applied in memory, the old cache whole, \
         nothing left behind; observed applied {applied:?}, cache unchanged {}, leftovers \
         {leftovers:?}, a restart starts from version {}",
        before == after,
        restarted.version(),
    );
    assert_eq!(applied, Some(42));
    assert_eq!(before, after, "the previous cache, whole");
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(restarted.version(), 2);
}
