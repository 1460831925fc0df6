//! Rate requests on the client's session stream (the default transport)
//! against a real server in this process: exactness when many tasks share
//! one client, the bound on operations in flight, and the unary transport
//! kept as an option. What happens when the server dies mid-flight needs a
//! server process to kill: see the `client_sessions` tests of the `charon`
//! crate.

use std::time::Duration;

use charon_client::{Client, ClientOptions, RateTransport, Source};
use charon_testkit::InProcessServer;

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 500, window: 1h } ]
  - name: tokens
    kind: bucket
    burst: 10
    count: 1
    period: 1h
"#;

fn client(server: &InProcessServer, configure: impl FnOnce(&mut ClientOptions)) -> Client {
    let mut options = ClientOptions::new(server.endpoint());
    options.fail_open = false;
    options.request_timeout = Duration::from_secs(10);
    configure(&mut options);
    Client::connect(options).expect("a client")
}

/// Sends `tasks × each` single-hit requests for `api`/`domain` from as many
/// tasks sharing `client`; returns the hits granted.
async fn hammer(client: &Client, domain: &str, tasks: usize, each: usize) -> u64 {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (client, domain) = (client.clone(), domain.to_owned());
        set.spawn(async move {
            let mut granted = 0;
            for _ in 0..each {
                let grant = client.request("api", &domain).send().await.expect("answer");
                assert_eq!(grant.source, Source::Server, "{grant:?}");
                granted += grant.granted;
            }
            granted
        });
    }
    let mut granted = 0;
    while let Some(n) = set.join_next().await {
        granted += n.expect("a task");
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_sharing_one_client_get_exactly_the_limit_over_the_session() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, |_| {});
    // 1,200 requests for a limit of 500, from 60 tasks at once.
    assert_eq!(hammer(&c, "d", 60, 20).await, 500);
    let stats = c.stats();
    assert_eq!(
        (stats.requests, stats.rejections, stats.server_errors),
        (1_200, 700, 0)
    );
    assert!(
        stats.peak_in_flight > 1,
        "requests were pipelined: {stats:?}"
    );
    assert_eq!(stats.in_flight, 0, "every place given back");
    // Another domain's limit is its own.
    assert_eq!(hammer(&c, "e", 10, 60).await, 500);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_on_operations_in_flight_holds() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, |o| o.max_in_flight = 4);
    // 200 callers at once: at most 4 wait for the server, the others for a
    // place, and every one is answered.
    assert_eq!(hammer(&c, "d", 200, 1).await, 200);
    let stats = c.stats();
    assert_eq!(stats.requests, 200);
    assert_eq!(stats.peak_in_flight, 4, "{stats:?}");
    assert_eq!(stats.in_flight, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unary_transport_still_works() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, |o| {
        o.rate_transport = RateTransport::Unary;
        o.max_in_flight = 8;
    });
    assert_eq!(hammer(&c, "d", 30, 20).await, 500);
    let stats = c.stats();
    assert!(
        stats.peak_in_flight > 1 && stats.peak_in_flight <= 8,
        "unary calls share the bound: {stats:?}"
    );
    // Charges and refunds, and a client error that stays one.
    let charged = c.charge("tokens", "d", 12).await.expect("charged");
    assert_eq!((charged.granted, charged.remaining), (12, Some(0)));
    let refunded = c.refund("tokens", "d", 3).await.expect("refunded");
    assert_eq!((refunded.granted, refunded.remaining), (3, Some(1)));
    assert!(matches!(
        c.refund("api", "d", 1).await,
        Err(ref e) if e.is_client()
    ));
    assert!(matches!(
        c.request("nope", "d").send().await,
        Err(ref e) if e.is_client()
    ));
    // Server errors: an error, or a degraded grant when failing open.
    server.answer_server_errors();
    let e = c
        .request("api", "x")
        .send()
        .await
        .expect_err("server error");
    assert!(e.is_server(), "{e:?}");
    let open = client(&server, |o| {
        o.rate_transport = RateTransport::Unary;
        o.fail_open = true;
    });
    let grant = open.request("api", "x").send().await.expect("degraded");
    assert_eq!((grant.granted, grant.source), (1, Source::Degraded));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_errors_are_classified_as_unary_ones() {
    let server = InProcessServer::start(LIMITS).await;
    let c = client(&server, |o| o.fail_open = true);
    // A client error on the session is an error even when failing open,
    // and the session goes on: the next request is decided.
    assert!(matches!(
        c.request("nope", "d").send().await,
        Err(ref e) if e.is_client()
    ));
    let e = c.charge("tokens", "d", 0).await;
    assert!(matches!(e, Err(ref e) if e.is_client()), "{e:?}");
    let g = c.request("api", "d").send().await.expect("ok");
    assert!(g.is_granted(), "{g:?}");
    assert_eq!(c.stats().server_errors, 0);
    server.answer_server_errors();
    let grant = c.request("api", "d").send().await.expect("degraded");
    assert_eq!((grant.granted, grant.source), (1, Source::Degraded));
    assert!(
        c.charge("tokens", "d", 1)
            .await
            .expect_err("no")
            .is_server()
    );
    assert_eq!(c.stats().degraded_grants, 1);
    server.stop().await;
}
