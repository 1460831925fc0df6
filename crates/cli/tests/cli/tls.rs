//! TLS and mutual TLS on real `charon serve` processes (docs/tls.md): both
//! listeners, the client library and the CLI, certificate reload on SIGHUP
//! and on file change without dropping sessions, broken files refused, the
//! configuration feed over `https://`. Certificates are made by testkit's
//! `TestPki` (rcgen).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::support::{bin, charon};
use charon_client::{Client, ClientOptions, ClientTls, ErrorKind};
use charon_testkit::{CharonProcess, TestPki, https_get, presented_certificate, wait_until};

mod mistakes;

const LIMITS: &str = "\
resources:
  - { name: api/search, kind: rate, tiers: [ { limit: 100, window: 1s } ] }
  - { name: sandbox/vm, kind: copy, domain_limit: 4 }
";

/// A strict client (no degraded grants) of `server` over TLS with `tls`.
fn client(server: &CharonProcess, tls: Option<ClientTls>) -> Client {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut options = ClientOptions::new(format!("{scheme}://127.0.0.1:{}", server.grpc_port));
    options.fail_open = false;
    options.connect_timeout = Duration::from_secs(3);
    options.request_timeout = Duration::from_secs(3);
    options.tls = tls;
    Client::connect(options).unwrap()
}

/// Trust `pki`'s CA; present its client certificate with `cert`.
fn trusting(pki: &TestPki, cert: bool) -> Option<ClientTls> {
    let (c, k) = (pki.client_cert(), pki.client_key());
    Some(
        ClientTls::from_files(
            Some(&pki.ca()),
            cert.then_some(c.as_path()),
            cert.then_some(k.as_path()),
        )
        .unwrap(),
    )
}

/// `charon serve --config FILE` under TLS with the certificate files
/// copied into its directory (`tls.pem`, `tls.key`) so a test can replace
/// them; `extra` flags after.
fn serve_tls(pki: &TestPki, extra: &[&str], probe_with_cert: bool) -> CharonProcess {
    serve_tls_with(
        pki,
        (&pki.server_cert(), &pki.server_key()),
        extra,
        probe_with_cert,
    )
}

/// [`serve_tls`] with this certificate and key.
fn serve_tls_with(
    pki: &TestPki,
    cert_and_key: (&Path, &Path),
    extra: &[&str],
    probe_with_cert: bool,
) -> CharonProcess {
    pki.serve(bin(), LIMITS, cert_and_key, extra, probe_with_cert)
}

/// Replaces `to` with `from` as editors and Kubernetes do: a new file
/// renamed over the old one.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// One value of `/metrics`, by its full series name.
fn metric(server: &CharonProcess, series: &str) -> Option<f64> {
    let (_, text) = server.http_get("/metrics")?;
    crate::support::metric_in(&text, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_needs_the_ca_that_signed_the_server() {
    let pki = TestPki::new();
    let other = TestPki::named("another CA");
    let server = serve_tls(&pki, &[], false);

    // A connection that never starts its handshake, and one that speaks
    // plain HTTP/1.1: neither holds up the next client, nor stops the
    // listener.
    let _stalled = std::net::TcpStream::connect(("127.0.0.1", server.grpc_port)).unwrap();
    let mut garbage = std::net::TcpStream::connect(("127.0.0.1", server.grpc_port)).unwrap();
    std::io::Write::write_all(&mut garbage, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let _stalled_http = std::net::TcpStream::connect(("127.0.0.1", server.http_port)).unwrap();

    let good = client(&server, trusting(&pki, false));
    let grant = good.request("api/search", "t").copies(2).send().await;
    assert_eq!(grant.unwrap().granted, 2);

    // Plain text to a TLS port: a client error that says so (never a
    // server error, which a failing-open client would turn into a grant).
    let plain = client(&server, None);
    let e = plain.request("api/search", "t").send().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongProtocol, "{e}");
    assert!(e.message().contains("speaks TLS"), "{e}");
    // A CA that did not sign the server's certificate: refused, a client
    // error too.
    let wrong = client(&server, trusting(&other, false));
    let e = wrong.request("api/search", "t").send().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(
        e.message()
            .contains("not signed by a CA this client trusts"),
        "{e}"
    );

    // The CLI's --ca (the default http:// address becomes https://).
    let out = charon()
        .args(["client", "request", "api/search", "t", "--copies", "3"])
        .args([
            "--server",
            &format!("http://127.0.0.1:{}", server.grpc_port),
        ])
        .arg("--ca")
        .arg(pki.ca())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"granted\":3"), "{stdout}");
    let out = charon()
        .args(["client", "request", "api/search", "t"])
        .args([
            "--server",
            &format!("https://127.0.0.1:{}", server.grpc_port),
        ])
        .arg("--ca")
        .arg(other.ca())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a CA that did not sign it is refused"
    );

    // HTTP is under TLS too.
    assert_eq!(
        charon_testkit::http_get(server.http_port, "/healthz"),
        None,
        "plain HTTP to the TLS listener"
    );
    assert_eq!(
        https_get(&pki.client_config(false), server.http_port, "/healthz").map(|r| r.0),
        Some(200)
    );
    assert_eq!(
        https_get(&other.client_config(false), server.http_port, "/healthz"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate_it_trusts() {
    let pki = TestPki::new();
    let other = TestPki::named("another CA");
    let ca = pki.ca().display().to_string();
    let server = serve_tls(&pki, &["--tls-client-ca", &ca], true);

    // Trusts the server, but presents no certificate.
    let anonymous = client(&server, trusting(&pki, false));
    let e = anonymous
        .request("api/search", "t")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(e.message().contains("requires a client certificate"), "{e}");
    // Presents a certificate of another CA (and trusts the server).
    let mut strangers = ClientTls::from_files(
        Some(&pki.ca()),
        Some(&other.client_cert()),
        Some(&other.client_key()),
    )
    .unwrap();
    strangers.server_name = None;
    let stranger = client(&server, Some(strangers));
    let e = stranger
        .request("api/search", "t")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(
        e.message().contains("refused this client's certificate"),
        "{e}"
    );
    // A certificate the client CA signed.
    let member = client(&server, trusting(&pki, true));
    assert_eq!(
        member
            .request("api/search", "t")
            .send()
            .await
            .unwrap()
            .granted,
        1
    );
    let out = charon()
        .args(["client", "request", "api/search", "t"])
        .args([
            "--server",
            &format!("https://127.0.0.1:{}", server.grpc_port),
        ])
        .arg("--ca")
        .arg(pki.ca())
        .arg("--cert")
        .arg(pki.client_cert())
        .arg("--key")
        .arg(pki.client_key())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // /metrics the same.
    let metrics = |config| https_get(&config, server.http_port, "/metrics");
    assert_eq!(
        metrics(pki.client_config(false)),
        None,
        "no client certificate"
    );
    // Trusts the server's CA, presents a certificate of another CA.
    assert_eq!(
        metrics(pki.client_config_presenting(&other)),
        None,
        "a certificate of another CA"
    );
    let (code, body) = metrics(pki.client_config(true)).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("charon_decisions_total"), "{body}");
}

/// Waits until a new connection to `port` is shown the certificate in
/// `pem`.
fn until_presented(port: u16, pem: &Path, within: Duration) -> bool {
    let want = TestPki::der(pem);
    wait_until(within, || presented_certificate(port) == Some(want.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_certificate_is_served_to_new_connections_and_sessions_keep_their_holds() {
    let pki = TestPki::new();
    let second = TestPki::named("charon second CA");
    let server = serve_tls(&pki, &[], false);
    let (cert, key) = (server.dir().join("tls.pem"), server.dir().join("tls.key"));
    assert!(until_presented(
        server.grpc_port,
        &pki.server_cert(),
        Duration::from_secs(1)
    ));

    // A session holding copies, on a connection made under the first
    // certificate.
    let old = client(&server, trusting(&pki, false));
    let mut hold = old
        .reserve("sandbox/vm", "d")
        .copies(3)
        .send()
        .await
        .unwrap();
    assert_eq!(hold.copies(), 3);
    assert_eq!(metric(&server, "charon_copies_held"), Some(3.0));

    // SIGHUP with a certificate of another CA in the files.
    replace(&second.server_key(), &key);
    replace(&second.server_cert(), &cert);
    server.signal("HUP");
    assert!(
        until_presented(
            server.grpc_port,
            &second.server_cert(),
            Duration::from_secs(5)
        ),
        "gRPC: the new certificate\n{}",
        server.log()
    );
    assert!(until_presented(
        server.http_port,
        &second.server_cert(),
        Duration::from_secs(1)
    ));

    // The old session goes on, on its old connection, with its hold.
    hold.release(1).await.unwrap();
    assert_eq!(hold.copies(), 2);
    let more = old
        .reserve("sandbox/vm", "d")
        .copies(4)
        .send()
        .await
        .unwrap();
    assert_eq!(more.copies(), 2, "the hold still counts: 2 of 4 are free");
    drop(more);
    // New connections: trusting the new CA works and sees the old hold;
    // trusting only the old one fails.
    let new = client(&server, trusting(&second, false));
    let probe = new
        .reserve("sandbox/vm", "d")
        .copies(4)
        .send()
        .await
        .unwrap();
    assert_eq!(probe.copies(), 2, "the old session's hold is still counted");
    drop(probe);
    let stale = client(&server, trusting(&pki, false));
    assert!(stale.request("api/search", "t").send().await.is_err());
    let held = |pki: &TestPki| {
        https_get(&pki.client_config(false), server.http_port, "/metrics").and_then(|(_, t)| {
            t.lines().find_map(|l| {
                l.strip_prefix("charon_copies_held ")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
        })
    };
    assert!(wait_until(Duration::from_secs(2), || held(&second) == Some(2.0)));

    // Only the files change (no signal): picked up by polling.
    let (third_cert, third_key) = pki.issue_server("third", "charon third certificate");
    replace(&third_key, &key);
    replace(&third_cert, &cert);
    assert!(
        until_presented(server.grpc_port, &third_cert, Duration::from_secs(5)),
        "a changed file is picked up without a signal\n{}",
        server.log()
    );
    hold.release(1).await.unwrap();
    assert_eq!(hold.copies(), 1, "the session outlived two reloads");
    assert!(wait_until(Duration::from_secs(2), || held(&pki) == Some(1.0)));
    assert!(server.log().contains("TLS certificate reloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_keep_the_previous_certificate() {
    let pki = TestPki::new();
    let second = TestPki::named("charon second CA");
    let server = serve_tls(&pki, &[], false);
    let (cert, key) = (server.dir().join("tls.pem"), server.dir().join("tls.key"));
    let before = TestPki::der(&pki.server_cert());
    let refused = |n: f64| {
        wait_until(Duration::from_secs(5), || {
            metric(&server, "charon_tls_reloads_total{result=\"refused\"}") >= Some(n)
        })
    };

    // An empty certificate file.
    std::fs::write(&cert, "").unwrap();
    server.signal("HUP");
    assert!(refused(1.0), "{}", server.log());
    assert_eq!(
        presented_certificate(server.grpc_port),
        Some(before.clone())
    );
    assert_eq!(metric(&server, "charon_tls_reload_failing"), Some(1.0));
    let (code, ready) = server.http_get("/readyz").unwrap();
    assert_eq!(code, 200, "still serving: {ready}");
    assert!(ready.contains("tls: the files were refused"), "{ready}");

    // A key that does not go with the certificate.
    replace(&second.server_cert(), &cert);
    server.signal("HUP");
    assert!(refused(2.0), "{}", server.log());
    assert_eq!(
        presented_certificate(server.grpc_port),
        Some(before.clone())
    );
    assert_eq!(presented_certificate(server.http_port), Some(before));
    // (The empty file may have been refused twice, by its change and by
    // the signal, on a slow machine: wait for this refusal itself.)
    assert!(
        wait_until(Duration::from_secs(5), || server
            .log()
            .contains("the key does not go with the certificate")),
        "{}",
        server.log()
    );
    // Still answering, under the old certificate.
    let c = client(&server, trusting(&pki, false));
    assert_eq!(
        c.request("api/search", "t").send().await.unwrap().granted,
        1
    );

    // The key follows: applied without a signal.
    replace(&second.server_key(), &key);
    assert!(until_presented(
        server.grpc_port,
        &second.server_cert(),
        Duration::from_secs(5)
    ));
    assert_eq!(
        metric_with(&second, &server, "charon_tls_reload_failing"),
        Some(0.0)
    );
}

/// `metric` over a connection that trusts `pki`.
fn metric_with(pki: &TestPki, server: &CharonProcess, series: &str) -> Option<f64> {
    let (_, text) = https_get(&pki.client_config(false), server.http_port, "/metrics")?;
    crate::support::metric_in(&text, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_feed_over_https_with_a_ca_and_a_client_certificate() {
    let pki = TestPki::new();
    let ca = pki.ca().display().to_string();
    let (cert, key) = (
        pki.server_cert().display().to_string(),
        pki.server_key().display().to_string(),
    );
    let service = CharonProcess::start_probed(
        bin(),
        &[
            "--config-api-only",
            "--db",
            "{dir}/config.db",
            "--config-token",
            "write:tls-token",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ],
        "/healthz",
        pki.probe(true),
    );
    let url = format!("https://127.0.0.1:{}", service.http_port);
    let limits = service.dir().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let apply = |with_cert: bool| {
        let mut cmd = charon();
        cmd.args([
            "config",
            "apply",
            "--yes",
            "--url",
            &url,
            "--token",
            "tls-token",
        ])
        .arg(&limits)
        .arg("--ca")
        .arg(pki.ca());
        if with_cert {
            cmd.arg("--cert")
                .arg(pki.client_cert())
                .arg("--key")
                .arg(pki.client_key());
        }
        cmd.output().unwrap()
    };
    assert!(!apply(false).status.success(), "no client certificate");
    let out = apply(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let client_cert = pki.client_cert().display().to_string();
    let client_key = pki.client_key().display().to_string();
    let limiter = CharonProcess::start_args(
        bin(),
        &[
            "--config-url",
            &url,
            "--config-ca",
            &ca,
            "--config-cert",
            &client_cert,
            "--config-key",
            &client_key,
        ],
        "/readyz",
    );
    let c = client(&limiter, None);
    let grant = c.request("api/search", "t").copies(7).send().await.unwrap();
    assert_eq!(grant.granted, 7, "decided by the limits applied over https");

    // Without the CA the service's certificate is not trusted: never
    // ready, and /readyz says why.
    let untrusting = CharonProcess::start_args(
        bin(),
        &[
            "--config-url",
            &url,
            "--config-cert",
            &client_cert,
            "--config-key",
            &client_key,
        ],
        "/healthz",
    );
    let (code, ready) = untrusting.http_get("/readyz").unwrap();
    assert_eq!(code, 503, "{ready}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            untrusting
                .http_get("/readyz")
                .is_some_and(|(_, r)| r.contains("certificate"))
        }),
        "{}",
        untrusting.http_get("/readyz").unwrap().1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_service_follows_itself_under_mutual_tls() {
    let pki = TestPki::new();
    // A certificate that names 127.0.0.1 is not needed by the loopback
    // feed; this one does, so the test's clients can check it.
    let ca = pki.ca().display().to_string();
    let server = CharonProcess::start_probed_with(
        bin(),
        &[
            "--db",
            "{dir}/charon.db",
            "--config-token",
            "write:tls-token",
            "--tls-cert",
            "{dir}/tls.pem",
            "--tls-key",
            "{dir}/tls.key",
            "--tls-client-ca",
            &ca,
        ],
        "/readyz",
        pki.probe(true),
        |dir: &Path| {
            std::fs::copy(pki.server_cert(), dir.join("tls.pem")).unwrap();
            std::fs::copy(pki.server_key(), dir.join("tls.key")).unwrap();
        },
    );
    let limits = server.dir().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    // `charon config apply` over mutual TLS to this server's HTTP listener.
    let apply = || {
        let out = charon()
            .args(["config", "apply", "--yes", "--token", "tls-token", "--url"])
            .arg(format!("https://127.0.0.1:{}", server.http_port))
            .arg(&limits)
            .args(["--ca", &ca])
            .arg("--cert")
            .arg(pki.client_cert())
            .arg("--key")
            .arg(pki.client_key())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    apply();
    // Answered once the limiter held it: the loopback feed works under
    // mutual TLS.
    let c = client(&server, trusting(&pki, true));
    assert_eq!(
        c.request("api/search", "t")
            .copies(9)
            .send()
            .await
            .unwrap()
            .granted,
        9
    );
    let (_, ready) = server.http_get("/readyz").unwrap();
    assert!(ready.contains("version 1"), "{ready}");

    // After a reload to a certificate of the same CA, the feed still
    // follows (it trusts whatever this server serves).
    let (next_cert, next_key) = pki.issue_server("next", "charon next certificate");
    replace(&next_key, &server.dir().join("tls.key"));
    replace(&next_cert, &server.dir().join("tls.pem"));
    server.signal("HUP");
    assert!(until_presented(
        server.http_port,
        &next_cert,
        Duration::from_secs(5)
    ));
    std::fs::write(&limits, LIMITS.replace("limit: 100", "limit: 50")).unwrap();
    apply();
    assert!(wait_until(Duration::from_secs(5), || {
        server
            .http_get("/readyz")
            .is_some_and(|(_, r)| r.contains("version 2"))
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_asks_its_lease_parent_over_mutual_tls() {
    use charon_proto::v1;
    const TREE: &str = r#"
resources:
  - { name: db/qps, kind: lease, capacity: 100, algorithm: fair_share,
      lease_length: 2s, refresh_interval: 200ms, learning_mode: 0s }
"#;
    let pki = TestPki::new();
    let ca = pki.ca().display().to_string();
    let root = CharonProcess::start_probed_with(
        bin(),
        &[
            "--config",
            "{dir}/limits.yaml",
            "--tls-cert",
            &pki.server_cert().display().to_string(),
            "--tls-key",
            &pki.server_key().display().to_string(),
            "--tls-client-ca",
            &ca,
        ],
        "/readyz",
        pki.probe(true),
        |dir: &Path| std::fs::write(dir.join("limits.yaml"), TREE).unwrap(),
    );
    let parent = format!("https://127.0.0.1:{}", root.grpc_port);
    let leaf = CharonProcess::start(
        bin(),
        TREE,
        &[
            "--lease-parent",
            &parent,
            "--lease-parent-ca",
            &ca,
            "--lease-parent-cert",
            &pki.client_cert().display().to_string(),
            "--lease-parent-key",
            &pki.client_key().display().to_string(),
        ],
    );
    let mut c = v1::capacity_client::CapacityClient::connect(leaf.endpoint())
        .await
        .unwrap();
    let ask = || v1::GetCapacityRequest {
        client_id: "app".into(),
        resources: vec![v1::ResourceWant {
            resource: "db/qps".into(),
            wants: 30.0,
            has: 0.0,
            subclients: 0,
        }],
    };
    // The leaf shares what the root grants: nothing until it asked, then
    // the 30 wanted.
    let mut granted = 0.0;
    for _ in 0..50 {
        let reply = c.get_capacity(ask()).await.unwrap().into_inner();
        granted = reply.leases[0].capacity;
        if granted == 30.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(granted, 30.0, "{}", leaf.log());
    let (_, leases) = root.http_get("/v1/leases").unwrap();
    assert!(leases.contains("\"leased\":30"), "{leases}");
}

/// Issue 16: under mutual TLS, a call without a bearer token is made by the
/// principal whose `certificate_name` is its client certificate's common
/// name (`--api-tokens`): it may use its namespaces only; a certificate
/// that names nobody is UNAUTHENTICATED; a bearer token still wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_a_principal_of_the_limiting_api() {
    let pki = TestPki::new();
    let (nobody_cert, nobody_key) = pki.issue_client("nobody", "nobody in the tokens file");
    let tokens = tempfile::tempdir().unwrap();
    let tokens_file = tokens.path().join("api-tokens.yaml");
    std::fs::write(
        &tokens_file,
        "- { name: search, certificate_name: charon test client, namespaces: [api] }\n\
         - { name: ops, secret: ops-secret, namespaces: [\"*\"] }\n",
    )
    .unwrap();
    let ca = pki.ca().display().to_string();
    let tokens_arg = tokens_file.display().to_string();
    let server = serve_tls(
        &pki,
        &["--tls-client-ca", &ca, "--api-tokens", &tokens_arg],
        true,
    );

    // "charon test client" is `search`: api/ yes, sandbox/ no.
    let search = client(&server, trusting(&pki, true));
    assert_eq!(
        search
            .request("api/search", "t")
            .send()
            .await
            .unwrap()
            .granted,
        1
    );
    let e = search.reserve("sandbox/vm", "t").send().await.unwrap_err();
    assert!(e.is_client(), "{e}");
    assert!(e.to_string().contains("search"), "{e}");

    // A certificate of the right CA whose name no principal carries.
    let nobody = client(
        &server,
        Some(
            ClientTls::from_files(Some(&pki.ca()), Some(&nobody_cert), Some(&nobody_key)).unwrap(),
        ),
    );
    let e = nobody.request("api/search", "t").send().await.unwrap_err();
    assert!(e.is_client(), "{e}");
    assert!(e.to_string().contains("token"), "{e}");

    // The same certificate with `ops`' bearer token: the token wins.
    let mut options = ClientOptions::new(format!("https://127.0.0.1:{}", server.grpc_port));
    options.fail_open = false;
    options.request_timeout = Duration::from_secs(3);
    options.tls = trusting(&pki, true);
    let ops = Client::connect(options.with_token("ops-secret")).unwrap();
    let hold = ops.reserve("sandbox/vm", "t").send().await.unwrap();
    assert_eq!(hold.copies(), 1);
}

/// `charon serve` with `cert` and `key`: its exit status and stderr, once
/// it exits (within 20 s, else it is killed and `None`).
fn serve_exit(cert: &Path, key: &Path) -> Option<(Option<i32>, String)> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    let mut child = charon()
        .current_dir(dir.path())
        .args(["serve", "--config", "limits.yaml"])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_until(Duration::from_secs(20), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
        return None;
    }
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A certificate that has expired, or is not valid yet, stops `charon
/// serve` at start (exit 1), saying which file, since or until when, and
/// what to do: served, it would fail every client's handshake.
#[test]
fn a_certificate_outside_its_validity_is_refused_at_start() {
    let pki = TestPki::new();
    let now = TestPki::now();
    let expired = pki.issue_server_valid("expired", "charon expired", now - 30 * 86400, now - 7200);
    let future = pki.issue_server_valid("future", "charon future", now + 7200, now + 30 * 86400);
    for ((cert, key), says) in [(&expired, "expired at"), (&future, "not valid yet")] {
        let (code, stderr) = serve_exit(cert, key).expect("charon serve exits");
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(stderr.contains(&cert.display().to_string()), "{stderr}");
    }
    let (_, stderr) = serve_exit(&expired.0, &expired.1).unwrap();
    assert!(
        stderr.contains("CN=charon expired expired at") && stderr.contains("2h ago"),
        "{stderr}"
    );
}

/// An expired certificate renamed over the one in force is refused on
/// reload: the previous one is still served, the refusal is logged,
/// counted and shown by `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused_on_reload_and_the_previous_one_kept() {
    let pki = TestPki::new();
    let server = serve_tls(&pki, &[], false);
    let before = TestPki::der(&pki.server_cert());
    let now = TestPki::now();
    let (expired, expired_key) =
        pki.issue_server_valid("expired", "charon expired", now - 30 * 86400, now - 60);
    replace(&expired_key, &server.dir().join("tls.key"));
    replace(&expired, &server.dir().join("tls.pem"));
    server.signal("HUP");
    assert!(
        wait_until(Duration::from_secs(10), || server
            .log()
            .contains("CN=charon expired expired at")),
        "{}",
        server.log()
    );
    assert!(
        server
            .log()
            .contains("the previous certificate is still served")
    );
    assert_eq!(
        presented_certificate(server.grpc_port),
        Some(before.clone())
    );
    assert_eq!(presented_certificate(server.http_port), Some(before));
    assert!(metric(&server, "charon_tls_reloads_total{result=\"refused\"}") >= Some(1.0));
    assert_eq!(metric(&server, "charon_tls_reload_failing"), Some(1.0));
    let (code, ready) = server.http_get("/readyz").unwrap();
    assert_eq!(code, 200, "still serving the previous one: {ready}");
    assert!(
        ready.contains("tls: the files were refused") && ready.contains("expired at"),
        "{ready}"
    );
    // Still answering, under the previous certificate.
    let c = client(&server, trusting(&pki, false));
    assert_eq!(
        c.request("api/search", "t").send().await.unwrap().granted,
        1
    );
}

/// The chain in force's expiry is on `/metrics` (Unix seconds, for an
/// alert weeks ahead), and `/readyz` names a certificate in its last day
/// (still 200: the whole fleet's certificates expire together; taking
/// servers out of rotation would not help).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_expiry_is_exported_and_readyz_names_its_last_day() {
    let pki = TestPki::new();
    let now = TestPki::now();
    let until = now + 3 * 3600;
    let (cert, key) = pki.issue_server_valid("soon", "charon soon", now - 3600, until);
    let server = serve_tls_with(&pki, (&cert, &key), &[], false);
    assert_eq!(
        metric(&server, "charon_tls_certificate_expiry_seconds"),
        Some(until as f64)
    );
    let (code, ready) = server.http_get("/readyz").unwrap();
    assert_eq!(code, 200, "{ready}");
    assert!(
        ready.contains("tls: the certificate CN=charon soon") && ready.contains("expires at"),
        "{ready}"
    );
    // A certificate far from its end is not named.
    let calm = serve_tls(&pki, &[], false);
    let (_, ready) = calm.http_get("/readyz").unwrap();
    assert!(!ready.contains("expires"), "{ready}");
    assert!(
        metric(&calm, "charon_tls_certificate_expiry_seconds") > Some((now + 300 * 86400) as f64)
    );
}
