//! Boulder's own tests of its `ratelimits` package, transcribed as data:
//! its GCRA (`ratelimits/gcra_test.go`) replayed through `charon
//! simulate` on a bucket imported from a Boulder defaults file, in both
//! stores; its loader (`ratelimits/limit_test.go` and its `testdata/`)
//! through `charon config import --from boulder`. Each case names its
//! source at the commit of the snapshot it was read from; where Charon
//! answers differently, the case says how and `docs/envoy.md` ("Boulder")
//! lists it.

use serde_json::{Value, json};

use crate::support::{charon, simulate};

/// The snapshot the cases were read from.
const BOULDER: &str = "letsencrypt/boulder@2d00c8e27919fe945e53b2cf857838e68a1da111";

/// Imports Boulder files given as text; (exit ok, stdout, stderr).
fn import(files: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let paths: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let p = dir.path().join(format!("f{i}.yml"));
            std::fs::write(&p, text).expect("write");
            p
        })
        .collect();
    let out = charon()
        .args(["config", "import", "--from", "boulder"])
        .args(&paths)
        .output()
        .expect("charon runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One step of a GCRA case: at `t` (ms), spend `cost` (a request for
/// exactly `cost`), look (a dry run of one: Boulder spends 0 to look, which
/// Charon refuses as a count; a dry run answers as if one were spent, so
/// its `remaining` is one less and its reset one emission interval more
/// than Boulder's), or refund `cost`; and what Charon answers: granted,
/// remaining, retry_after_ms, reset_after_ms (`None`: not asserted).
struct Step {
    t: u64,
    op: &'static str,
    cost: u64,
    want: (u64, u64, Option<u64>, Option<u64>),
}

const fn step(
    t: u64,
    op: &'static str,
    cost: u64,
    want: (u64, u64, Option<u64>, Option<u64>),
) -> Step {
    Step { t, op, cost, want }
}

/// TestDecide: burst 10, one token a second.
const DECIDE: &[Step] = &[
    // Use 1 of 10, then the other 9: a retry of the same 9 waits 9 s.
    step(0, "spend", 1, (1, 9, Some(0), Some(1_000))),
    step(0, "spend", 9, (9, 0, Some(9_000), Some(10_000))),
    // One more without waiting: denied, wait 1 s.
    step(0, "spend", 1, (0, 0, Some(1_000), Some(10_000))),
    // Exactly as patient as told: one is there (Boulder: remaining 1).
    step(1_000, "look", 1, (1, 0, Some(1_000), Some(10_000))),
    step(1_000, "spend", 1, (1, 0, Some(1_000), Some(10_000))),
    // The whole reset later: 10 again, 9 after one.
    step(11_000, "spend", 1, (1, 9, Some(0), Some(1_000))),
    // 1 ms shy of the reset: still 9 (Boulder: reset 1 ms).
    step(11_999, "look", 1, (1, 8, Some(0), Some(1_001))),
    // 20 hours later: the most accrued is the burst (Boulder: 10, reset 0).
    step(72_011_999, "look", 1, (1, 9, Some(0), Some(1_000))),
    step(72_011_999, "spend", 10, (10, 0, Some(10_000), Some(10_000))),
    // Looking at an empty bucket (Boulder: allowed, 0; a dry run of one is
    // refused, and says when one is there).
    step(72_011_999, "look", 1, (0, 0, Some(1_000), Some(10_000))),
    step(72_011_999, "spend", 1, (0, 0, Some(1_000), Some(10_000))),
    step(72_012_999, "spend", 1, (1, 0, Some(1_000), Some(10_000))),
    // Refilled to 5: 7 is denied, with the wait from 5 to 7.
    step(72_017_999, "spend", 7, (0, 5, Some(2_000), Some(5_000))),
];

/// TestMaybeRefund: burst 10, one token a second. (Boulder's refund of 0
/// is left out: Charon counts start at 1, and a refund of 0 is a client
/// error. A refund into a full bucket reports `granted` as the copies
/// refunded, where Boulder says not allowed; the bucket is the same.)
const REFUND: &[Step] = &[
    step(0, "spend", 1, (1, 9, Some(0), Some(1_000))),
    step(0, "refund", 1, (1, 10, Some(0), Some(0))),
    step(0, "spend", 1, (1, 9, Some(0), Some(1_000))),
    step(1_000, "refund", 1, (1, 10, Some(0), Some(0))),
    step(1_000, "spend", 10, (10, 0, Some(10_000), Some(10_000))),
    step(1_000, "refund", 10, (10, 10, Some(0), Some(0))),
    step(12_000, "refund", 1, (1, 10, Some(0), Some(0))),
    step(12_000, "spend", 5, (5, 5, None, None)),
    step(12_000, "refund", 1, (1, 6, Some(0), None)),
    // 2.5 s later: 8.5 tokens (Boulder: remaining 8, reset 1.5 s).
    step(14_500, "look", 1, (1, 7, Some(0), Some(2_500))),
    // Refunding 2 fills it, never past the burst.
    step(14_500, "refund", 2, (2, 10, Some(0), Some(0))),
];

fn event(s: &Step) -> Value {
    let mut e = json!({"t": s.t, "resource": "boulder/NewOrdersPerAccount", "domain": "acct"});
    match s.op {
        "spend" => {
            e["op"] = "request".into();
            e["copies"] = s.cost.into();
            e["min_copies"] = s.cost.into();
        }
        "look" => {
            e["op"] = "request".into();
            e["dry_run"] = true.into();
        }
        _ => {
            e["op"] = "refund".into();
            e["copies"] = s.cost.into();
        }
    }
    e
}

#[test]
fn boulders_gcra_cases_replay_in_both_stores() {
    // The limit of both tests, as a Boulder defaults file.
    let (ok, config, stderr) =
        import(&["NewOrdersPerAccount: { burst: 10, count: 1, period: 1s }\n"]);
    assert!(ok, "{stderr}");
    for (source, steps) in [
        ("ratelimits/gcra_test.go TestDecide", DECIDE),
        ("ratelimits/gcra_test.go TestMaybeRefund", REFUND),
    ] {
        let events: Vec<Value> = steps.iter().map(event).collect();
        let out = simulate(&config, &events);
        for (i, (s, o)) in steps.iter().zip(&out).enumerate() {
            let (granted, remaining, retry, reset) = s.want;
            let case = format!("{BOULDER} {source}, step {i} ({}): {o}", events[i]);
            assert_eq!(o["granted"], json!(granted), "{case}");
            assert_eq!(o["remaining"], json!(remaining), "{case}");
            if let Some(r) = retry {
                assert_eq!(o["retry_after_ms"], json!(r), "{case}");
            }
            if let Some(r) = reset {
                assert_eq!(o["reset_after_ms"], json!(r), "{case}");
            }
        }
    }
}

/// A loader case: files, and what the import says (`Ok`: strings the
/// configuration holds; `Err`: a string of the error).
struct Loader {
    source: &'static str,
    files: &'static [&'static str],
    want: Result<&'static [&'static str], &'static str>,
}

const DEFAULTS: &str = "NewRegistrationsPerIPAddress: { burst: 20, count: 20, period: 1s }
NewRegistrationsPerIPv6Range: { burst: 30, count: 30, period: 2s }
CertificatesPerDomain: { burst: 50, count: 50, period: 168h }
CertificatesPerFQDNSet: { burst: 50, count: 50, period: 168h }
FailedAuthorizationsPerDomainPerAccount: { burst: 10, count: 10, period: 1h }
FailedAuthorizationsForPausingPerDomainPerAccount: { burst: 10, count: 10, period: 1h }
CertificatesPerDomainPerAccount: { burst: 10, count: 10, period: 168h }
";

const LOADER: &[Loader] = &[
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseDefaultLimits (testdata/working_defaults.yml)",
        files: &[
            "NewRegistrationsPerIPAddress: { burst: 20, count: 20, period: 1s }\nNewRegistrationsPerIPv6Range: { burst: 30, count: 30, period: 2s }\n",
        ],
        want: Ok(&[
            "name: boulder/NewRegistrationsPerIPv6Range\n  kind: bucket\n  burst: 30\n  count: 30\n  period: 2s",
        ]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseDefaultLimits (testdata/busted_default_burst_0.yml)",
        files: &["NewRegistrationsPerIPAddress: { burst: 0, count: 20, period: 1s }\n"],
        want: Err("invalid burst"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseDefaultLimits (testdata/busted_default_empty_name.yml)",
        files: &["\"\": { burst: 20, count: 20, period: 1s }\n"],
        want: Err("unrecognized name \"\" in default limit"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseDefaultLimits (testdata/busted_defaults_second_entry_bad_name.yml)",
        files: &[
            "NewRegistrationsPerIPAddress: { burst: 20, count: 20, period: 1s }\nUsageRequestsPerIPv10Address: { burst: 20, count: 20, period: 1s }\n",
        ],
        want: Err("unrecognized name \"UsageRequestsPerIPv10Address\" in default limit"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestValidateLimit",
        files: &["NewRegistrationsPerIPAddress: { burst: 1, count: 0, period: 1s }\n"],
        want: Err("invalid count '0', must be > 0"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestValidateLimit",
        files: &["NewRegistrationsPerIPAddress: { burst: 1, count: 1, period: 0s }\n"],
        want: Err("invalid period '0s', must be > 0"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/working_overrides.yml)",
        files: &[
            DEFAULTS,
            "- NewRegistrationsPerIPAddress: { burst: 40, count: 40, period: 1s, ids: [ { id: 64.112.117.1, comment: Foo } ] }\n- NewRegistrationsPerIPv6Range: { burst: 50, count: 50, period: 2s, ids: [ { id: \"2602:80a:6000::/48\", comment: Foo } ] }\n- FailedAuthorizationsPerDomainPerAccount: { burst: 60, count: 60, period: 3s, ids: [ { id: 1234 }, { id: 5678 } ] }\n",
        ],
        want: Ok(&[
            "\"64.112.117.1\":\n      burst: 40",
            "\"2602:80a:6000::/48\":\n      burst: 50",
            "\"1234\":\n      burst: 60",
            "\"5678\":\n      burst: 60",
        ]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/working_override_regid_domainorcidr.yml)",
        files: &[
            DEFAULTS,
            "- CertificatesPerDomain: { burst: 40, count: 40, period: 1s, ids: [ { id: example.com } ] }\n",
        ],
        want: Ok(&["example.com:\n      burst: 40"]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/working_overrides_regid_fqdnset.yml); Charon writes the set, sorted, where Boulder hashes it",
        files: &[
            DEFAULTS,
            "- CertificatesPerFQDNSet: { burst: 50, count: 50, period: 2s, ids: [ { id: \"example.com,example.net\" } ] }\n- CertificatesPerFQDNSet: { burst: 60, count: 60, period: 4s, ids: [ { id: \"2602:80a:6000::1,9.9.9.9,example.com\" } ] }\n",
        ],
        want: Ok(&[
            "\"example.com,example.net\":\n      burst: 50",
            "\"2602:80a:6000::1,9.9.9.9,example.com\":\n      burst: 60",
        ]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestHydrateOverrideLimit (an address of CertificatesPerDomain is its covering prefix)",
        files: &[
            DEFAULTS,
            "- CertificatesPerDomain: { burst: 1, count: 1, period: 1s, ids: [ { id: 64.112.117.1 }, { id: \"2602:80a:6000:666::\" } ] }\n",
        ],
        want: Ok(&["64.112.117.1/32:", "\"2602:80a:6000:666::/64\":"]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestHydrateOverrideLimit (a bad name)",
        files: &[
            DEFAULTS,
            "- CertificatesPerDomain: { burst: 1, count: 1, period: 1s, ids: [ { id: VelociousVacherin } ] }\n",
        ],
        want: Err(
            "\"VelociousVacherin\" is neither a domain (Domain name needs at least one dot) nor an IP address",
        ),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/busted_override_burst_0.yml)",
        files: &[
            DEFAULTS,
            "- NewRegistrationsPerIPAddress: { burst: 0, count: 40, period: 1s, ids: [ { id: 55.66.77.88, comment: Foo } ] }\n",
        ],
        want: Err("invalid burst"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/busted_override_empty_name.yml)",
        files: &[
            DEFAULTS,
            "- \"\": { burst: 40, count: 40, period: 1s, ids: [ { id: 10.0.0.2 } ] }\n",
        ],
        want: Err("unrecognized name \"\" in override limit"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/busted_override_invalid_name.yml, busted_override_empty_id.yml)",
        files: &[
            DEFAULTS,
            "- UsageRequestsPerIPv10Address: { burst: 40, count: 40, period: 1s, ids: [] }\n",
        ],
        want: Err("unrecognized name \"UsageRequestsPerIPv10Address\" in override limit"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndParseOverrideLimitsFromFile (testdata/busted_overrides_third_entry_bad_id.yml)",
        files: &[
            DEFAULTS,
            "- NewRegistrationsPerIPAddress: { burst: 40, count: 40, period: 1s, ids: [ { id: 10.0.0.5 }, { id: 10.0.0.2 }, { id: lol } ] }\n",
        ],
        want: Err("ids[2].id: validating name NewRegistrationsPerIPAddress and id \"lol\""),
    },
    Loader {
        source: "ratelimits/limit_test.go TestParseOverrideNameId (seed 002's Name:id keys)",
        files: &[
            DEFAULTS,
            "NewRegistrationsPerIPAddress:10.0.0.1: { burst: 1, count: 1, period: 1s }\nNewRegistrationsPerIPv6Range:2602:80a:6000::/48: { burst: 1, count: 1, period: 1s }\n",
        ],
        want: Ok(&["\"10.0.0.1\":", "\"2602:80a:6000::/48\":"]),
    },
    Loader {
        source: "ratelimits/limit_test.go TestParseOverrideNameId (a missing colon)",
        files: &[
            DEFAULTS,
            "NewRegistrationsPerIPAddress10.0.0.1: { burst: 1, count: 1, period: 1s }\n",
        ],
        want: Err("must be formatted 'name:id'"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestParseOverrideNameId (only a colon)",
        files: &[
            DEFAULTS,
            "\"NewRegistrationsPerIPAddress:\": { burst: 1, count: 1, period: 1s }\n",
        ],
        want: Err("empty id in override"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestParseOverrideNameId (an invalid name)",
        files: &[
            DEFAULTS,
            "lol:noexist: { burst: 1, count: 1, period: 1s }\n",
        ],
        want: Err("unrecognized name \"lol\" in override limit"),
    },
    Loader {
        source: "ratelimits/limit_test.go TestLoadAndDumpOverrides (several overrides of one limit, ids by their format)",
        files: &[
            DEFAULTS,
            "- CertificatesPerDomainPerAccount: { burst: 12000, count: 12000, period: 168h0m0s, ids: [ { id: \"123456789\" } ] }\n- CertificatesPerDomainPerAccount: { burst: 6000, count: 6000, period: 168h0m0s, ids: [ { id: \"543219876\" }, { id: \"987654321\" } ] }\n- FailedAuthorizationsPerDomainPerAccount: { burst: 250, count: 250, period: 1h0m0s, ids: [ { id: \"123456789\" } ] }\n",
        ],
        want: Ok(&[
            "\"123456789\":\n      burst: 12000",
            "\"987654321\":\n      burst: 6000",
            "\"123456789\":\n      burst: 250",
        ]),
    },
];

#[test]
fn boulders_loader_cases_import_or_are_refused_as_boulder_refuses_them() {
    for case in LOADER {
        let (ok, yaml, stderr) = import(case.files);
        let at = format!("{BOULDER} {}", case.source);
        match case.want {
            Ok(holds) => {
                assert!(ok, "{at}: {stderr}");
                for h in holds {
                    assert!(yaml.contains(h), "{at}: {h:?} in\n{yaml}");
                }
            }
            Err(reason) => {
                assert!(!ok, "{at}: imported:\n{yaml}");
                assert!(yaml.is_empty(), "{at}: nothing is written");
                assert!(stderr.contains(reason), "{at}: {reason:?} in\n{stderr}");
            }
        }
    }
}
