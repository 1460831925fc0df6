//! `charon serve --store rediss://…` and `redis://user:password@…` as an
//! operator runs them (issue 13, item 5): real `charon` processes against
//! private TLS and ACL `redis-server`s, and the password nowhere in what
//! the process prints or serves.

#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{bin, charon, strict_client};
use charon_testkit::{CharonProcess, RedisServer, RedisSetup, RedisTlsSetup, TestPki, free_port};

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 3, window: 1m } ]
  - name: vm
    kind: copy
    domain_limit: 2
"#;

const PASSWORD: &str = "Sup3r-S3cret-Pw";

/// The rights docs/redis.md gives (crates/store/tests/store/redis_security.rs
/// checks that list against the store's commands).
const ACL_RULES: &str = "~charon:* -@all +evalsha +script|load +scan +time +get +set +del \
     +exists +sadd +srem +smembers +sismember +scard +hget +hset +hdel +hexists +hgetall \
     +hincrby +hmget +hvals +lindex +llen +lpop +lrange +lset +ltrim +rpush +persist +pexpire +pexpireat \
     +zadd +zcard +zrangebyscore +zrem +zremrangebyscore";

/// Runs `charon serve` with `args` (a configuration file and free ports
/// added) expecting it to fail at start-up: its exit status and all it
/// printed. Fails the test if it is still running after 60 s.
fn failed_start(args: &[&str]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.yaml");
    std::fs::write(&config, LIMITS).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut child = charon()
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--listen", &grpc, "--http-listen", &http])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("charon serve {args:?} did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_over_mutual_tls_as_an_acl_user_decides_and_never_shows_the_password() {
    let pki = TestPki::new();
    let redis = RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(&pki, "yes")),
        requirepass: Some("admin-pw".to_owned()),
        users: vec![format!("charon on >{PASSWORD} {ACL_RULES}")],
    });
    let url = redis.url_as("charon", PASSWORD);
    let (ca, cert, key) = (
        pki.ca().display().to_string(),
        pki.client_cert().display().to_string(),
        pki.client_key().display().to_string(),
    );
    let server = CharonProcess::start(
        bin(),
        LIMITS,
        &[
            "--store",
            &url,
            "--redis-ca",
            &ca,
            "--redis-cert",
            &cert,
            "--redis-key",
            &key,
        ],
    );
    let client = strict_client(&server);
    let mut granted = 0;
    for _ in 0..5 {
        if client
            .request("api", "d")
            .send()
            .await
            .expect("a decision")
            .is_granted()
        {
            granted += 1;
        }
    }
    assert_eq!(granted, 3, "exactly the tier's limit, through Redis");
    let held = client
        .reserve("vm", "d")
        .copies(2)
        .send()
        .await
        .expect("reserve");
    assert_eq!(held.copies(), 2);
    let refused = client.reserve("vm", "d").send().await.expect("reserve");
    assert_eq!(refused.copies(), 0, "the domain limit holds");
    drop(held);
    drop(refused);

    let (status, readyz) = server.http_get("/readyz").expect("readyz");
    assert_eq!(status, 200, "{readyz}");
    let (_, metrics) = server.http_get("/metrics").expect("metrics");
    let log = server.log();
    assert!(!log.is_empty(), "the server logs");
    for (what, text) in [("log", &log), ("/readyz", &readyz), ("/metrics", &metrics)] {
        assert!(!text.contains(PASSWORD), "the password shows in the {what}");
    }
}

#[test]
fn serve_with_only_the_ca_runs_against_tls_without_client_certificates() {
    let pki = TestPki::new();
    let redis = RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(&pki, "no")),
        ..RedisSetup::default()
    });
    let ca = pki.ca().display().to_string();
    let server = CharonProcess::start(bin(), LIMITS, &["--store", &redis.url(), "--redis-ca", &ca]);
    let (status, body) = server.http_get("/readyz").expect("readyz");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn serve_refuses_to_start_without_the_client_certificate_a_redis_requires() {
    let pki = TestPki::new();
    let redis = RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(&pki, "yes")),
        ..RedisSetup::default()
    });
    let ca = pki.ca().display().to_string();
    // A short connect timeout: should the close overtake the TLS alert, the
    // start is retried (a dropped connection) until it passes.
    let (status, out) = failed_start(&[
        "--store",
        &redis.url(),
        "--redis-ca",
        &ca,
        "--store-connect-timeout",
        "3s",
    ]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("cannot use Redis at {}", redis.url()))
            && out.contains("client certificate"),
        "{out}"
    );
}

#[test]
fn serve_refuses_a_redis_whose_certificate_another_ca_signed() {
    let pki = TestPki::new();
    let stranger = TestPki::new();
    let redis = RedisServer::start_with(RedisSetup {
        tls: Some(RedisTlsSetup::from_pki(&pki, "no")),
        ..RedisSetup::default()
    });
    let ca = stranger.ca().display().to_string();
    let (status, out) = failed_start(&["--store", &redis.url(), "--redis-ca", &ca]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("does not trust"), "{out}");
}

#[test]
fn serve_refuses_a_wrong_password_or_missing_rights_without_printing_the_password() {
    let redis = RedisServer::start_with(RedisSetup {
        users: vec![
            format!("charon on >{PASSWORD} {ACL_RULES}"),
            // The documented rules but for a command joining uses.
            format!("short on >{PASSWORD} {ACL_RULES} -sadd"),
        ],
        ..RedisSetup::default()
    });
    let wrong = redis.url_as("charon", "Wr0ng-Pw-Given");
    let (status, out) = failed_start(&["--store", &wrong]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        !out.contains("Wr0ng-Pw-Given"),
        "the password shows:\n{out}"
    );
    assert!(
        out.contains(&format!(
            "cannot use Redis at redis://charon:***@127.0.0.1:{}",
            redis.port()
        )) && out.contains("user name or password"),
        "{out}"
    );

    let short = redis.url_as("short", PASSWORD);
    let (status, out) = failed_start(&["--store", &short]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(!out.contains(PASSWORD), "the password shows:\n{out}");
    assert!(
        out.contains("NOPERM") && out.contains("docs/redis.md"),
        "{out}"
    );
}

#[test]
fn serve_help_does_not_print_the_store_url_from_the_environment() {
    let url = format!("redis://charon:{PASSWORD}@127.0.0.1:1");
    let out = charon()
        .args(["serve", "--help"])
        .env("CHARON_STORE", &url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("--redis-ca"),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "the password shows:\n{text}");
}
