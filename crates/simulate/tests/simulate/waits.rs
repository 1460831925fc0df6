//! Waiting for a copy (SPEC §14) in `charon simulate`: a waiting reserve
//! answers when it is decided, with the `t` of the decision and the
//! event's `id`; at one instant the triggering event's reply comes first,
//! then the waiters served in queue order; a deadline at the same ms as
//! an event comes first; a staged transfer's expiry serves the queue.
//! Every replay runs through the in-memory store and the Redis store (its
//! queue in Redis) and must print the same lines in both.

use charon_core::config::Config;
use charon_simulate::Simulation;
use charon_simulate::redis::{RedisOptions, RedisSimulation};
use charon_testkit::RedisServer;
use serde_json::{Value, json};

const CONFIG: &str = r#"
resources:
  - { name: page, kind: copy, domain_limit: 2, global_limit: 2, queue_limit: 3 }
  - { name: hot, kind: copy, domain_limit: 1, wait_mode: shared_result }
"#;

/// Every line the replay of `events` prints, the end's included, after
/// checking that the replay through the Redis store (`charon simulate
/// --store redis://`, its queue in Redis, on a private redis-server)
/// prints the very same lines and leaves no key behind.
fn replay(events: &[Value]) -> Vec<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let config = Config::from_yaml(CONFIG).expect("valid").0;
    let lines = |mut sim: Simulation| {
        let mut out = Vec::new();
        for e in events {
            let line = serde_json::to_vec(e).expect("encode");
            out.extend(runtime.block_on(sim.lines(&line)));
        }
        out.extend(runtime.block_on(sim.end()));
        out
    };
    let in_memory = lines(Simulation::new(config.clone()));
    let redis = RedisServer::start();
    let (run, sim) = runtime
        .block_on(RedisSimulation::start(
            &redis.url(),
            config,
            RedisOptions::default(),
        ))
        .expect("a replay on the private redis");
    let in_redis = lines(sim);
    runtime
        .block_on(run.finish())
        .expect("the replay's keys deleted");
    assert_eq!(crate::both::keys_left(&redis), 0, "keys left in Redis");
    assert_eq!(in_memory, in_redis, "memory vs Redis");
    in_memory
}

/// (t, id, granted) of each reserve line, and its flags.
fn brief(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let mut s = format!(
                "{} {} {}",
                l["t"],
                l.get("id").map_or("-".to_owned(), Value::to_string),
                l["op"]
            );
            for k in [
                "granted",
                "waited_ms",
                "queue_full",
                "result_ready",
                "left_waiting",
            ] {
                if let Some(v) = l.get(k) {
                    s.push_str(&format!(" {k}={v}"));
                }
            }
            s
        })
        .collect()
}

#[test]
fn waiters_are_served_in_order_and_rejected_at_their_deadline() {
    let r = |t: u64, id: &str, d: &str, copies: u64, wait: u64, s: &str| {
        json!({"t": t, "op": "reserve", "id": id, "resource": "page", "domain": d,
               "copies": copies, "wait_ms": wait, "session": s})
    };
    let out = replay(&[
        r(0, "h", "a", 2, 0, "h"),
        r(1, "w1", "b", 1, 100, "s1"),
        r(2, "w2", "c", 1, 10, "s2"),
        r(3, "w3", "c", 1, 10, "s3"),
        r(4, "full", "e", 1, 10, "s4"),
        r(5, "now", "c", 1, 0, "s5"),
        // w2's deadline is 12: it comes before this release at 12.
        json!({"t": 12, "op": "release", "id": "rel", "resource": "page", "domain": "a", "copies": 1, "session": "h"}),
        json!({"t": 20, "op": "transfer", "resource": "page", "domain": "a", "copies": 1, "ttl_ms": 5, "session": "h"}),
        r(21, "w4", "d", 1, 1000, "s6"),
        r(22, "w5", "f", 1, 1000, "s7"),
        json!({"t": 23, "op": "end_session", "session": "s6"}),
    ]);
    assert_eq!(
        brief(&out),
        [
            "0 \"h\" \"reserve\" granted=2",
            "4 \"full\" \"reserve\" granted=0 waited_ms=0 queue_full=true",
            "5 \"now\" \"reserve\" granted=0",
            "12 \"w2\" \"reserve\" granted=0 waited_ms=10",
            "12 \"rel\" \"release\"",
            "12 \"w1\" \"reserve\" granted=1 waited_ms=11",
            "13 \"w3\" \"reserve\" granted=0 waited_ms=10",
            "20 - \"transfer\"",
            "23 - \"end_session\" left_waiting=1",
            // The staged copy comes back at 25 and goes to w5 (w4 left).
            "25 \"w5\" \"reserve\" granted=1 waited_ms=3",
        ]
    );
}

#[test]
fn a_release_with_its_result_ready_answers_every_waiter_of_the_pair() {
    let r = |t: u64, id: &str, d: &str, s: &str| json!({"t": t, "op": "reserve", "id": id, "resource": "hot", "domain": d, "wait_ms": 50, "session": s});
    let out = replay(&[
        r(0, "h", "x", "h"),
        r(1, "r1", "x", "s1"),
        r(2, "r2", "y", "s2"),
        r(3, "r3", "x", "s3"),
        json!({"t": 10, "op": "release", "resource": "hot", "domain": "x", "session": "h", "result_ready": true}),
    ]);
    assert_eq!(
        brief(&out),
        [
            "0 \"h\" \"reserve\" granted=1 waited_ms=0",
            "2 \"r2\" \"reserve\" granted=1 waited_ms=0",
            "10 - \"release\"",
            "10 \"r1\" \"reserve\" granted=0 waited_ms=9 result_ready=true",
            "10 \"r3\" \"reserve\" granted=0 waited_ms=7 result_ready=true",
        ]
    );
}

#[test]
fn bad_wait_fields_are_client_errors() {
    let out = replay(&[
        json!({"t": 0, "op": "reserve", "resource": "page", "domain": "a", "wait_ms": -1}),
        json!({"t": 0, "op": "reserve", "resource": "page", "domain": "a", "wait_ms": 3_600_001}),
        json!({"t": 0, "op": "release", "resource": "page", "domain": "a", "result_ready": "yes"}),
        json!({"t": 0, "op": "request", "resource": "page", "domain": "a", "wait_ms": 5}),
    ]);
    assert_eq!(out.len(), 4);
    for l in &out {
        assert_eq!(l["error"], "client", "{l}");
    }
}
