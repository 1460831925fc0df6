//! Waiting for a copy across a fleet (SPEC §14): two servers on one
//! private Redis, a resource of 5 copies, 200 waiters joining through
//! both servers in turn, holders released at random. Every released copy
//! goes to the waiter that arrived first, whichever server it waits on.
//! Then one server is killed (its runtime shut down: no clean-up of its
//! own): once its liveness lapses the other server removes its holds and
//! its waiters from the queue, the copies it held go to the next waiters
//! of the live server in their order, and the rest continue in order. At
//! the end the counts are exact: nothing leaked, nothing held twice.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_testkit::{InProcessServer, RedisServer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::copy_waits::{Session, release, reserve, reserved};

const LIMITS: &str = r#"
resources:
  - name: pool
    kind: copy
    domain_limit: 1
    global_limit: 5
    queue_limit: 300
"#;

const COPIES: usize = 5;
const WAITERS: usize = 200;
const LIVENESS: Duration = Duration::from_secs(3);

/// A session holding one copy: where it is, and its domain.
struct Holder {
    session: Session,
    on_b: bool,
    domain: String,
}

/// What a waiter came to: its number and its reply (`None`: its stream
/// failed, its server died), with its session to release through.
type Answer = (usize, Option<Reply>, Session);

async fn client(server: &InProcessServer) -> LimiterClient<Channel> {
    LimiterClient::connect(server.endpoint())
        .await
        .expect("connect")
}

/// Callers waiting for `pool`, as the store (Redis) counts them.
async fn waiting(server: &InProcessServer) -> u64 {
    let lengths = server
        .limiter()
        .store()
        .queue_lengths()
        .await
        .expect("lengths");
    lengths
        .iter()
        .find(|(r, _)| r == "pool")
        .map_or(0, |(_, n)| *n)
}

async fn until_waiting(server: &InProcessServer, n: u64, within: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if waiting(server).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} callers never waited (now {})", waiting(server).await);
}

/// The copies Redis counts for `pool`.
fn counted(redis: &RedisServer) -> u64 {
    let mut c = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("a connection to the private redis");
    let g: Option<u64> = redis::cmd("HGET")
        .arg("charon:{pool}:c")
        .arg("g")
        .query(&mut c)
        .expect("HGET");
    g.unwrap_or(0)
}

fn released(r: Reply) {
    assert!(matches!(r, Reply::Release(_)), "{r:?}");
}

/// The next answer, within a generous bound (a hang is a failure).
async fn next(rx: &mut mpsc::UnboundedReceiver<Answer>) -> Answer {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("an answer within a minute")
        .expect("the channel is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_hand_copies_over_in_arrival_order_and_survive_one_dying() {
    let redis = RedisServer::start();
    let url = redis.url();
    let a = InProcessServer::start_on_redis(LIMITS, &url, LIVENESS).await;
    // Server B runs on a runtime of its own, so that it can be killed.
    let b_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let b_url = url.clone();
    let b = b_runtime
        .spawn(async move { InProcessServer::start_on_redis(LIMITS, &b_url, LIVENESS).await })
        .await
        .expect("server B starts");
    // Both serve copies once the new Redis's rebuild window has passed.
    for s in [&a, &b] {
        let start = std::time::Instant::now();
        while s.limiter().store().ping().await.is_err() {
            assert!(start.elapsed() < LIVENESS * 10, "the store never got ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut clients = [client(&a).await, client(&b).await];
    let mut rng = StdRng::seed_from_u64(30);

    // Five holders, on both servers.
    let mut holders = Vec::new();
    for i in 0..COPIES {
        let on_b = i % 2 == 1;
        let domain = format!("h{i}");
        let mut session = Session::open(&mut clients[usize::from(on_b)]).await;
        let r = reserved(session.call(reserve("pool", &domain, 0)).await);
        assert_eq!(r.granted, 1, "{r:?}");
        holders.push(Holder {
            session,
            on_b,
            domain,
        });
    }

    // 200 waiters, through A and B in turn, each after the one before is
    // in the queue: their arrival order is their number.
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    for i in 0..WAITERS {
        let on_b = i % 2 == 1;
        let mut session = Session::open(&mut clients[usize::from(on_b)]).await;
        let tx = tx.clone();
        tokio::spawn(async move {
            session
                .send(reserve("pool", &format!("w{i}"), 600_000))
                .await;
            let reply = session.try_reply().await;
            let _ = tx.send((i, reply, session));
        });
        until_waiting(&a, i as u64 + 1, Duration::from_secs(30)).await;
    }
    let mut queue: VecDeque<usize> = (0..WAITERS).collect();

    // Half of the holders' releases, at random, while both servers live:
    // each copy goes to the first waiter, on whichever server.
    // Counts as of after the grant: all 5 held when a release hands its
    // copy over; fewer for all but the last when a dead server's clean-up
    // hands several over at once.
    let hand_over = |holders: &mut Vec<Holder>, (i, reply, session): Answer, all_held: bool| {
        let r = reserved(reply.expect("a reply"));
        assert_eq!(r.granted, 1, "{r:?}");
        if all_held {
            assert_eq!(r.global_holds, COPIES as u64, "{r:?}");
        } else {
            assert!(r.global_holds <= COPIES as u64, "{r:?}");
        }
        assert!(r.waited_ms.is_some(), "{r:?}");
        holders.push(Holder {
            session,
            on_b: i % 2 == 1,
            domain: format!("w{i}"),
        });
    };
    for _ in 0..WAITERS / 2 {
        let mut h = holders.swap_remove(rng.random_range(0..holders.len()));
        released(h.session.call(release("pool", &h.domain, false)).await);
        let answer = next(&mut rx).await;
        let first = queue.pop_front().expect("someone waits");
        assert_eq!(answer.0, first, "the copy went to the first waiter");
        hand_over(&mut holders, answer, true);
    }
    assert_eq!(counted(&redis), COPIES as u64);

    // Server B dies. Its waiters' streams fail; its holders' copies and its
    // waiters stay counted and queued until its liveness lapses.
    b_runtime.shutdown_background();
    holders.retain(|h| !h.on_b);
    queue.retain(|i| i % 2 == 0);
    // A copy released now may go to a dead server's waiter first: it
    // comes back when that server is cleaned up.
    if let Some(mut h) = holders.pop() {
        released(h.session.call(release("pool", &h.domain, false)).await);
    }
    // Once B is counted dead, the copies free go to A's first waiters, in
    // order; B's waiters have left the queue.
    let free = COPIES - holders.len();
    let mut served = BTreeSet::new();
    while served.len() < free {
        let answer = next(&mut rx).await;
        if answer.0 % 2 == 1 {
            assert!(answer.1.is_none(), "a reply from a dead server");
            continue;
        }
        served.insert(answer.0);
        hand_over(&mut holders, answer, false);
    }
    let firsts: BTreeSet<usize> = queue.drain(..free).collect();
    assert_eq!(served, firsts, "A's first waiters, in order");
    until_waiting(&a, queue.len() as u64, LIVENESS * 10).await;
    assert_eq!(counted(&redis), COPIES as u64);

    // The rest of A's waiters, in order, as copies come back.
    while let Some(first) = queue.pop_front() {
        let mut h = holders.swap_remove(rng.random_range(0..holders.len()));
        released(h.session.call(release("pool", &h.domain, false)).await);
        let mut answer = next(&mut rx).await;
        while answer.0 % 2 == 1 {
            answer = next(&mut rx).await;
        }
        assert_eq!(answer.0, first, "the copy went to the first waiter");
        hand_over(&mut holders, answer, true);
    }
    for mut h in holders {
        released(h.session.call(release("pool", &h.domain, false)).await);
    }
    assert_eq!(counted(&redis), 0, "every copy came back");
    assert_eq!(waiting(&a).await, 0);
    drop(b);
    a.stop().await;
}
