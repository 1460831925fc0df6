//! Issue 16: the limiting API's tokens (`charon serve --api-tokens FILE`)
//! against a real server process: a tenant's token reserves its own
//! copies and is refused (PERMISSION_DENIED) another tenant's, in the same
//! session without ending it; no token is UNAUTHENTICATED; health stays
//! open; the file reloads on SIGHUP, and a bad file keeps the previous one.

use std::time::Duration;

use crate::support::{bench_json, bin, charon, grpc, within};
use charon_client::{Client, ClientOptions};
use charon_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_proto::v1;
use charon_testkit::CharonProcess;
use tonic::Code;

const A: &str = "tenant-a-secret";
const B: &str = "tenant-b-secret";

const LIMITS: &str = "\
resources:
  - { name: a/vm, kind: copy, domain_limit: 5 }
  - { name: b/vm, kind: copy, domain_limit: 5 }
  - name: a/api
    kind: rate
    tiers: [ { limit: 100, window: 1s } ]
  - { name: b/qps, kind: lease, capacity: 60, algorithm: fair_share,
      lease_length: 3s, refresh_interval: 500ms, learning_mode: 0s }
";

/// `request` with `authorization: Bearer token`.
fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    request
}

fn tokens(a_namespaces: &str) -> String {
    format!(
        "- {{ name: tenant-a, secret: {A}, namespaces: {a_namespaces} }}\n\
         - {{ name: tenant-b, secret_file: b.secret, namespaces: [b] }}\n"
    )
}

/// A server on `LIMITS` whose tokens file (returned, in the directory
/// returned) gives tenant a namespace a and tenant b namespace b.
fn serve_with_tokens() -> (tempfile::TempDir, std::path::PathBuf, CharonProcess) {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("api-tokens.yaml");
    std::fs::write(dir.path().join("b.secret"), format!("{B}\n")).expect("write");
    std::fs::write(&file, tokens("[a]")).expect("write");
    let file_arg = file.display().to_string();
    let server = CharonProcess::start(bin(), LIMITS, &["--api-tokens", &file_arg]);
    (dir, file, server)
}

fn client(server: &CharonProcess, token: Option<&str>) -> Client {
    let mut o = ClientOptions::new(server.endpoint());
    o.fail_open = false;
    o.request_timeout = Duration::from_secs(3);
    if let Some(t) = token {
        o = o.with_token(t);
    }
    Client::connect(o).expect("client")
}

/// A raw rate request with `token` (if any): the status code.
async fn raw_request(server: &CharonProcess, token: Option<&str>, resource: &str) -> Code {
    let mut request = tonic::Request::new(v1::RateRequest {
        resource: resource.to_owned(),
        domain: "d".to_owned(),
        copies: Some(1),
        min_copies: Some(1),
        dry_run: false,
    });
    if let Some(t) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    match grpc(server).await.request(request).await {
        Ok(_) => Code::Ok,
        Err(status) => {
            if status.code() != Code::Ok {
                assert_eq!(
                    status
                        .metadata()
                        .get("charon-error-class")
                        .and_then(|v| v.to_str().ok()),
                    Some("client"),
                    "{status:?}"
                );
            }
            status.code()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_use_their_own_namespaces_only() {
    let (_dir, file, server) = serve_with_tokens();

    // Unary: no token, a wrong one, another tenant's namespace, its own.
    assert_eq!(
        raw_request(&server, None, "a/api").await,
        Code::Unauthenticated
    );
    assert_eq!(
        raw_request(&server, Some("nope"), "a/api").await,
        Code::Unauthenticated
    );
    assert_eq!(
        raw_request(&server, Some(B), "a/api").await,
        Code::PermissionDenied
    );
    assert_eq!(raw_request(&server, Some(A), "a/api").await, Code::Ok);

    // A session: A reserves its copies, is refused B's, and the session
    // goes on (the refusal fails only that operation).
    let a = client(&server, Some(A));
    let mine = a
        .reserve("a/vm", "x")
        .copies(2)
        .send()
        .await
        .expect("reserve a/vm");
    assert_eq!(mine.copies(), 2);
    match a.reserve("b/vm", "x").copies(1).send().await {
        Err(e) => {
            assert!(!e.is_server(), "{e}");
            assert!(e.to_string().contains("may not use namespace \"b\""), "{e}");
        }
        Ok(h) => panic!("tenant a reserved b's copies: {}", h.copies()),
    }
    let more = a
        .reserve("a/vm", "y")
        .copies(1)
        .send()
        .await
        .expect("the session goes on");
    assert_eq!(more.copies(), 1);
    let b = client(&server, Some(B));
    let theirs = b
        .reserve("b/vm", "x")
        .copies(5)
        .send()
        .await
        .expect("b's own");
    assert_eq!(theirs.copies(), 5);

    // Capacity: a lease of b's resource is b's.
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut capacity = v1::capacity_client::CapacityClient::new(channel.clone());
    let ask = |token: &str| {
        with_token(
            token,
            v1::GetCapacityRequest {
                client_id: "c1".to_owned(),
                resources: vec![v1::ResourceWant {
                    resource: "b/qps".to_owned(),
                    wants: 10.0,
                    has: 0.0,
                    subclients: 0,
                }],
            },
        )
    };
    let refused = capacity.get_capacity(ask(A)).await.expect_err("a's token");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let lease = capacity.get_capacity(ask(B)).await.expect("b's token");
    assert_eq!(lease.into_inner().leases.len(), 1);
    let anonymous = capacity
        .get_capacity(tonic::Request::new(ask(B).into_inner()))
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated);

    // Envoy: the domain stands for the namespace (this configuration has
    // no envoy: section, so an allowed call is answered OK).
    let mut envoy = RateLimitServiceClient::new(channel.clone());
    let call = |token: &str, domain: &str| {
        with_token(
            token,
            RateLimitRequest {
                hits_addend: 1,
                ..crate::support::envoy_request(domain, "user", "ann")
            },
        )
    };
    let refused = envoy
        .should_rate_limit(call(A, "b"))
        .await
        .expect_err("a on b");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    envoy.should_rate_limit(call(A, "a")).await.expect("a on a");

    // Without a token the client is refused, as a client error.
    let anonymous = client(&server, None);
    let refused = anonymous
        .reserve("a/vm", "x")
        .send()
        .await
        .expect_err("no token");
    assert!(
        !refused.is_server() && refused.to_string().contains("requires a token"),
        "{refused}"
    );

    // Health stays open.
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers without a token");
    assert_eq!(health.into_inner().status, 1, "SERVING");

    // The CLI's client commands send --token / CHARON_TOKEN.
    let out = charon()
        .args([
            "client",
            "request",
            "--server",
            &server.endpoint(),
            "a/api",
            "d",
        ])
        .env("CHARON_TOKEN", A)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = charon()
        .args([
            "client",
            "request",
            "--server",
            &server.endpoint(),
            "a/api",
            "d",
        ])
        .env_remove("CHARON_TOKEN")
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("\"error\":\"client\""),
        "{text}"
    );

    // A bad file is refused on SIGHUP; the tokens in force stay.
    std::fs::write(&file, "- { name: tenant-a }\n").expect("write");
    server.signal("HUP");
    let refused = within(Duration::from_secs(5), async || {
        server.log().contains("API tokens refused")
    })
    .await;
    assert!(refused.is_some(), "{}", server.log());
    assert_eq!(raw_request(&server, Some(A), "a/api").await, Code::Ok);

    // An empty file (a truncated write), seen by the watch alone: refused
    // too, not a server that refuses every client.
    std::fs::write(&file, "").expect("write");
    let refused = within(Duration::from_secs(5), async || {
        server.log().contains("no tokens (an empty file?)")
    })
    .await;
    assert!(refused.is_some(), "{}", server.log());
    assert_eq!(raw_request(&server, Some(A), "a/api").await, Code::Ok);

    // A good one is taken: tenant a may now use b too.
    std::fs::write(&file, tokens("[a, b]")).expect("write");
    server.signal("HUP");
    let widened = within(Duration::from_secs(5), async || {
        raw_request(&server, Some(A), "b/vm").await == Code::FailedPrecondition
    })
    .await;
    assert!(
        widened.is_some(),
        "tenant a was not given b: {}",
        server.log()
    );
    assert!(!server.log().contains(A) && !server.log().contains(B));
}

#[test]
fn charon_bench_sends_the_token_on_every_protocol() {
    let (_dir, _file, server) = serve_with_tokens();
    let run = |extra: &[&str]| {
        let mut args = vec!["--duration", "500ms", "--warmup", "0s", "--domains", "3"];
        args.extend_from_slice(extra);
        bench_json(&server.endpoint(), &args)
    };
    for mode in ["unary", "session"] {
        let with = run(&["--mode", mode, "--resource", "a/api", "--token", A]);
        assert_eq!(with["errors"], 0, "{mode} with tenant a's token: {with}");
        assert!(with["granted"].as_u64().is_some_and(|n| n > 0), "{with}");
        let without = run(&["--mode", mode, "--resource", "a/api"]);
        assert_eq!(without["granted"], 0, "{mode} without a token: {without}");
        assert!(
            without["errors"].as_u64().is_some_and(|n| n > 0),
            "{without}"
        );
    }
    let lease = run(&["--mode", "lease", "--resource", "b/qps", "--token", B]);
    assert_eq!(lease["errors"], 0, "lease with tenant b's token: {lease}");
    assert!(lease["granted"].as_u64().is_some_and(|n| n > 0), "{lease}");
    let other = run(&["--mode", "lease", "--resource", "b/qps", "--token", A]);
    assert_eq!(other["granted"], 0, "tenant a on b's lease: {other}");
}
