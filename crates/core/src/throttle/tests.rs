#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::json;

use super::predictor::{MAX_CLASSES, OTHER_CLASS, next_mean};
use super::*;
use crate::fields::Path;

const C: Criticality = Criticality::Critical;
const N: Criticality = Criticality::NotCritical;

fn qps(rate: u64, queue: u64) -> Throttle {
    Throttle::new(ThrottleConfig::new(Discipline::Qps, rate, queue))
}

fn arrive(t: &mut Throttle, now: u64, id: u64, crit: Criticality) -> Arrived {
    t.advance(now);
    t.arrive(now, id, "GET /a", crit)
}

#[test]
fn qps_starts_then_queues_then_rejects_with_the_time_to_come_back() {
    // 10 per second: one every 100 ms; two may wait.
    let mut t = qps(10, 2);
    assert_eq!(arrive(&mut t, 0, 1, C).admission, Admission::Started);
    assert_eq!(arrive(&mut t, 0, 2, C).admission, Admission::Queued);
    assert_eq!(arrive(&mut t, 0, 3, C).admission, Admission::Queued);
    // Full: the head starts at 100 and frees one place.
    assert_eq!(
        arrive(&mut t, 0, 4, C).admission,
        Admission::Rejected {
            retry_after_ms: 100
        }
    );
    assert_eq!(
        t.advance(250),
        vec![
            Event::Started {
                id: 2,
                at: 100,
                arrived: 0
            },
            Event::Started {
                id: 3,
                at: 200,
                arrived: 0
            },
        ]
    );
    assert_eq!(t.next_event(), None);
    // F is 300: nothing queued, but the bucket is not empty yet.
    assert_eq!(arrive(&mut t, 250, 5, C).admission, Admission::Queued);
    assert_eq!(
        t.advance(400),
        vec![Event::Started {
            id: 5,
            at: 300,
            arrived: 250
        }]
    );
    // F is 400 and nothing waits: it starts at once.
    assert_eq!(arrive(&mut t, 400, 6, C).admission, Admission::Started);
}

#[test]
fn a_start_at_a_fractional_millisecond_is_reported_rounded_up() {
    // 3 per second: 333⅓ ms each.
    let mut t = qps(3, 5);
    arrive(&mut t, 0, 1, C);
    arrive(&mut t, 0, 2, C);
    arrive(&mut t, 0, 3, C);
    assert_eq!(t.next_event(), Some(334));
    assert_eq!(t.advance(333), vec![]);
    assert_eq!(
        t.advance(1000),
        vec![
            Event::Started {
                id: 2,
                at: 334,
                arrived: 0
            },
            Event::Started {
                id: 3,
                at: 667,
                arrived: 0
            },
        ]
    );
    // F is exactly 1000: an arrival at 1000 starts at once.
    assert_eq!(arrive(&mut t, 1000, 4, C).admission, Admission::Started);
}

#[test]
fn a_queued_request_expires_after_max_wait_and_a_start_at_the_deadline_is_in_time() {
    let mut c = ThrottleConfig::new(Discipline::Qps, 10, 10);
    c.max_wait = 200;
    let mut t = Throttle::new(c);
    for id in 1..=4 {
        arrive(&mut t, 0, id, C);
    }
    // Starts at 100 and 200 (200 is exactly the deadline: in time); the
    // third would start at 300, after its deadline 200. It is told to
    // come back when it would start at once: 300.
    let events = t.advance(1000);
    assert_eq!(
        events,
        vec![
            Event::Started {
                id: 2,
                at: 100,
                arrived: 0
            },
            Event::Started {
                id: 3,
                at: 200,
                arrived: 0
            },
            Event::Expired {
                id: 4,
                at: 200,
                retry_after_ms: 100
            },
        ]
    );
}

#[test]
fn a_full_queue_rejects_not_critical_and_critical_evicts_the_most_recent_not_critical() {
    let mut t = qps(10, 3);
    arrive(&mut t, 0, 1, C); // starts
    arrive(&mut t, 0, 2, N);
    arrive(&mut t, 0, 3, C);
    arrive(&mut t, 0, 4, N);
    let n = arrive(&mut t, 0, 5, N);
    assert_eq!(
        n.admission,
        Admission::Rejected {
            retry_after_ms: 100
        }
    );
    assert!(n.evicted.is_empty());
    let c = arrive(&mut t, 0, 6, C);
    assert_eq!(c.admission, Admission::Queued);
    assert_eq!(
        c.evicted,
        vec![Evicted {
            id: 4,
            retry_after_ms: 100
        }],
        "the most recently queued NOT_CRITICAL goes first"
    );
    let c = arrive(&mut t, 0, 7, C);
    assert_eq!(c.evicted.iter().map(|e| e.id).collect::<Vec<_>>(), vec![2]);
    // Only CRITICAL requests wait now: a CRITICAL arrival is rejected and
    // evicts nothing.
    let c = arrive(&mut t, 0, 8, C);
    assert_eq!(
        c.admission,
        Admission::Rejected {
            retry_after_ms: 100
        }
    );
    assert!(c.evicted.is_empty());
}

#[test]
fn a_critical_request_that_cannot_fit_even_after_evicting_evicts_nothing() {
    let mut c = ThrottleConfig::new(Discipline::Cost, 1000, 10);
    c.classes.insert("big".into(), 8_000);
    c.classes.insert("small".into(), 3_000);
    let mut t = Throttle::new(c);
    t.arrive(0, 1, "small", C); // starts; F = 3 ms
    assert_eq!(t.arrive(0, 2, "small", C).admission, Admission::Queued);
    assert_eq!(t.arrive(0, 3, "small", N).admission, Admission::Queued);
    // 6 ms waiting; 8 more would need 4 ms freed, only 3 are evictable.
    let big = t.arrive(0, 4, "big", C);
    assert!(matches!(big.admission, Admission::Rejected { .. }));
    assert!(big.evicted.is_empty());
    assert!(t.is_queued(3));
}

#[test]
fn cost_units_are_predicted_cpu_milliseconds_drained_at_the_cost_rate() {
    // 100 CPU-ms per second; 40 CPU-ms may wait.
    let mut c = ThrottleConfig::new(Discipline::Cost, 100, 40);
    c.classes.insert("POST /render".into(), 40_000);
    let mut t = Throttle::new(c);
    let a = t.arrive(0, 1, "POST /render", C);
    assert_eq!((a.admission, a.predicted_us), (Admission::Started, 40_000));
    // The bucket is busy for 400 ms; a cheap request (5 ms default) waits.
    let b = t.arrive(0, 2, "GET /", C);
    assert_eq!((b.admission, b.predicted_us), (Admission::Queued, 5_000));
    assert_eq!(t.queued_units(), 5.0);
    // 5 + 40 > 40: rejected until the cheap one starts at 400.
    assert_eq!(
        t.arrive(0, 3, "POST /render", C).admission,
        Admission::Rejected {
            retry_after_ms: 400
        }
    );
    assert_eq!(
        t.advance(400),
        vec![Event::Started {
            id: 2,
            at: 400,
            arrived: 0
        }]
    );
}

#[test]
fn more_units_than_the_queue_holds_come_back_when_everything_drained() {
    let mut t = qps(10, 0);
    assert_eq!(arrive(&mut t, 0, 1, C).admission, Admission::Started);
    // Nothing may wait: come back when the bucket is empty, at 100.
    assert_eq!(
        arrive(&mut t, 30, 2, C).admission,
        Admission::Rejected { retry_after_ms: 70 }
    );
    assert_eq!(arrive(&mut t, 100, 3, C).admission, Admission::Started);
}

#[test]
fn a_caller_gone_leaves_the_queue_and_gives_its_units_back() {
    let mut t = qps(10, 1);
    arrive(&mut t, 0, 1, C);
    arrive(&mut t, 0, 2, C);
    assert!(matches!(
        arrive(&mut t, 0, 3, C).admission,
        Admission::Rejected { .. }
    ));
    assert!(t.leave(2));
    assert!(!t.leave(2));
    assert_eq!(arrive(&mut t, 0, 3, C).admission, Admission::Queued);
    assert_eq!(
        t.advance(100),
        vec![Event::Started {
            id: 3,
            at: 100,
            arrived: 0
        }]
    );
}

#[test]
fn reconfiguring_keeps_the_queue_and_carries_f_to_the_new_rate_rounded_up() {
    let mut t = qps(3, 5);
    arrive(&mut t, 0, 1, C);
    arrive(&mut t, 0, 2, C);
    // F = 333⅓ ms; at 7 per second that is 2333⅓ ticks of 1/7 ms, rounded
    // up to 2334 (333.43 ms).
    t.reconfigure(ThrottleConfig::new(Discipline::Qps, 7, 5));
    assert_eq!(t.queue_len(), 1);
    assert_eq!(t.next_event(), Some(334));
    assert_eq!(
        t.advance(334),
        vec![Event::Started {
            id: 2,
            at: 334,
            arrived: 0
        }]
    );
}

#[test]
fn the_predictor_replaces_the_cold_guess_then_averages_then_decays() {
    let mut c = ThrottleConfig::new(Discipline::Cost, 1000, 100);
    c.default_cost_us = 5_000;
    let mut t = Throttle::new(c);
    assert_eq!(t.predict("GET /a"), ("GET /a".to_owned(), 5_000));
    assert_eq!(t.record("GET /a", 3_200), 3_200);
    assert_eq!(t.record("GET /a", 4_800), 4_000);
    assert_eq!(next_mean(1000, 100, 2600), 1100);
    assert_eq!(next_mean(1000, 100, 0), 937);
    assert_eq!(next_mean(0, 5, 0), 1, "never below 1 µs");
}

#[test]
fn classes_beyond_the_bound_share_one_estimate() {
    let mut p = Predictor::default();
    for i in 0..MAX_CLASSES {
        p.record(&format!("c{i}"), 10);
    }
    assert_eq!(p.class_name("c1"), "c1");
    assert_eq!(p.class_name("new"), OTHER_CLASS);
    p.record("new", 500);
    assert_eq!(p.len(), MAX_CLASSES + 1);
    assert_eq!(p.predict_us(OTHER_CLASS, 1), 500);
}

#[test]
fn the_section_is_read_with_every_problem_at_its_path() {
    let ok = json!({
        "discipline": "cost", "rate": 1500, "queue": 3000, "max_wait": "2s",
        "default_criticality": "NOT_CRITICAL", "default_cost": "1.5ms",
        "classes": {"POST /render": "40ms", "GET /": "250us"},
        "reject": {"redirect": "https://example.com/busy"},
        "clients": [
            {"key": "ip", "mask": {"ipv4": 24, "ipv6": 48}, "resource": "edge/per-ip"},
            {"key": "cookie", "name": "session", "global": "api/users"}
        ],
        "charon": {"server": "http://127.0.0.1:7070", "degraded": "safe"}
    });
    let c = ThrottleConfig::from_value(&ok, &Path::root().key("throttle")).unwrap();
    assert_eq!(c.default_cost_us, 1_500);
    assert_eq!(c.classes["GET /"], 250);
    assert_eq!(c.default_criticality, N);
    assert_eq!(
        c.reject,
        Reject::Redirect("https://example.com/busy".into())
    );
    assert_eq!(
        c.clients[0].key,
        ClientKey::Ip {
            ipv4: 24,
            ipv6: 48,
            forwarded: false
        }
    );
    assert_eq!(c.charon.as_ref().unwrap().degraded, Degraded::Safe);

    let bad = json!({
        "discipline": "fast", "rate": 0, "queue": -1, "max_wait": "2x",
        "default_cost": "1.2345ms", "reject": {"status": 418}, "colour": 1,
        "clients": [{"key": "header", "resource": "r"}, {"key": "ip", "mask": {"ipv4": 40}, "global": "g"}]
    });
    let errors = ThrottleConfig::from_value(&bad, &Path::root().key("throttle"))
        .unwrap_err()
        .to_string();
    for expected in [
        "throttle.colour: unknown field",
        "throttle.discipline: expected qps or cost, found the string \"fast\"",
        "throttle.rate: 0 is out of range (1 to 1000000000)",
        "throttle.queue: -1 is negative",
        "throttle.max_wait: \"2x\" is not a duration",
        "throttle.default_cost: \"1.2345ms\" is not a CPU time",
        "throttle.reject.status: 418 is not 429 or 503",
        "throttle.clients[0].name: key header needs the `name` of its header",
        "throttle.clients[1].mask.ipv4: 40 is more than 32 bits",
    ] {
        assert!(
            errors.contains(expected),
            "{expected:?} missing from:\n{errors}"
        );
    }
}

#[test]
fn a_global_limit_without_a_server_is_refused() {
    let v = json!({"discipline": "qps", "rate": 1, "queue": 1,
        "clients": [{"key": "all", "global": "api/all"}]});
    let e = ThrottleConfig::from_value(&v, &Path::root().key("throttle"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("throttle.clients[0].global: a global limit needs"),
        "{e}"
    );
}

/// One input to the machine in the property tests.
#[derive(Debug, Clone)]
enum Step {
    Arrive { dt: u64, class: u8, critical: bool },
    Leave { which: u8 },
    Finish { class: u8, cpu_us: u64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            6 => (0u64..40, 0u8..3, any::<bool>())
                .prop_map(|(dt, class, critical)| Step::Arrive { dt, class, critical }),
            1 => any::<u8>().prop_map(|which| Step::Leave { which }),
            2 => (0u8..3, 1u64..30_000).prop_map(|(class, cpu_us)| Step::Finish { class, cpu_us }),
        ],
        1..200,
    )
}

fn config_strategy() -> impl Strategy<Value = ThrottleConfig> {
    (any::<bool>(), 1u64..2000, 0u64..20, 0u64..500).prop_map(|(cost, rate, queue, wait)| {
        let d = if cost {
            Discipline::Cost
        } else {
            Discipline::Qps
        };
        let mut c = ThrottleConfig::new(d, rate, queue);
        c.max_wait = wait;
        c.default_cost_us = 3_000;
        c
    })
}

proptest! {
    /// The queue never holds more than its size (qps) or cost (cost); a
    /// CRITICAL arrival is refused only if the CRITICAL requests waiting
    /// leave it no room (it never waits or is refused behind a
    /// NOT_CRITICAL request it could evict); evictions take NOT_CRITICAL
    /// requests only, the most recent first, and no more than needed.
    #[test]
    fn queue_bounds_and_criticality(config in config_strategy(), steps in steps()) {
        let bound = config.queue as f64;
        let mut t = Throttle::new(config);
        let mut now = 0;
        let mut next_id = 0;
        // (id, units, critical) in queue order, as the test sees it.
        let mut queued: Vec<(u64, f64, bool)> = Vec::new();
        let mut events = Vec::new();
        for step in steps {
            match step {
                Step::Arrive { dt, class, critical } => {
                    now += dt;
                    events.clear();
                    t.advance_into(now, &mut events);
                    for e in &events {
                        let id = match e { Event::Started { id, .. } | Event::Expired { id, .. } => *id };
                        prop_assert_eq!(queued.first().map(|q| q.0), Some(id), "heads leave first");
                        queued.remove(0);
                    }
                    next_id += 1;
                    let crit = if critical { C } else { N };
                    let before = t.queued_units();
                    let critical_units: f64 = queued.iter().filter(|q| q.2).map(|q| q.1).sum();
                    let a = t.arrive(now, next_id, &format!("c{class}"), crit);
                    let units = if t.config().discipline == Discipline::Qps { 1.0 } else { a.predicted_us as f64 / 1000.0 };
                    match a.admission {
                        Admission::Queued => queued.push((next_id, units, critical)),
                        Admission::Rejected { retry_after_ms } => {
                            prop_assert!(retry_after_ms > 0);
                            prop_assert!(a.evicted.is_empty());
                            prop_assert!(before + units > bound + 1e-9);
                            if critical {
                                prop_assert!(critical_units + units > bound + 1e-9,
                                    "a CRITICAL request refused while NOT_CRITICAL ones held its room");
                            }
                        }
                        Admission::Started => prop_assert!(queued.is_empty()),
                    }
                    let mut freed = 0.0;
                    for (i, e) in a.evicted.iter().enumerate() {
                        prop_assert!(critical);
                        // The most recent NOT_CRITICAL still queued (before this arrival).
                        let pos = queued.iter().rposition(|q| !q.2 && q.0 != next_id).unwrap();
                        prop_assert_eq!(queued[pos].0, e.id);
                        freed += queued[pos].1;
                        queued.remove(pos);
                        if i + 1 < a.evicted.len() {
                            prop_assert!(before - freed + units > bound + 1e-9, "evicted more than needed");
                        }
                    }
                }
                Step::Leave { which } => {
                    if !queued.is_empty() {
                        let i = usize::from(which) % queued.len();
                        prop_assert!(t.leave(queued[i].0));
                        queued.remove(i);
                    }
                }
                Step::Finish { class, cpu_us } => {
                    t.record(&format!("c{class}"), cpu_us);
                }
            }
            prop_assert!(t.queued_units() <= bound + 1e-9, "queue over its bound");
            prop_assert_eq!(t.queue_len(), queued.len());
            let sum: f64 = queued.iter().map(|q| q.1).sum();
            prop_assert!((sum - t.queued_units()).abs() < 1e-6);
        }
    }

    /// The release rate holds: over any stretch, the units started never
    /// exceed `rate × elapsed` plus the one that started the stretch, and
    /// with a queue that never empties they start exactly `1/rate` apart.
    #[test]
    fn release_rate_holds(rate in 1u64..5000, n in 2u64..300) {
        let mut c = ThrottleConfig::new(Discipline::Qps, rate, n);
        c.max_wait = 3_600_000;
        let mut t = Throttle::new(c);
        for id in 0..=n {
            t.arrive(0, id, "x", C);
        }
        let events = t.advance(3_600_000);
        prop_assert_eq!(events.len() as u64, n);
        for (k, e) in events.iter().enumerate() {
            let Event::Started { at, .. } = *e else { panic!("{e:?}") };
            // The (k+1)-th queued request starts at exactly (k+1)/rate s, rounded up.
            let exact = (k as u64 + 1) * 1000;
            prop_assert_eq!(at, exact.div_ceil(rate));
        }
    }

    /// After 20 requests of a class whose cost is constant, the prediction
    /// is within 10 % of it, whatever the starting guess (SPEC §13); after
    /// a step from cost `a` to cost `b` (within a factor of 2), 60 more
    /// requests bring it within 10 % of `b`.
    #[test]
    fn the_predictor_converges(cold in 1u64..10_000_000, a in 1u64..1_000_000, b_pct in 50u64..200) {
        let mut c = ThrottleConfig::new(Discipline::Cost, 1000, 1000);
        c.default_cost_us = cold;
        let mut t = Throttle::new(c);
        for _ in 0..20 {
            t.record("k", a);
        }
        let (_, p) = t.predict("k");
        prop_assert!(p.abs_diff(a) * 10 <= a, "{p} vs {a}");
        let b = (a * b_pct / 100).max(1);
        for _ in 0..60 {
            t.record("k", b);
        }
        let (_, p) = t.predict("k");
        prop_assert!(p.abs_diff(b) * 10 <= b.max(10), "{p} vs {b}");
    }
}

#[test]
fn a_live_throttler_in_nanoseconds_starts_what_a_fast_bucket_allows_within_one_millisecond() {
    // 10 000 per second: one every 100 µs. Five arrivals 100 µs apart all
    // start at once; a sixth 50 µs after the fifth waits for 50 µs.
    let mut t = qps(10_000, 5);
    for (i, us) in [0u64, 100, 200, 300, 400].into_iter().enumerate() {
        let mut events = Vec::new();
        t.advance_into_ns(us * 1000, &mut events);
        let a = t.arrive_ns(us * 1000, i as u64, "x", C);
        assert_eq!(a.admission, Admission::Started, "at {us} µs");
    }
    assert_eq!(t.arrive_ns(450_000, 9, "x", C).admission, Admission::Queued);
    assert_eq!(t.next_event_ns(), Some(500_000));
    let mut events = Vec::new();
    t.advance_into_ns(500_000, &mut events);
    assert_eq!(
        events,
        vec![Event::Started {
            id: 9,
            at: 1,
            arrived: 0
        }]
    );
}
