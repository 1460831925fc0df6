//! The Redis store's security (issue 13, item 5), against real private
//! `redis-server` processes: TLS (`rediss://`, a private CA, mutual TLS),
//! ACL users with the minimal rights of `docs/redis.md`, and passwords
//! that no error ever shows.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use charon_core::config::{CopyLimits, Enforcement, GroupLimit, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::lease::{
    Algorithm, LeaseContext, LeaseParams, LeaseSet, Quantity, Want, get_capacity, release_capacity,
};
use charon_core::request::Amount;
use charon_store::{
    RedisOptions, RedisStore, RedisTls, Reserved, Store, StoreError, WaitOptions, redacted,
};
use charon_testkit::stores::{eventually, options, spawn_maintain};
use charon_testkit::{RedisServer, RedisSetup, RedisTlsSetup, TestPki};

const TTL: Duration = Duration::from_millis(1_000);

/// The ACL rules Charon's Redis user needs, exactly as `docs/redis.md`
/// gives them (checked below against the doc and against every command
/// the store and its scripts send).
const ACL_RULES: &str = "~charon:* &charon:* -@all +evalsha +script|load +scan +time +get +set +del \
     +exists +incr +sadd +srem +smembers +sismember +scard +hget +hset +hdel +hexists +hgetall \
     +hincrby +hmget +hvals +lindex +llen +lpop +lrange +lset +ltrim +rpush +persist +pexpire +pexpireat \
     +pttl +publish +subscribe +zadd +zcard +zrange +zrangebyscore +zrem +zremrangebyscore +zscore";

/// What a Redis Cluster user needs on top of [`ACL_RULES`], exactly as
/// `docs/redis.md` gives it: the slot map (`CLUSTER SLOTS`, read by the
/// client at connect and on MOVED), `WAIT` after copy writes and
/// `ASKING` before a copy script redirected by ASK.
const CLUSTER_ACL_RULES: &str = "+cluster|slots +wait +asking";

fn tls(pki: &TestPki, client: bool) -> RedisTls {
    charon_testkit::stores::redis_tls(pki, client)
}

async fn connect(url: &str, id: &str, tls: RedisTls) -> Result<Arc<RedisStore>, StoreError> {
    RedisStore::connect(
        url,
        RedisOptions {
            tls,
            ..options(None, id, TTL)
        },
    )
    .await
}

fn tls_redis(pki: &TestPki, auth_clients: &'static str) -> RedisServer {
    RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(pki, auth_clients)),
        ..RedisSetup::default()
    })
}

fn amount(n: u64) -> Amount {
    Amount::exactly(n).unwrap()
}

fn copy_limits() -> CopyLimits {
    CopyLimits {
        domain_limit: 4,
        global_limit: Some(5),
        groups: vec![GroupLimit {
            name: "g1".into(),
            limit: 5,
        }],
    }
}

/// A few decisions that must be exact: 5 of 7 single hits granted under
/// a tier of 5 per minute; copies reserved up to the domain limit,
/// released, transferred and seized, with the counts Redis keeps; a
/// lease got, refreshed and released.
async fn decides_exactly(store: &RedisStore) {
    let tiers = [Tier {
        limit: 5,
        window: 60_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    let mut granted = Vec::new();
    for _ in 0..7 {
        let r = store
            .request("api", "d", limits, amount(1), Enforcement::Enforce)
            .await
            .unwrap();
        granted.push(r.granted);
    }
    assert_eq!(granted, [1, 1, 1, 1, 1, 0, 0]);

    let l = copy_limits();
    let r = store
        .reserve("vm", "d", &l, amount(3), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!((r.granted, r.domain_holds), (3, 3));
    let r = store
        .reserve("vm", "d", &l, amount(2), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!(
        (r.granted, r.domain_holds),
        (0, 3),
        "beyond the domain limit"
    );
    let hold = Hold::new("vm", "d", ["g1".to_owned()]);
    let s = store.release(&hold, 1).await.unwrap();
    assert_eq!((s.domain_holds, s.global_holds), (2, 2));
    let id = store.transfer(&hold, 1, 60_000).await.unwrap();
    let staged = store.seize(&id).await.unwrap().unwrap();
    assert_eq!(staged.copies, 1);
    // Seized copies are the seizer's again.
    let (counts, mine) = store.copy_log("vm").await.unwrap();
    assert_eq!((counts.global, mine.global), (2, 2));
    // A waiter: its queue, its answer and its wake-up (pub/sub) are all
    // within the user's rights.
    let wait = WaitOptions {
        wait_ms: 60_000,
        queue_limit: 10,
    };
    let Reserved::Waiting(ticket) = store
        .reserve_or_wait("vm", "w", &l, amount(4), Enforcement::Enforce, wait)
        .await
        .unwrap()
    else {
        panic!("4 more than the 3 copies free: it waits");
    };
    assert_eq!(store.queue_lengths().await.unwrap(), [("vm".into(), 1)]);
    store.release(&hold, 2).await.unwrap();
    let heard = eventually(Duration::from_secs(10), async || store.wake_ups_heard() > 0).await;
    assert!(heard.is_some(), "the waiter's wake-up came by pub/sub");
    let r = store.wait_outcome(&ticket).await.unwrap().unwrap();
    assert_eq!((r.granted, r.global_holds), (4, 4));
    store
        .release(&Hold::new("vm", "w", ["g1".to_owned()]), 4)
        .await
        .unwrap();
    // Leases: a read, a refresh on the server's copy (`TIME` and the
    // compare and set), the snapshot and a release.
    let p = LeaseParams::new(
        Quantity::units(10).unwrap(),
        Algorithm::FairShare,
        10_000,
        1_000,
    )
    .unwrap()
    .with_learning_mode(0)
    .unwrap();
    for wants in [4.0, 6.0] {
        let mut got = None;
        store
            .leases("db", "c", &mut |set: &mut LeaseSet, now| {
                let ctx = LeaseContext::root(&p, 0, now);
                let want = Want::parse(wants, 0.0, 1).unwrap();
                got = Some(get_capacity(set, &p, ctx, "c", want).capacity);
            })
            .await
            .unwrap();
        assert_eq!(got.unwrap().to_f64(), wants);
    }
    assert_eq!(store.lease_sets().await.unwrap().1.len(), 1);
    let mut released = false;
    store
        .leases("db", "c", &mut |set: &mut LeaseSet, now| {
            released = release_capacity(set, "c", now);
        })
        .await
        .unwrap();
    assert!(released);
    store.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_the_store_decides_exactly_and_keeps_its_membership() {
    let pki = TestPki::new();
    let redis = tls_redis(&pki, "yes");
    assert!(redis.url().starts_with("rediss://"));
    let store = connect(&redis.url(), "tls", tls(&pki, true)).await.unwrap();
    let maintain = spawn_maintain(&store);
    decides_exactly(&store).await;
    // Renewals go over the same TLS connection: after several liveness
    // periods the member is still live and serving.
    tokio::time::sleep(TTL * 2).await;
    assert!(!maintain.is_finished(), "the membership holds over TLS");
    store.ping().await.unwrap();
    store.leave().await.unwrap();
    maintain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_the_ca_the_store_works_where_redis_asks_no_client_certificate() {
    let pki = TestPki::new();
    let redis = tls_redis(&pki, "no");
    let store = connect(&redis.url(), "ca-only", tls(&pki, false))
        .await
        .unwrap();
    decides_exactly(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_a_redis_that_requires_one_refuses_the_store() {
    let pki = TestPki::new();
    let redis = tls_redis(&pki, "yes");
    let e = connect(&redis.url(), "no-cert", tls(&pki, false))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&redis.url()), "names the address: {text}");
    // Denied when the alert arrives; if the close overtakes it, a dropped
    // connection naming the likely cause.
    assert!(
        matches!(e, StoreError::Denied(_) | StoreError::Unavailable(_))
            && text.contains("client certificate"),
        "says what is wrong: {e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_untrusted_ca_is_refused() {
    let pki = TestPki::new();
    let stranger = TestPki::new();
    let redis = tls_redis(&pki, "optional");
    // Trusting another CA (the client certificate is the right one).
    let mut other = tls(&pki, true);
    other.ca_pem = Some(TestPki::read(&stranger.ca()));
    let e = connect(&redis.url(), "untrusted", other).await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, StoreError::Denied(_))
            && text.contains("does not trust")
            && text.contains(&redis.url()),
        "{e:?}"
    );
    // Trusting the system's roots only: the private CA is not among them.
    let e = connect(&redis.url(), "system-roots", RedisTls::default())
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Denied(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_for_a_plain_url_are_a_mistake_not_ignored() {
    let pki = TestPki::new();
    let redis = RedisServer::start();
    let e = connect(&redis.url(), "plain", tls(&pki, false))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Denied(m) if m.contains("rediss://")),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_the_documented_rights_decides_renews_and_cleans_up() {
    let redis = RedisServer::start_with(RedisSetup {
        users: vec![format!("charon on >charon-pw {ACL_RULES}")],
        requirepass: Some("admin-pw".to_owned()),
        ..RedisSetup::default()
    });
    let url = redis.url_as("charon", "charon-pw");
    // An earlier server that left copies behind and died.
    let gone = connect(&url, "gone", RedisTls::default()).await.unwrap();
    decides_exactly(&gone).await;
    drop(gone);
    // A server starting alone after its liveness lapsed cleans them up
    // (membership scripts, SCAN, key sets), all within the user's rights.
    tokio::time::sleep(TTL * 2).await;
    let store = connect(&url, "next", RedisTls::default()).await.unwrap();
    let maintain = spawn_maintain(&store);
    let cleaned = eventually(TTL * 3, async || {
        store.copy_log("vm").await.unwrap().0.global == 0
    })
    .await;
    assert!(cleaned.is_some(), "the dead server's copies are removed");
    tokio::time::sleep(TTL).await;
    assert!(!maintain.is_finished(), "renewals run within the rights");
    let tiers = [Tier {
        limit: 1,
        window: 60_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    let r = store
        .request("api2", "d", limits, amount(1), Enforcement::Enforce)
        .await
        .unwrap();
    assert_eq!(r.granted, 1);
    store.leave().await.unwrap();
    maintain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_rights_is_refused_clearly() {
    let redis = RedisServer::start_with(RedisSetup {
        users: vec![
            // Everything but EVALSHA.
            "noeval on >pw ~charon:* +@all -evalsha".to_owned(),
            // Commands allowed, but not on Charon's keys.
            "elsewhere on >pw ~other:* +@all".to_owned(),
            // The documented rules but for a command joining runs inside a
            // script (Redis says ERR there, not NOPERM).
            format!("nosadd on >pw {ACL_RULES} -sadd"),
            // The documented rules but for the command the rate script
            // appends hits with: it joins, then its decisions are refused.
            format!("norpush on >pw {ACL_RULES} -rpush"),
        ],
        ..RedisSetup::default()
    });
    let store = connect(
        &redis.url_as("norpush", "pw"),
        "norpush",
        RedisTls::default(),
    )
    .await
    .unwrap();
    let tiers = [Tier {
        limit: 5,
        window: 60_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    let e = store
        .request("api", "d", limits, amount(1), Enforcement::Enforce)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Denied(m) if m.contains("NOPERM") && m.contains("docs/redis.md")),
        "a decision refused by the rights says so: {e:?}"
    );
    drop(store);
    for user in ["noeval", "elsewhere", "nosadd"] {
        let e = connect(&redis.url_as(user, "pw"), user, RedisTls::default())
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, StoreError::Denied(_)) && text.contains("NOPERM"),
            "{user}: {e:?}"
        );
        assert!(
            text.contains("docs/redis.md"),
            "points to the rules: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_without_showing_it() {
    let redis = RedisServer::start_with(RedisSetup {
        users: vec![format!("charon on >right-pw {ACL_RULES}")],
        requirepass: Some("admin-pw".to_owned()),
        ..RedisSetup::default()
    });
    for url in [
        redis.url_as("charon", "Wr0ng-Secret"),
        redis.url_as("", "Wr0ng-Secret"),
    ] {
        let e = connect(&url, "wrong", RedisTls::default())
            .await
            .unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("Wr0ng-Secret"), "the password shows: {text}");
        assert!(
            matches!(e, StoreError::Denied(_))
                && text.contains("user name or password")
                && text.contains(&redacted(&url))
                && text.contains("***"),
            "{text}"
        );
    }
    // No password at all where one is required.
    let e = connect(&redis.url(), "none", RedisTls::default())
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Denied(_)), "{e:?}");
    // The options' Debug form shows no key material either.
    let pki = TestPki::new();
    let shown = format!(
        "{:?}",
        RedisOptions {
            tls: tls(&pki, true),
            ..RedisOptions::default()
        }
    );
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains("CERTIFICATE"),
        "{shown}"
    );
}

/// Every command the store sends (from Rust or from its Lua scripts) is
/// in the documented rules, and the doc gives exactly these rules: a new
/// command without a doc change fails here, not in an operator's Redis.
#[test]
fn the_documented_acl_rules_cover_every_command_the_store_sends() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/src/redis");
    let allowed: BTreeSet<String> = ACL_RULES
        .split_whitespace()
        .chain(CLUSTER_ACL_RULES.split_whitespace())
        .filter_map(|r| r.strip_prefix('+'))
        .map(str::to_owned)
        .collect();
    let mut sent = BTreeSet::new();
    let mut sources = Vec::new();
    for dir in [root.to_owned(), format!("{root}/lua")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                sources.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    assert!(sources.len() > 10, "read the store's sources");
    for text in &sources {
        for opener in ["redis.call('", "redis.call(\"", "redis.pcall('", "cmd(\""] {
            for (i, _) in text.match_indices(opener) {
                let rest = &text[i + opener.len()..];
                let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
                sent.insert(name.to_lowercase());
            }
        }
        // A command name in a variable would escape this check.
        assert!(!text.contains("redis.call(cmd"), "a computed command");
    }
    assert!(
        sent.contains("evalsha") && sent.contains("zadd"),
        "{sent:?}"
    );
    // The PING at connect time may be refused (NOPERM is accepted there):
    // not needed.
    sent.remove("ping");
    // SCRIPT is sent as SCRIPT LOAD only.
    sent.remove("script");
    sent.insert("script|load".to_owned());
    // CLUSTER is sent as CLUSTER SLOTS only (a cluster's masters, for
    // SCAN); the client library sends the same.
    if sent.remove("cluster") {
        sent.insert("cluster|slots".to_owned());
    }
    let missing: Vec<_> = sent.difference(&allowed).collect();
    assert!(
        missing.is_empty(),
        "not in the documented rules: {missing:?}"
    );
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/redis.md"))
        .unwrap();
    let doc_words: Vec<&str> = doc.split_whitespace().collect();
    let rules: Vec<&str> = ACL_RULES.split_whitespace().collect();
    assert!(
        doc_words
            .windows(rules.len())
            .any(|w| w == rules.as_slice()),
        "docs/redis.md gives the rules as: {ACL_RULES}"
    );
    let cluster: Vec<&str> = CLUSTER_ACL_RULES.split_whitespace().collect();
    assert!(
        doc_words
            .windows(cluster.len())
            .any(|w| w == cluster.as_slice()),
        "docs/redis.md gives the cluster's extra rules as: {CLUSTER_ACL_RULES}"
    );
}
