//! Every mistake a user can make, against real `charon serve` processes,
//! through the Rust client (failing open and not) and the CLI: the class
//! and kind of the error, the message, and whether a client that fails
//! open degraded. Only the server class may degrade; a client error is
//! said at once, whatever `fail_open` says. (The Python client's twin:
//! `clients/python/tests/test_security.py`.)
//!
//! With `CHARON_MISTAKES_TABLE=FILE` the messages are written there as a
//! Markdown table (docs/errors.md shows it).

use std::time::Duration;

use charon_client::{Class, Client, ClientOptions, ClientTls, Error, ErrorKind, Source};
use charon_testkit::{CharonProcess, TestPki};
use serde_json::Value;

use super::{LIMITS, charon, serve_tls, serve_tls_with, trusting};

/// One mistake: where the client goes, how, and what it must be told.
struct Mistake {
    name: &'static str,
    url: String,
    tls: Option<ClientTls>,
    token: Option<&'static str>,
    resource: &'static str,
    /// `None`: the right settings, served.
    expect: Option<(Class, ErrorKind)>,
}

fn options(m: &Mistake, fail_open: bool) -> ClientOptions {
    let mut o = ClientOptions::new(m.url.clone());
    o.fail_open = fail_open;
    o.connect_timeout = Duration::from_secs(3);
    o.request_timeout = Duration::from_secs(3);
    o.tls.clone_from(&m.tls);
    if let Some(t) = m.token {
        o = o.with_token(t);
    }
    o
}

/// The CLI's answer: its exit status and its JSON line.
fn cli(m: &Mistake, files: &[(&str, std::path::PathBuf)]) -> (Option<i32>, Value) {
    let mut cmd = charon();
    cmd.args(["client", "request", m.resource, "d", "--server", &m.url]);
    for (flag, path) in files {
        cmd.arg(flag).arg(path);
    }
    if let Some(t) = m.token {
        cmd.args(["--token", t]);
    }
    let out = cmd.env_remove("CHARON_TOKEN").output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code(),
        serde_json::from_str(line.trim()).unwrap_or(Value::String(line)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mistake_has_its_class_and_only_server_errors_degrade() {
    let pki = TestPki::new();
    let other = TestPki::named("another CA");
    let now = TestPki::now();
    // Valid at start, lapsed a few seconds later: served on after it does.
    let expiring = pki.issue_server_valid("expiring", "charon expiring", now - 3600, now + 4);
    let expiring_server = serve_tls_with(&pki, (&expiring.0, &expiring.1), &[], false);
    let plain = CharonProcess::start(super::bin(), LIMITS, &[]);
    let tls = serve_tls(&pki, &[], false);
    let ca = pki.ca().display().to_string();
    let mtls = serve_tls(&pki, &["--tls-client-ca", &ca], true);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "- { name: app, secret: s3cret-app, namespaces: [api] }\n",
    )
    .unwrap();
    let token_server = CharonProcess::start(
        super::bin(),
        LIMITS,
        &["--api-tokens", tokens.to_str().unwrap()],
    );
    let mut down = CharonProcess::start(super::bin(), LIMITS, &[]);
    let down_url = down.endpoint();
    down.kill();
    let wrong_port = format!("http://127.0.0.1:{}", charon_testkit::free_port());

    let https = |p: &CharonProcess| format!("https://127.0.0.1:{}", p.grpc_port);
    let http = |p: &CharonProcess| format!("http://127.0.0.1:{}", p.grpc_port);
    let mut strangers = ClientTls::from_files(
        Some(&pki.ca()),
        Some(&other.client_cert()),
        Some(&other.client_key()),
    )
    .unwrap();
    strangers.server_name = None;
    let m = |name, url: String, tls: Option<ClientTls>, token, resource, expect| Mistake {
        name,
        url,
        tls,
        token,
        resource,
        expect,
    };
    use Class::{Client as C, Server as S};
    let mistakes = [
        m(
            "wrong port",
            wrong_port,
            None,
            None,
            "api/search",
            Some((S, ErrorKind::Unreachable)),
        ),
        m(
            "HTTP port",
            format!("http://127.0.0.1:{}", plain.http_port),
            None,
            None,
            "api/search",
            Some((C, ErrorKind::WrongProtocol)),
        ),
        m(
            "no token",
            token_server.endpoint(),
            None,
            None,
            "api/search",
            Some((C, ErrorKind::Unauthenticated)),
        ),
        m(
            "wrong token",
            token_server.endpoint(),
            None,
            Some("nope"),
            "api/search",
            Some((C, ErrorKind::Unauthenticated)),
        ),
        m(
            "token not allowed the namespace",
            token_server.endpoint(),
            None,
            Some("s3cret-app"),
            "sandbox/vm",
            Some((C, ErrorKind::PermissionDenied)),
        ),
        m(
            "missing client certificate",
            https(&mtls),
            trusting(&pki, false),
            None,
            "api/search",
            Some((C, ErrorKind::Tls)),
        ),
        m(
            "client certificate of another CA",
            https(&mtls),
            Some(strangers),
            None,
            "api/search",
            Some((C, ErrorKind::Tls)),
        ),
        m(
            "wrong CA",
            https(&tls),
            trusting(&other, false),
            None,
            "api/search",
            Some((C, ErrorKind::Tls)),
        ),
        m(
            "expired certificate",
            https(&expiring_server),
            trusting(&pki, false),
            None,
            "api/search",
            Some((C, ErrorKind::Tls)),
        ),
        m(
            "plain text to TLS",
            http(&tls),
            None,
            None,
            "api/search",
            Some((C, ErrorKind::WrongProtocol)),
        ),
        m(
            "TLS to plain text",
            https(&plain),
            trusting(&pki, false),
            None,
            "api/search",
            Some((C, ErrorKind::WrongProtocol)),
        ),
        m(
            "unknown resource",
            plain.endpoint(),
            None,
            None,
            "no/such",
            Some((C, ErrorKind::NotFound)),
        ),
        m(
            "server down",
            down_url,
            None,
            None,
            "api/search",
            Some((S, ErrorKind::Unreachable)),
        ),
        m(
            "(token given)",
            token_server.endpoint(),
            None,
            Some("s3cret-app"),
            "api/search",
            None,
        ),
        m(
            "(TLS with its CA)",
            https(&tls),
            trusting(&pki, false),
            None,
            "api/search",
            None,
        ),
        m(
            "(mutual TLS)",
            https(&mtls),
            trusting(&pki, true),
            None,
            "api/search",
            None,
        ),
    ];
    // The CLI's flags for each mistake's TLS.
    let cli_files = |name: &str| -> Vec<(&'static str, std::path::PathBuf)> {
        match name {
            "missing client certificate"
            | "expired certificate"
            | "TLS to plain text"
            | "(TLS with its CA)" => vec![("--ca", pki.ca())],
            "client certificate of another CA" => vec![
                ("--ca", pki.ca()),
                ("--cert", other.client_cert()),
                ("--key", other.client_key()),
            ],
            "wrong CA" => vec![("--ca", other.ca())],
            "(mutual TLS)" => vec![
                ("--ca", pki.ca()),
                ("--cert", pki.client_cert()),
                ("--key", pki.client_key()),
            ],
            _ => Vec::new(),
        }
    };
    // Let the expiring certificate lapse (the event waited for is the
    // wall clock passing its notAfter).
    while TestPki::now() <= now + 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut rows = Vec::new();
    for mistake in &mistakes {
        let what = mistake.name;
        let lenient = Client::connect(options(mistake, true)).unwrap();
        let strict = Client::connect(options(mistake, false)).unwrap();
        let answer = lenient.request(mistake.resource, "d").send().await;
        let refused = strict.request(mistake.resource, "d").send().await;
        let (code, json) = cli(mistake, &cli_files(what));
        let Some((class, kind)) = mistake.expect else {
            assert_eq!(
                answer.map(|g| g.source).ok(),
                Some(Source::Server),
                "{what}"
            );
            assert!(refused.is_ok(), "{what}: {refused:?}");
            assert_eq!(code, Some(0), "{what}: {json}");
            continue;
        };
        let e: Error = refused.expect_err(what);
        assert_eq!((e.class(), e.kind()), (class, kind), "{what}: {e}");
        assert!(e.address().is_some(), "{what}: {e}");
        match class {
            Class::Client => {
                let e = answer.expect_err(what);
                assert!(e.is_client(), "{what}: {e}");
                assert_eq!(lenient.stats().degraded_grants, 0, "{what}: never degraded");
            }
            Class::Server => {
                let g = answer.expect("degraded");
                assert_eq!(g.source, Source::Degraded, "{what}");
                assert_eq!(lenient.stats().degraded_grants, 1, "{what}");
            }
        }
        // The CLI: the same class and kind, exit 1 for a client error, 3
        // for a server error.
        assert_eq!(json["error"], class.name(), "{what}: {json}");
        assert_eq!(json["kind"], kind.name(), "{what}: {json}");
        let exit = if class == Class::Client { 1 } else { 3 };
        assert_eq!(code, Some(exit), "{what}: {json}");
        rows.push(format!(
            "| {what} | {} | {} | {} | {} |",
            e.to_string().replace('|', "\\|"),
            json["message"].as_str().unwrap_or("").replace('|', "\\|"),
            class.name(),
            if class == Class::Server { "yes" } else { "no" }
        ));
    }
    if let Ok(out) = std::env::var("CHARON_MISTAKES_TABLE") {
        let mut table = String::from(
            "| mistake | Rust client | CLI (`charon client request`) | class | degraded (fail_open) |\n\
             | --- | --- | --- | --- | --- |\n",
        );
        for r in rows {
            table.push_str(&r);
            table.push('\n');
        }
        std::fs::write(out, table).unwrap();
    }
}
