//! Issue 16: the audit trail through the `charon` binary against a real
//! `charon serve` with its embedded configuration service, on SQLite and
//! on a private PostgreSQL: named tokens are recorded with each commit,
//! `charon config log` shows them with the diffs, and `charon config
//! rollback --to V` restores version V as a new commit that the limiter
//! then enforces. A read token reads the log but cannot roll back.

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::{bin, charon, strict_client, within};
use charon_client::Client;
use charon_testkit::CharonProcess;

const ALICE: &str = "alice-audit-secret";
const BOB: &str = "bob-audit-secret";
const VIEWER: &str = "viewer-audit-secret";

fn limits(limit: u64) -> String {
    format!(
        "resources:\n  - name: api\n    kind: rate\n    tiers: [ {{ limit: {limit}, window: 10s }} ]\n"
    )
}

/// Runs `charon ARGS` against `server`'s configuration API with `stdin`.
fn run(server: &CharonProcess, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = charon()
        .args(args)
        .env_remove("CHARON_CONFIG_TOKEN")
        .env("CHARON_CONFIG_URL", server.http_url())
        .current_dir(server.dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn charon");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("charon exits");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

async fn tier_limit(c: &Client) -> Option<u64> {
    c.request("api", "probe")
        .send()
        .await
        .ok()
        .and_then(|g| g.reply)
        .and_then(|r| r.tier_limit)
}

/// The section of `charon config log`'s output about `version`.
fn section(log: &str, version: u64) -> &str {
    let head = format!("version {version} ");
    let start = log
        .find(&head)
        .unwrap_or_else(|| panic!("no {head:?} in {log}"));
    let rest = &log[start..];
    let end = rest[1..].find("\nversion ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

async fn log_and_rollback(db: &str) {
    let tokens = format!("write:alice={ALICE},write:bob={BOB},read:viewer={VIEWER}");
    let server =
        CharonProcess::start_args(bin(), &["--db", db, "--config-token", &tokens], "/healthz");
    let first = server.dir().join("first.yaml");
    let second = server.dir().join("second.yaml");
    std::fs::write(&first, limits(3)).expect("write");
    std::fs::write(&second, limits(7)).expect("write");
    let path = |p: &std::path::Path| p.display().to_string();

    let (ok, _, err) = run(
        &server,
        &["config", "apply", &path(&first), "--yes", "--token", ALICE],
        "",
    );
    assert!(ok, "{err}");
    let (ok, _, err) = run(
        &server,
        &["config", "apply", &path(&second), "--yes", "--token", BOB],
        "",
    );
    assert!(ok && err.contains("now at version 2"), "{err}");
    let c = strict_client(&server);
    let seven = within(Duration::from_secs(5), async || {
        tier_limit(&c).await == Some(7)
    })
    .await;
    assert!(seven.is_some(), "the limiter enforces version 2");

    // The log, with a read token: both names, both diffs, newest first.
    let (ok, log, err) = run(&server, &["config", "log", "--token", VIEWER], "");
    assert!(ok, "{err}");
    assert!(log.find("version 2 ") < log.find("version 1 "), "{log}");
    let v1 = section(&log, 1);
    let v2 = section(&log, 2);
    assert!(v1.contains("token alice"), "{v1}");
    assert!(v2.contains("token bob"), "{v2}");
    assert!(
        v1.contains("+++ b/config.yaml") && v1.contains("+- name: api"),
        "{v1}"
    );
    let changed = |s: &str, sign: char, text: &str| {
        s.lines()
            .any(|l| l.trim_start().starts_with(sign) && l.contains(text))
    };
    assert!(
        changed(v2, '-', "limit: 3") && changed(v2, '+', "limit: 7"),
        "{v2}"
    );
    for secret in [ALICE, BOB, VIEWER] {
        assert!(!log.contains(secret), "{log}");
    }

    // A read token may read the log but not roll back.
    let (ok, _, err) = run(
        &server,
        &[
            "config", "rollback", "--to", "1", "--yes", "--token", VIEWER,
        ],
        "",
    );
    assert!(!ok, "a read token rolled back: {err}");
    assert!(
        err.contains("may read the configuration but not change it"),
        "{err}"
    );
    // A version that was never committed: a clear client error.
    let (ok, _, err) = run(
        &server,
        &[
            "config", "rollback", "--to", "99", "--yes", "--token", ALICE,
        ],
        "",
    );
    assert!(
        !ok && err.contains("version 99 is not in the audit trail"),
        "{err}"
    );
    // Declined at the prompt: nothing happens.
    let (ok, shown, err) = run(
        &server,
        &["config", "rollback", "--to", "1", "--token", ALICE],
        "n\n",
    );
    assert!(!ok && err.contains("Nothing was applied"), "{err}");
    assert!(shown.contains("~ resource api"), "{shown}");

    // Confirmed: the difference first, then a new commit, which the
    // limiter follows.
    let (ok, shown, err) = run(
        &server,
        &["config", "rollback", "--to", "1", "--token", ALICE],
        "y\n",
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("Rolling back to version 1") && err.contains("token alice"),
        "{err}"
    );
    assert!(shown.contains("1 change(s) against version 2"), "{shown}");
    assert!(
        changed(&shown, '-', "limit: 7") && changed(&shown, '+', "limit: 3"),
        "{shown}"
    );
    assert!(err.contains("now at version 3"), "{err}");
    let three = within(Duration::from_secs(5), async || {
        tier_limit(&c).await == Some(3)
    })
    .await;
    assert!(
        three.is_some(),
        "the limiter enforces the rolled-back limit"
    );
    let mut granted = 0;
    for _ in 0..5 {
        if c.request("api", "probe-2")
            .send()
            .await
            .is_ok_and(|g| g.granted > 0)
        {
            granted += 1;
        }
    }
    assert_eq!(
        granted, 3,
        "three requests in the 10 s window, as version 1 says"
    );

    let (ok, log, err) = run(
        &server,
        &["config", "log", "--limit", "1", "--token", VIEWER],
        "",
    );
    assert!(ok, "{err}");
    let v3 = section(&log, 3);
    assert!(
        v3.contains("token alice") && changed(v3, '+', "limit: 3"),
        "{v3}"
    );
    assert!(!log.contains("version 2 "), "{log}");
    assert!(log.contains("(older commits: before version 3"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_and_rollback_on_sqlite() {
    log_and_rollback("{dir}/charon.db").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_and_rollback_on_postgres() {
    let pg = charon_testkit::Postgres::start();
    let url = pg.create_database("audit_cli");
    log_and_rollback(&url).await;
}

#[test]
fn a_rotated_tokens_file_applies_without_a_restart_and_an_empty_one_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("config-tokens");
    std::fs::write(
        &file,
        format!("# the deploy pipeline\nwrite:alice={ALICE}\n"),
    )
    .expect("write");
    let file_arg = file.display().to_string();
    let server = CharonProcess::start_args(
        bin(),
        &["--db", "{dir}/charon.db", "--config-tokens-file", &file_arg],
        "/healthz",
    );
    let limits_file = server.dir().join("limits.yaml");
    let apply = |limit: u64, token: &str| {
        std::fs::write(&limits_file, limits(limit)).expect("write");
        let path = limits_file.display().to_string();
        run(
            &server,
            &["config", "apply", &path, "--yes", "--token", token],
            "",
        )
    };
    let (ok, _, err) = apply(3, ALICE);
    assert!(ok, "{err}");

    // Rotated: alice out, bob in, with no signal.
    std::fs::write(&file, format!("write:bob={BOB}\n")).expect("write");
    let rotated = charon_testkit::wait_until(Duration::from_secs(5), || {
        server.log().contains("configuration API tokens reloaded")
    });
    assert!(rotated, "{}", server.log());
    let (ok, _, err) = apply(4, ALICE);
    assert!(!ok, "alice's token was rotated out: {err}");
    let (ok, _, err) = apply(5, BOB);
    assert!(ok && err.contains("now at version 2"), "{err}");

    // Emptied (a truncated write): refused, bob's token still works.
    std::fs::write(&file, "").expect("write");
    let refused = charon_testkit::wait_until(Duration::from_secs(5), || {
        server.log().contains("configuration API tokens refused")
    });
    assert!(refused, "{}", server.log());
    let (ok, _, err) = apply(6, BOB);
    assert!(ok && err.contains("now at version 3"), "{err}");
    let (ok, log, err) = run(&server, &["config", "log", "--token", BOB], "");
    assert!(ok, "{err}");
    assert!(section(&log, 2).contains("token bob"), "{log}");
    assert!(section(&log, 1).contains("token alice"), "{log}");

    // At start, a file that lists no tokens is an error, not a service
    // nobody may write to.
    let out = charon()
        .args([
            "serve",
            "--db",
            &dir.path().join("other.db").display().to_string(),
        ])
        .args(["--config-tokens-file", &file_arg])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--config-tokens-file") && err.contains("no tokens"),
        "{err}"
    );
}
