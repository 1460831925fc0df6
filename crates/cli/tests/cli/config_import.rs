//! `charon config import --from envoy-ratelimit|limitador|boulder` through
//! the binary on realistic files (`tests/data/`): the output passes
//! `charon config check` unchanged and carries the peer's settings, what
//! cannot be carried over fails the import unless `--lossy` (which lists
//! each loss by path), and a file the peer refuses is an error by path,
//! exit 1, nothing on stdout. How an imported configuration decides is
//! tested through Envoy's stubs against real servers (the Python suite's
//! conformance cases) and through `charon simulate` for Boulder's
//! buckets (`conformance_boulder` below).

#[path = "config_import/boulder.rs"]
mod conformance_boulder;

use std::path::PathBuf;

use crate::support::charon;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// Runs `charon config import --from FORMAT [ARGS] FILES…`: (success,
/// stdout, stderr).
fn import_with(format: &str, args: &[&str], files: &[&str]) -> (bool, String, String) {
    let out = charon()
        .args(["config", "import", "--from", format])
        .args(args)
        .args(files.iter().map(|f| data(f)))
        .output()
        .expect("charon runs");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("UTF-8"),
        String::from_utf8(out.stderr).expect("UTF-8"),
    )
}

fn import(format: &str, files: &[&str]) -> (bool, String, String) {
    import_with(format, &[], files)
}

/// `charon config check` of `yaml` succeeds and prints it unchanged.
fn check_is_stable(yaml: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("imported.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = charon()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("charon runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "config check refused it: {stderr}\n{yaml}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), yaml);
}

#[test]
fn envoy_ratelimit_files_import_with_every_field_and_the_peers_settings() {
    let (ok, yaml, stderr) = import(
        "envoy-ratelimit",
        &["envoy-ratelimit/edge.yaml", "envoy-ratelimit/internal.yaml"],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "", "nothing lost, nothing to note");
    check_is_stable(&yaml);
    for want in [
        "  headers: false\n  unknown_domain: ok\n  match: whole\n  record: every_hit\n  windows: fixed\n",
        "name: per_key_path",
        "replaces:\n        - per_key_path",
        "detailed_metric: true",
        "unit: week",
        "unit: month",
        "requests_per_unit: 0",
        "unlimited: true",
    ] {
        assert!(yaml.contains(want), "{want:?} in:\n{yaml}");
    }
    // The peer's flags and environment, given on the command line.
    let (ok, yaml, _) = import_with(
        "envoy-ratelimit",
        &[
            "--headers",
            "ratelimit",
            "--shadow-mode",
            "--header-name",
            "reset=A-Ratelimit-Reset",
        ],
        &["envoy-ratelimit/messaging.yaml"],
    );
    assert!(ok);
    assert!(
        yaml.contains(
            "  shadow_mode: true\n  headers: ratelimit\n  header_names:\n    reset: A-Ratelimit-Reset\n"
        ),
        "{yaml}"
    );
}

#[test]
fn limitador_files_import_and_losses_need_lossy() {
    let (ok, yaml, stderr) = import("limitador", &["limitador/limits.yaml"]);
    assert!(ok, "{stderr}");
    check_is_stable(&yaml);
    assert!(yaml.contains("  windows: first_hit\n"), "{yaml}");
    assert!(yaml.contains("not_equals: OPTIONS"), "{yaml}");
    // The older syntax is read as descriptors[0], with a note.
    assert!(
        stderr.contains("note: \"req.method\" is read as descriptors[0]"),
        "{stderr}"
    );
    assert!(!stderr.contains("not carried over"), "{stderr}");

    // A condition Charon cannot express: the import fails, printing
    // nothing, and says what and how to go on.
    let (ok, yaml, stderr) = import("limitador", &["limitador/lossy.yaml"]);
    assert!(!ok);
    assert_eq!(yaml, "");
    let file = data("limitador/lossy.yaml").display().to_string();
    assert!(
        stderr.contains(&format!("{file}: [0].conditions[0]: not carried over: ")),
        "{stderr}"
    );
    assert!(stderr.contains("Rerun with --lossy"), "{stderr}");
    let (ok, yaml, stderr) = import_with("limitador", &["--lossy"], &["limitador/lossy.yaml"]);
    assert!(ok, "{stderr}");
    check_is_stable(&yaml);
    assert!(stderr.contains("not carried over"));
    assert_eq!(yaml.matches("rate_limit:").count(), 1, "{yaml}");
}

#[test]
fn boulder_files_import_as_buckets_with_normalized_override_domains() {
    for overrides in ["boulder/overrides.yaml", "boulder/overrides-list.yaml"] {
        let (ok, yaml, stderr) = import("boulder", &["boulder/defaults.yaml", overrides]);
        assert!(ok, "{overrides}: {stderr}");
        check_is_stable(&yaml);
        assert!(
            yaml.contains("name: boulder/NewOrdersPerAccount\n  kind: bucket"),
            "{yaml}"
        );
    }
    let (_, yaml, stderr) = import(
        "boulder",
        &["boulder/defaults.yaml", "boulder/overrides.yaml"],
    );
    for want in [
        "\"10.0.0.2\":",
        "\"2001:db8::/48\":",
        "\"12345678:example.com,example.org\":",
        "\"12345678\":",
    ] {
        assert!(yaml.contains(want), "{want:?} in:\n{yaml}");
    }
    assert!(
        stderr.contains("is the domain \"2001:db8::/48\""),
        "{stderr}"
    );
    // Defaults alone.
    let (ok, yaml, _) = import("boulder", &["boulder/defaults.yaml"]);
    assert!(ok && !yaml.contains("domains:"));
}

#[test]
fn malformed_files_are_refused_by_path_with_nothing_written() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "envoy-ratelimit",
            &["envoy-ratelimit/bad.yaml"],
            // (envoyproxy/ratelimit checks every key before anything else)
            &["descriptors[1].colour: config error, unknown key 'colour'"],
        ),
        (
            "limitador",
            &["limitador/bad.yaml"],
            &[
                "[0].max_value: invalid type: expected a whole number from 0 to 2^64-1, found the number -5",
                "[1].seconds: missing field `seconds`",
                "[1].conditions: missing field `conditions`",
                "[2]: Couldn't parse: expected a limit (a mapping), found the string \"not a limit\"",
            ],
        ),
        (
            "boulder",
            &["boulder/defaults.yaml", "boulder/bad-overrides.yaml"],
            &[
                "[\"NewRegistrationsPerIPAddress:lol\"]: validating name NewRegistrationsPerIPAddress and id \"lol\" for override limit: invalid IP address",
                "[\"CertificatesPerDomain:example.com\"]: an override of CertificatesPerDomain, which the defaults file does not limit",
                "[\"NewOrdersPerAccount:12345678\"].burst: invalid burst '0', must be > 0",
            ],
        ),
        // The wrong format.
        (
            "limitador",
            &["envoy-ratelimit/messaging.yaml"],
            &["Couldn't parse: expected a list of limits, found a mapping"],
        ),
        (
            "envoy-ratelimit",
            &["limitador/limits.yaml"],
            &["config error, unknown key 'namespace'"],
        ),
    ];
    for (format, files, expected) in cases {
        let out = charon()
            .args(["config", "import", "--from", format])
            .args(files.iter().map(|f| data(f)))
            .output()
            .expect("charon runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{format} {files:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{format} {files:?}: nothing is written"
        );
        for e in *expected {
            assert!(stderr.contains(e), "missing {e:?} in:\n{stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // A missing file.
    let out = charon()
        .args([
            "config",
            "import",
            "--from",
            "boulder",
            "/nonexistent/defaults.yaml",
        ])
        .output()
        .expect("charon runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/defaults.yaml")
    );
}
