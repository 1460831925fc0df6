//! The test kit itself works: private instances start and stop.

use std::io::{Read, Write};
use std::net::TcpStream;

#[test]
fn a_private_redis_answers_ping() {
    let redis = charon_testkit::RedisServer::start();
    let mut s = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect");
    s.write_all(b"PING\r\n").expect("write");
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"+PONG\r\n");
}

#[test]
fn a_private_postgres_accepts_connections() {
    let pg = charon_testkit::Postgres::start();
    let url = pg.create_database("charon_test");
    assert!(url.ends_with("/charon_test"));
}

/// `redis-cli` against the TLS server `redis` as `user`:`pass` (the
/// default user without a password if `user` is empty), with a client
/// certificate if `client` is given, trusting `ca`: its output and status.
fn tls_cli(
    redis: &charon_testkit::RedisServer,
    ca: &std::path::Path,
    client: Option<&charon_testkit::TestPki>,
    user: &str,
    pass: &str,
    args: &[&str],
) -> (bool, String) {
    let mut cmd = std::process::Command::new("redis-cli");
    cmd.args(["--tls", "-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .arg("--cacert")
        .arg(ca);
    if let Some(pki) = client {
        cmd.arg("--cert")
            .arg(pki.client_cert())
            .arg("--key")
            .arg(pki.client_key());
    }
    if !user.is_empty() {
        cmd.args(["--user", user, "--pass", pass, "--no-auth-warning"]);
    }
    let out = cmd.args(args).output().expect("run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_private_tls_redis_with_an_acl_user_checks_certificates_and_rights() {
    let pki = charon_testkit::TestPki::new();
    let redis = charon_testkit::RedisServer::start_with(charon_testkit::RedisSetup {
        tls: Some(charon_testkit::RedisTlsSetup::from_pki(&pki, "yes")),
        requirepass: Some("root-secret".to_owned()),
        users: vec!["app on >app-secret ~app:* +set +get".to_owned()],
    });
    assert!(redis.url().starts_with("rediss://127.0.0.1:"));
    assert_eq!(
        redis.url_as("app", "pw"),
        format!("rediss://app:pw@127.0.0.1:{}", redis.port())
    );
    // The plain port is closed: TLS only.
    assert!(TcpStream::connect(("127.0.0.1", redis.port())).is_ok());
    let (_, plain) = {
        let mut s = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .expect("timeout");
        let _ = s.write_all(b"PING\r\n");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        (s, buf)
    };
    assert!(!plain.starts_with(b"+PONG"), "a plain PING is not answered");

    // With the client certificate, the user's rights hold.
    let (_, ok) = tls_cli(
        &redis,
        &pki.ca(),
        Some(&pki),
        "app",
        "app-secret",
        &["SET", "app:k", "v"],
    );
    assert!(ok.contains("OK"), "{ok}");
    let (_, got) = tls_cli(
        &redis,
        &pki.ca(),
        Some(&pki),
        "app",
        "app-secret",
        &["GET", "app:k"],
    );
    assert_eq!(got.trim(), "v");
    let (_, denied) = tls_cli(
        &redis,
        &pki.ca(),
        Some(&pki),
        "app",
        "app-secret",
        &["SET", "other:k", "v"],
    );
    assert!(denied.contains("NOPERM"), "{denied}");
    let (_, wrong) = tls_cli(
        &redis,
        &pki.ca(),
        Some(&pki),
        "app",
        "nope",
        &["GET", "app:k"],
    );
    assert!(wrong.contains("WRONGPASS"), "{wrong}");
    let (_, noauth) = tls_cli(&redis, &pki.ca(), Some(&pki), "", "", &["GET", "app:k"]);
    assert!(noauth.contains("NOAUTH"), "{noauth}");
    // Without it, the handshake fails (tls-auth-clients yes).
    let (_, refused) = tls_cli(
        &redis,
        &pki.ca(),
        None,
        "app",
        "app-secret",
        &["GET", "app:k"],
    );
    eprintln!("without a client certificate: {refused}");
    assert_ne!(refused.trim(), "v");
    assert!(refused.contains("rror"), "{refused}");
    // A client trusting another CA refuses the server's certificate.
    let other = charon_testkit::TestPki::new();
    let (_, untrusted) = tls_cli(
        &redis,
        &other.ca(),
        Some(&pki),
        "app",
        "app-secret",
        &["GET", "app:k"],
    );
    eprintln!("trusting another CA: {untrusted}");
    assert!(
        untrusted
            .to_lowercase()
            .contains("certificate verify failed"),
        "{untrusted}"
    );
}
