//! Batched decisions on Redis (issue 13, item 3; `batch.rs`,
//! `batch.lua`): operations that arrive while a call for their hash slot is
//! in flight go to Redis together, and must be decided exactly as they
//! would be alone.
//!
//! - The differential test through the batched path: random meters and
//!   burst tiers (core's shapes, H, G, policies), rounds of up to 60
//!   operations sent at once in a fixed order (the same pair several times,
//!   several resources, so several slots), on the Redis store, and the same
//!   operations one by one in that order on the in-memory store at the same
//!   instant: identical replies and client errors. Batches must form.
//! - A batch never mixes up replies: 200 concurrent requests on distinct
//!   pairs, each asking a different number of units, each granted its own.
//! - Deliberate mutations of the batch script are caught (the scripts of
//!   single operations stay intact, so only the batched path can fail).
//!   `CHARON_DIFF_SEEDS` and `CHARON_DIFF_SEED` work as in
//!   `meters_differential.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use charon_core::ManualClock;
use charon_core::meter::testing as shapes;
use charon_core::meter::{Meter, Op};
use charon_core::request::Amount;
use charon_store::{MemoryStore, MeterOp, RedisOptions, RedisStore, Store};
use charon_testkit::RedisServer;
use charon_testkit::stores::{Kind, Seeded, assert_each_mutation_caught, kind, single};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const RESOURCES: &[&str] = &["b/bucket", "b/window", "b/queue", "b/tiers", "b/any"];
const DOMAINS: &[&str] = &["alice", "bob", "carol", "10.0.0.0/8"];

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Polls `futures` in their order until all are done. Each sends its
/// operation to the batcher on its first poll, so the batcher receives
/// them in this order, and decides those of one slot in this order.
async fn in_order<T>(mut futures: Vec<Boxed<'_, T>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none()
                && let Poll::Ready(v) = f.as_mut().poll(cx)
            {
                *slot = Some(v);
            }
        }
        if out.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

async fn redis_store(
    redis: &RedisServer,
    clock: &Arc<ManualClock>,
    prefix: String,
    mutation: Option<(&str, &str)>,
) -> Arc<RedisStore> {
    let options = RedisOptions {
        key_prefix: prefix,
        meters_mutation: mutation.map(|(a, b)| (a.to_owned(), b.to_owned())),
        ..charon_testkit::stores::options(
            Some(clock.clone()),
            "batched",
            std::time::Duration::from_secs(10),
        )
    };
    RedisStore::connect(&redis.url(), options).await.unwrap()
}

/// One seed: `Err` with the story when the stores disagree; the number of
/// batch calls that carried more than one operation.
async fn run(
    seed: u64,
    rounds: usize,
    redis: &RedisServer,
    mutation: Option<(&str, &str)>,
) -> Result<u64, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = 1_700_000_000_000 + rng.random_range(0..1_000_000);
    let unit = [1, 7, 50][rng.random_range(0..3usize)];
    let kinds: Vec<Kind> = (0..RESOURCES.len() as u64)
        .map(|i| {
            let k = if i < 4 { i } else { rng.random_range(0..4) };
            kind(&mut rng, k, unit)
        })
        .collect();
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(clock.clone());
    let prefix = format!("batched{seed}{}", u8::from(mutation.is_some()));
    let store = redis_store(redis, &clock, prefix, mutation).await;
    let mut log: Vec<String> = Vec::new();
    for round in 0..rounds {
        let n = rng.random_range(1..=60);
        let mut ops: Vec<MeterOp<'_>> = Vec::with_capacity(n);
        let mut gap = 0;
        for _ in 0..n {
            let r = rng.random_range(0..RESOURCES.len());
            let k = &kinds[r];
            let most = match k {
                Kind::Meter(m) => m.limit() + 2,
                Kind::Tiers(..) => 6,
            };
            let (g, op) = shapes::step(&mut Seeded(&mut rng), unit, most);
            gap = gap.max(g);
            ops.push(MeterOp {
                resource: RESOURCES[r],
                domain: DOMAINS[rng.random_range(0..DOMAINS.len())],
                limit: k.limit(),
                op,
                shadow: false,
                slot: None,
            });
        }
        // Now and then no time passes between rounds.
        if rng.random_range(0..4) > 0 {
            clock.advance(gap);
        }
        let on_redis = in_order(
            ops.iter()
                .map(|o| -> Boxed<'_, String> { Box::pin(single(&*store, o)) })
                .collect(),
        )
        .await;
        for (o, got) in ops.iter().zip(&on_redis) {
            let want = single(&memory, o).await;
            let what = format!(
                "round {round} t={} {}/{} {:?}",
                charon_core::Clock::now(&*clock),
                o.resource,
                o.domain,
                o.op
            );
            log.push(format!("{what} -> {want}"));
            if &want != got {
                let pair = format!("{}/{} ", o.resource, o.domain);
                let mine: Vec<&String> = log.iter().filter(|l| l.contains(&pair)).collect();
                let tail = &mine[mine.len().saturating_sub(12)..];
                return Err(format!(
                    "seed {seed}: the stores disagree at {what}\n  memory: {want}\n  redis:  {got}\n\
                     kinds (unit {unit}): {kinds:?}\nlast operations:\n{}\n\
                     replay with CHARON_DIFF_SEED={seed}",
                    tail.iter()
                        .map(|s| format!("  {s}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                ));
            }
        }
    }
    Ok(store.batch_counts().0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_decisions_equal_the_in_memory_stores_one_by_one() {
    let redis = RedisServer::start();
    let mut batches = 0;
    for seed in charon_testkit::stores::diff_seeds() {
        match run(seed, 60, &redis, None).await {
            Ok(n) => batches += n,
            Err(story) => panic!("{story}"),
        }
    }
    assert!(batches > 0, "no batch of more than one operation formed");
}

/// Each mutation breaks the batch script only; the differential must find
/// every one within a few seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batched_differential_catches_a_broken_batch_script() {
    let redis = RedisServer::start();
    let redis = &redis;
    assert_each_mutation_caught(
        &[
            // A tiers operation decided on the first operation's keys: replies
            // and states of pairs mixed up.
            ("pcall(rate_step, k - 1,", "pcall(rate_step, 0,"),
            // The tiers' rule, inside the batch script only (one more hit fits
            // in the current tier).
            (
                "local room = math.max(tiers[at].limit - tier_hits(st, at), 0)",
                "local room = math.max(tiers[at].limit + 1 - tier_hits(st, at), 0)",
            ),
            // The next operation's arguments read one place too early.
            ("a = a + 12 + 5 * n", "a = a + 11 + 5 * n"),
            // Meters alone (meter_batch.lua): a later operation on a key does
            // not see what the earlier ones of the batch left.
            (
                "held[key], pending[key], forgets[key] = value, value, forget",
                "pending[key], forgets[key] = value, forget",
            ),
            // Meters alone: each operation reads Redis, where the batch has not
            // written yet.
            ("if raw == nil then", "if true then"),
        ],
        1..=6,
        async |seed, mutation| run(seed, 40, redis, Some(mutation)).await.is_err(),
    )
    .await;
}

/// 200 requests at once, each on its own pair of one bucket (so one slot)
/// and asking a different number of units (1 to 200, exactly): each must
/// be granted exactly its own, whichever batch it went in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_never_mixes_up_replies() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = redis_store(&redis, &clock, "mixup".into(), None).await;
    let bucket = Meter::Bucket(
        charon_core::bucket::Params::new(1_000, 1_000, 1_000, Default::default()).unwrap(),
    );
    let domains: Vec<String> = (0..200).map(|i| format!("d{i}")).collect();
    let calls = domains.iter().enumerate().map(|(i, d)| {
        let store = store.clone();
        let d = d.clone();
        tokio::spawn(async move {
            let op = Op::Request {
                amount: Amount::exactly(i as u64 + 1).unwrap(),
                dry_run: false,
            };
            store.meter("api", &d, &bucket, op).await.unwrap()
        })
    });
    let calls: Vec<_> = calls.collect();
    for (i, call) in calls.into_iter().enumerate() {
        let reply = call.await.unwrap();
        assert_eq!(
            reply.granted,
            i as u64 + 1,
            "request {i} got another's reply"
        );
        assert_eq!(reply.remaining, 1_000 - (i as u64 + 1), "request {i}");
    }
    let (batches, batched) = store.batch_counts();
    assert!(
        batches > 0 && batched > batches,
        "batches formed: {batches}, {batched}"
    );
}

/// `n` one-unit requests at once on distinct pairs of one bucket (one
/// slot, so batches form behind the first).
async fn burst_of_requests(store: &Arc<RedisStore>, n: usize, round: usize) -> Vec<bool> {
    let bucket = Meter::Bucket(
        charon_core::bucket::Params::new(1_000, 1_000, 1_000, Default::default()).unwrap(),
    );
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let op = Op::Request {
                    amount: Amount::exactly(1).unwrap(),
                    dry_run: false,
                };
                let domain = format!("r{round}d{i}");
                match store.meter("api", &domain, &bucket, op).await {
                    Ok(r) => {
                        assert_eq!(r.granted, 1);
                        true
                    }
                    Err(charon_store::StoreError::Unavailable(_)) => false,
                    Err(e) => panic!("not a server error: {e}"),
                }
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

/// Redis stalled (SIGSTOP) while batches are queued: shorter than the
/// operation timeout, every operation is answered; longer, every one
/// fails as a server error (none hangs: the caller's own bound holds), and
/// the next ones are answered once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_answers_or_fails_every_batched_operation_and_service_resumes() {
    let redis = RedisServer::start();
    let options = RedisOptions {
        key_prefix: "stall".into(),
        op_timeout: std::time::Duration::from_millis(800),
        ..charon_testkit::stores::options(None, "stall", std::time::Duration::from_secs(10))
    };
    let store = RedisStore::connect(&redis.url(), options).await.unwrap();
    assert!(burst_of_requests(&store, 50, 0).await.iter().all(|ok| *ok));

    redis.stop();
    let short = tokio::spawn({
        let store = store.clone();
        async move { burst_of_requests(&store, 200, 1).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    redis.resume();
    let answered = short.await.unwrap();
    assert!(answered.iter().all(|ok| *ok), "a short stall answers all");

    redis.stop();
    let long = burst_of_requests(&store, 200, 2).await;
    redis.resume();
    assert!(
        long.iter().all(|ok| !ok),
        "a long stall fails all: {long:?}"
    );

    let back = charon_testkit::stores::eventually(std::time::Duration::from_secs(10), async || {
        burst_of_requests(&store, 20, 3).await.iter().all(|ok| *ok)
    })
    .await;
    assert!(back.is_some(), "service resumes after the stall");
}
