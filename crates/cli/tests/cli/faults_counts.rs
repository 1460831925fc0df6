//! Huge counts through real `charon serve` processes and raw gRPC (issue 9,
//! defect 8): counts up to 2^53 - 1 are valid, and a reserve or request
//! whose grant would take a count the store keeps past 2^53 - 1 is a
//! client error naming the bound (`INVALID_ARGUMENT`, `charon-error-class:
//! client`), the same on the in-memory store and on Redis — never a server
//! error, never an inexact count.
//!
//! `--nocapture` shows one `FAULT` line per test.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::{bin, grpc};
use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use charon_testkit::{BOUND, CharonProcess, RedisServer, refusal_at_bound as over};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

const LIMITS: &str = r#"
namespaces:
  free: { allow_unconfigured: true }
  loose: { allow_unconfigured: true, ignore_configured: true }
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 5, window: 1s } ]
"#;

/// 2^53 - 1: the largest count Charon keeps.
const MAX: u64 = (1 << 53) - 1;

/// A session sending `ops` at once (ids 1, 2, …): its replies.
async fn session(
    grpc: &mut LimiterClient<Channel>,
    ops: impl Iterator<Item = Op>,
) -> tonic::Streaming<v1::SessionReply> {
    let requests: Vec<v1::SessionRequest> = ops
        .zip(1..)
        .map(|(op, id)| v1::SessionRequest { id, op: Some(op) })
        .collect();
    grpc.session(tokio_stream::iter(requests))
        .await
        .expect("session")
        .into_inner()
}

/// Reserves `copies` of `resource` for each domain in turn on one session;
/// one line per reply.
async fn reserves(grpc: &mut LimiterClient<Channel>, asks: &[(&str, &str, u64)]) -> Vec<String> {
    let mut replies = session(
        grpc,
        asks.iter().map(|&(resource, domain, copies)| {
            Op::Reserve(v1::ReserveRequest {
                resource: resource.into(),
                domain: domain.into(),
                copies: Some(copies),
                min_copies: None,
                wait_ms: None,
            })
        }),
    )
    .await;
    let mut got = BTreeMap::new();
    while got.len() < asks.len() {
        let r = replies.next().await.expect("a reply").expect("ok");
        got.insert(r.id, r.result.expect("result"));
    }
    got.into_values()
        .map(|r| match r {
            Reply::Reserve(r) => format!(
                "granted {}, domain {}, global {}",
                r.granted, r.domain_holds, r.global_holds
            ),
            Reply::Error(e) if e.class == v1::error::Class::Client as i32 => {
                format!("client error: {}", e.message)
            }
            other => format!("other: {other:?}"),
        })
        .collect()
}

/// `n` requests of `copies` hits of `resource`, each from its own domain,
/// sent at once on one session: how many were granted, refused at the
/// bound, or anything else (by its text).
async fn pipelined_requests(
    grpc: &mut LimiterClient<Channel>,
    resource: &str,
    n: u64,
    copies: u64,
) -> BTreeMap<String, usize> {
    let mut replies = session(
        grpc,
        (1..=n).map(|id| {
            Op::Request(v1::RateRequest {
                resource: resource.into(),
                domain: format!("m{id}"),
                copies: Some(copies),
                min_copies: None,
                dry_run: false,
            })
        }),
    )
    .await;
    let mut tally = BTreeMap::new();
    for _ in 0..n {
        let r = replies.next().await.expect("a reply").expect("ok");
        let kind = match r.result.expect("result") {
            Reply::Request(r) if r.granted == copies => "granted".to_owned(),
            Reply::Error(e)
                if e.class == v1::error::Class::Client as i32 && e.message.contains(BOUND) =>
            {
                "client error at the bound".to_owned()
            }
            other => format!("other: {other:?}"),
        };
        *tally.entry(kind).or_default() += 1;
    }
    tally
}

/// One unary request: the grant with the counts, or the status code, the
/// error class and the message.
async fn request(
    grpc: &mut LimiterClient<Channel>,
    resource: &str,
    domain: &str,
    copies: u64,
) -> String {
    match grpc
        .request(v1::RateRequest {
            resource: resource.into(),
            domain: domain.into(),
            copies: Some(copies),
            min_copies: None,
            dry_run: false,
        })
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            format!(
                "granted {}, domain {}, global {}",
                r.granted, r.domain_hits_last_second, r.global_hits_last_second
            )
        }
        Err(e) => format!(
            "{:?} ({}): {}",
            e.code(),
            e.metadata()
                .get("charon-error-class")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("no class"),
            e.message()
        ),
    }
}

async fn huge_counts_are_client_errors(server: &CharonProcess, store: &str) {
    let mut grpc = grpc(server).await;
    let big = (1u64 << 52) + 1;
    let mut observed = reserves(
        &mut grpc,
        &[
            ("free/vm", "a", big),
            ("free/vm", "a", big),
            ("free/vm", "a", big),
            ("loose/vm", "b", MAX),
            ("loose/vm", "b", 1),
        ],
    )
    .await;
    // Hits count for a second: the refusal of a second request of 2^52 + 1
    // by the same domain is certain when both fell within one second (the
    // server's hit times lie between `sent` and the second reply).
    let mut pair = None;
    for attempt in 0..10 {
        let domain = format!("a{attempt}");
        let sent = Instant::now();
        let first = request(&mut grpc, "loose/api", &domain, big).await;
        let second = request(&mut grpc, "loose/api", &domain, big).await;
        if sent.elapsed() < Duration::from_millis(1_000) {
            pair = Some((first, second));
            break;
        }
    }
    let (first, second) = pair.expect("two requests within a second");
    observed.push(first);
    observed.push(second);
    // 1030 requests of 2^53 - 1, pipelined on one session: their sum would
    // pass 2^63 within a second. A grant of 2^53 - 1 needs a last second
    // with no hit, so at most one per second passes; the rest are refused.
    let sent = Instant::now();
    let tally = pipelined_requests(&mut grpc, "free/api", 1_030, MAX).await;
    let seconds = sent.elapsed().as_secs();
    let granted = tally.get("granted").copied().unwrap_or(0);
    let refused = tally.get("client error at the bound").copied().unwrap_or(0);
    observed.push(format!(
        "1030 requests of 2^53-1 in {seconds} s: {tally:?}, {}",
        if granted >= 1 && granted as u64 <= seconds + 1 && granted + refused == 1_030 {
            "as expected"
        } else {
            "NOT as expected"
        }
    ));
    observed.push(request(&mut grpc, "api", "a", 1).await);

    // The second and the third reserve of 2^52 + 1 by `a` are refused alike.
    let a_refused = format!(
        "client error: {}",
        over("the copies held by domain \"a\"", big, big)
    );
    let expected = vec![
        format!("granted {big}, domain {big}, global {big}"),
        a_refused.clone(),
        a_refused,
        format!("granted {MAX}, domain {MAX}, global {MAX}"),
        format!(
            "client error: {}",
            over("the copies held by domain \"b\"", MAX, 1)
        ),
        format!("granted {big}, domain {big}, global {big}"),
        format!(
            "InvalidArgument (client): {}",
            over("the hits of this domain in the last second", big, big)
        ),
        observed[7].replace("NOT as expected", "as expected"),
        "granted 1, domain 1, global 1".to_owned(),
    ];
    println!(
        "FAULT huge_counts_through_grpc ({store}): injected reserves of 2^52+1 copies x3 and 2^53-1 + 1 copies (allow_unconfigured, ignore_configured), requests of 2^52+1 hits x2 and of 2^53-1 hits from 1030 domains in one second (sum past 2^63); expected a client error naming the bound (INVALID_ARGUMENT, charon-error-class: client) for each grant past 2^53-1, never INTERNAL, and the server serving on; observed:\n  {}",
        observed.join("\n  ")
    );
    assert_eq!(observed, expected);
}

/// [`huge_counts_are_client_errors`] on a server with `store` (`memory`,
/// or a private Redis).
async fn huge_counts_with(store: &str) {
    let redis = (store == "redis").then(RedisServer::start);
    let url = redis
        .as_ref()
        .map_or_else(|| "memory".to_owned(), RedisServer::url);
    let server = CharonProcess::start(bin(), LIMITS, &["--store", url.as_str()]);
    huge_counts_are_client_errors(&server, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_counts_get_a_client_error_with_the_memory_store() {
    huge_counts_with("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_counts_get_a_client_error_with_the_redis_store() {
    huge_counts_with("redis").await;
}
