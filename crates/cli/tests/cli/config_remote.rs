//! `charon config apply` and `charon config export` against a running
//! configuration service (in this process, on a free port; the `charon`
//! binary is the one cargo built).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::charon;
use charon_config_client::ConfigClient;
use charon_config_service::{AppState, Tokens};

const TOKEN: &str = "cli-test-token";

const FILE: &str = "\
namespaces:
  billing: { allow_unconfigured: true, ignore_configured: false }
resources:
  - name: api/search
    kind: rate
    hard_limit: 100
    tiers:
      - { limit: 5,  window: 1s }
      - { limit: 25, window: 1s, active: 5s, cooldown: 15s }
  - name: sandbox/vm
    kind: copy
    domain_limit: 4
    groups:
      - { name: probation, limit: 5, domains: [new-1] }
";

/// A configuration service on a free port, stopped when dropped.
struct Service {
    runtime: tokio::runtime::Runtime,
    url: String,
    dir: tempfile::TempDir,
}

impl Service {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("config.db").display().to_string();
        let url = runtime.block_on(async {
            let state = AppState::open(&db, Tokens::new().writer(TOKEN))
                .await
                .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(charon_config_service::serve(
                listener,
                state,
                std::future::pending(),
            ));
            url
        });
        Self { runtime, url, dir }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn client(&self) -> ConfigClient {
        ConfigClient::new(&self.url, Some(TOKEN.to_owned()), Duration::from_secs(5)).unwrap()
    }

    fn version(&self) -> u64 {
        self.runtime
            .block_on(self.client().changes(0, None))
            .unwrap()
            .version
    }

    fn run(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = charon()
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("CHARON_CONFIG_TOKEN")
            .env("CHARON_CONFIG_URL", &self.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn apply(&self, file: &Path, extra: &[&str], stdin: &str) -> (bool, String, String) {
        let mut args = vec!["config", "apply", file.to_str().unwrap(), "--token", TOKEN];
        args.extend_from_slice(extra);
        let out = self.run(&args, stdin);
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    fn export(&self) -> String {
        let out = self.run(&["config", "export", "--url", &self.url], "");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

#[test]
fn apply_shows_the_difference_and_applies_it_as_one_commit() {
    let service = Service::start();
    let file = service.file("limits.yaml", FILE);

    let (ok, stdout, stderr) = service.apply(&file, &["--yes"], "");
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("3 change(s) against version 0: 3 added"),
        "{stdout}"
    );
    assert!(stdout.contains("+ namespace billing"), "{stdout}");
    assert!(stdout.contains("+ resource api/search"), "{stdout}");
    assert!(stdout.contains("+ kind: copy"), "{stdout}");
    assert!(stderr.contains("now at version 1"), "{stderr}");
    assert_eq!(service.version(), 1);

    // Export prints the file, normalized.
    let (expected, _) = charon_core::config::Config::from_yaml(FILE).unwrap();
    assert_eq!(service.export(), expected.to_yaml());

    // A change: only the difference is shown.
    let lowered = service.file(
        "lowered.yaml",
        &FILE.replace("{ limit: 5,  window", "{ limit: 3,  window"),
    );
    let (ok, stdout, _) = service.apply(&lowered, &["--dry-run"], "");
    assert!(ok);
    assert!(
        stdout.contains("1 change(s) against version 1: 0 added, 1 changed"),
        "{stdout}"
    );
    assert!(stdout.contains("~ resource api/search"), "{stdout}");
    assert!(stdout.contains("    - - limit: 5\n"), "{stdout}");
    assert!(stdout.contains("    + - limit: 3\n"), "{stdout}");
    assert!(!stdout.contains("sandbox/vm"), "{stdout}");
    assert_eq!(service.version(), 1, "a dry run changes nothing");

    // Asked, and declined.
    let (ok, _, stderr) = service.apply(&lowered, &[], "n\n");
    assert!(!ok);
    assert!(stderr.contains("Apply these changes"), "{stderr}");
    assert!(stderr.contains("Nothing was applied"), "{stderr}");
    assert_eq!(service.version(), 1);
    // Asked, and accepted.
    let (ok, _, stderr) = service.apply(&lowered, &[], "y\n");
    assert!(ok, "{stderr}");
    assert_eq!(service.version(), 2);
    // Nothing left to do.
    let (ok, stdout, stderr) = service.apply(&lowered, &["--yes"], "");
    assert!(ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("No changes"), "{stderr}");
    assert_eq!(service.version(), 2);
    assert!(service.export().contains("limit: 3"));

    // Normalization is shown with paths in the file.
    let trimmed = service.file(
        "trimmed.yaml",
        &FILE.replace("active: 5s", "active: 5500ms"),
    );
    let (ok, _, stderr) = service.apply(&trimmed, &["--yes"], "");
    assert!(ok);
    assert!(
        stderr.contains("trimmed.yaml: normalized: resources[0].tiers[1].active"),
        "{stderr}"
    );

    // `config check` still works beside them.
    let out = service.run(&["config", "check", file.to_str().unwrap()], "");
    assert!(out.status.success());
}

#[test]
fn apply_refuses_what_changed_after_the_difference_was_shown() {
    let service = Service::start();
    let file = service.file("limits.yaml", FILE);
    let mut child = charon()
        .args(["config", "apply", file.to_str().unwrap()])
        .env("CHARON_CONFIG_URL", &service.url)
        .env("CHARON_CONFIG_TOKEN", TOKEN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the difference is shown (the prompt follows it).
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("change(s) against version 0") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no difference shown"
        );
    }
    // Another operator commits meanwhile.
    service
        .runtime
        .block_on(
            service
                .client()
                .import_yaml("resources: []\nnamespaces: {x: {}}\n", false, None),
        )
        .unwrap();
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(stderr.contains("changed on the service"), "{stderr}");
    assert!(stderr.contains("nothing was applied"), "{stderr}");
    assert_eq!(service.version(), 1, "only the other operator's commit");
}

#[test]
fn apply_reports_every_problem_and_refusals() {
    let service = Service::start();
    let bad = service.file(
        "bad.yaml",
        "resources:\n  - {name: a, kind: rate, tiers: [{limit: -1, window: 1x}]}\n",
    );
    let (ok, stdout, stderr) = service.apply(&bad, &["--yes"], "");
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("bad.yaml: resources[0].tiers[0].limit:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml: resources[0].tiers[0].window:"),
        "{stderr}"
    );

    // Without a token: refused before any difference is shown, saying
    // where the embedded service's token would be (none in this directory).
    let file = service.file("limits.yaml", FILE);
    let out = service.run(&["config", "apply", file.to_str().unwrap(), "--yes"], "");
    assert_eq!(out.status.code(), Some(1), "a client error");
    assert!(out.stdout.is_empty(), "no difference before the refusal");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("answered 401"), "{stderr}");
    assert!(stderr.contains("--token"), "{stderr}");
    let looked_for = service.dir.path().join("charon.db.token");
    assert!(
        stderr.contains(&format!("{} does not exist", looked_for.display())),
        "{stderr}"
    );
    assert_eq!(service.version(), 0);
    // A token file of another service in this directory: used, refused,
    // named.
    service.file("charon.db.token", "not-this-service\n");
    let out = service.run(&["config", "rollback", "--to", "1", "--yes"], "");
    assert_eq!(out.status.code(), Some(1));
    let out = service.run(&["config", "apply", file.to_str().unwrap(), "--yes"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no difference before the refusal");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(&format!(
            "the token read from {} was refused",
            looked_for.display()
        )),
        "{stderr}"
    );
    // A wrong token given: the same, said of the flag.
    let out = service.run(
        &[
            "config",
            "apply",
            file.to_str().unwrap(),
            "--yes",
            "--token",
            "wrong",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no difference before the refusal");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the token given with --token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A dry run only reads: its difference needs no write token.
    let out = service.run(
        &["config", "apply", file.to_str().unwrap(), "--dry-run"],
        "",
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 change(s)"));
    assert_eq!(service.version(), 0, "nothing was written by the checks");

    // Nobody there.
    let out = service.run(
        &[
            "config",
            "apply",
            file.to_str().unwrap(),
            "--url",
            "http://127.0.0.1:9",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(3), "server unavailable");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unreachable"));
    let out = service.run(&["config", "export", "--url", "http://127.0.0.1:9"], "");
    assert_eq!(out.status.code(), Some(3), "server unavailable");
}

/// A limiting server fed by a file has no configuration API: every
/// `config` command that needs one says so (and what to do), exit 1; its
/// gRPC port given as the API's URL is named as such.
#[test]
fn config_commands_explain_a_server_without_the_api_and_the_grpc_port() {
    let server = charon_testkit::CharonProcess::start(crate::support::bin(), FILE, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, FILE).unwrap();
    let file = file.to_str().unwrap();
    let http = server.http_url();
    for args in [
        vec!["config", "export"],
        vec!["config", "log"],
        vec!["config", "apply", file, "--yes", "--token", TOKEN],
        vec!["config", "rollback", "--to", "1", "--yes", "--token", TOKEN],
    ] {
        let out = charon()
            .args(&args)
            .args(["--url", &http])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            stderr.contains("has no configuration API (HTTP 404)")
                && stderr.contains("--config FILE takes its limits from that file"),
            "{args:?}: {stderr}"
        );
    }
    let grpc = format!("http://127.0.0.1:{}", server.grpc_port);
    let out = charon()
        .args(["config", "export", "--url", &grpc])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is it the gRPC port?"), "{stderr}");
}

/// A migration end to end: envoyproxy/ratelimit's file converted by
/// `charon config import`, applied to the configuration service (its
/// `envoy:` section shown as one entry of the difference), exported back
/// exactly as converted.
#[test]
fn an_imported_envoy_ratelimit_file_applies_and_exports_unchanged() {
    let service = Service::start();
    let source =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/envoy-ratelimit/messaging.yaml");
    let out = charon()
        .args(["config", "import", "--from", "envoy-ratelimit"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let converted = String::from_utf8(out.stdout).unwrap();
    let file = service.file("charon.yaml", &converted);
    let (ok, stdout, stderr) = service.apply(&file, &["--yes"], "");
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("1 change(s) against version 0: 1 added"),
        "{stdout}"
    );
    assert!(stdout.contains("+ envoy envoy"), "{stdout}");
    assert!(stdout.contains("domain: messaging"), "{stdout}");
    assert_eq!(service.export(), converted);
    assert_eq!(service.version(), 1);
}
