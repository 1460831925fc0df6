//! SPEC §13 through the runner of `charon simulate`: a deliberately naive
//! model of the server throttler (exact fractions, a list for a queue, the
//! retry time found by draining a copy of the queue head by head, every
//! estimate recomputed from a class's whole history) against the real
//! machine, on random configurations and random arrivals, classes,
//! criticalities, finishes and departures: the lines must be identical.

use std::collections::HashMap;

use charon_core::config::Config;
use charon_core::throttle::{Discipline, ThrottleConfig};
use charon_simulate::Simulation;
use proptest::prelude::*;
use serde_json::{Value, json};

/// An exact non-negative fraction.
#[derive(Debug, Clone, Copy)]
struct Frac(i128, i128);

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

impl Frac {
    fn int(n: i128) -> Self {
        Frac(n, 1)
    }
    fn new(n: i128, d: i128) -> Self {
        let g = gcd(n, d).max(1);
        Frac(n / g, d / g)
    }
    fn add(self, o: Frac) -> Frac {
        Frac::new(self.0 * o.1 + o.0 * self.1, self.1 * o.1)
    }
    fn sub(self, o: Frac) -> Frac {
        Frac::new(self.0 * o.1 - o.0 * self.1, self.1 * o.1)
    }
    fn le(self, o: Frac) -> bool {
        self.0 * o.1 <= o.0 * self.1
    }
    fn ceil(self) -> i128 {
        (self.0 + self.1 - 1).div_euclid(self.1)
    }
}

#[derive(Debug, Clone)]
struct Waiting {
    name: String,
    class: String,
    units: Frac,
    arrived: i128,
    critical: bool,
}

/// The naive throttler.
struct Naive {
    cost: bool,
    rate: i128,
    bound: Frac,
    max_wait: i128,
    default_critical: bool,
    cold: HashMap<String, i128>,
    default_cost: i128,
    f: Frac,
    queue: Vec<Waiting>,
    running: Vec<(String, String)>,
    history: HashMap<String, Vec<i128>>,
}

impl Naive {
    fn new(c: &ThrottleConfig) -> Self {
        Naive {
            cost: c.discipline == Discipline::Cost,
            rate: i128::from(c.rate),
            bound: Frac::int(i128::from(c.queue)),
            max_wait: i128::from(c.max_wait),
            default_critical: c.default_criticality == charon_core::throttle::Criticality::Critical,
            cold: c
                .classes
                .iter()
                .map(|(k, v)| (k.clone(), i128::from(*v)))
                .collect(),
            default_cost: i128::from(c.default_cost_us),
            f: Frac::int(0),
            queue: Vec::new(),
            running: Vec::new(),
            history: HashMap::new(),
        }
    }

    /// The estimate of a class: its history folded, or the cold guess.
    fn estimate(&self, class: &str) -> i128 {
        let cold = *self.cold.get(class).unwrap_or(&self.default_cost);
        let Some(h) = self.history.get(class) else {
            return cold.max(1);
        };
        let mut mean = 0i128;
        for (i, &x) in h.iter().enumerate() {
            let n = (i as i128 + 1).min(16);
            mean = if i == 0 {
                x
            } else {
                let d = x - mean;
                let step = if d >= 0 {
                    (d + n / 2) / n
                } else {
                    -((-d + n / 2) / n)
                };
                mean + step
            };
            mean = mean.max(1);
        }
        mean
    }

    /// How long `units` take to drain, in ms.
    fn span(&self, units: Frac) -> Frac {
        Frac::new(units.0 * 1000, units.1 * self.rate)
    }

    fn total(q: &[Waiting]) -> Frac {
        q.iter().fold(Frac::int(0), |s, w| s.add(w.units))
    }

    /// Until the queue and the bucket are empty.
    fn idle(&self, now: i128) -> i128 {
        self.retry(now, self.bound.add(Frac::int(1)))
    }

    fn retry(&self, now: i128, units: Frac) -> i128 {
        let now_f = Frac::int(now);
        if !units.le(self.bound) {
            let mut end = if self.f.le(now_f) { now_f } else { self.f };
            for w in &self.queue {
                end = end.add(self.span(w.units));
            }
            return end.sub(now_f).ceil().max(0);
        }
        let mut rest = self.queue.clone();
        let mut time = self.f;
        if Naive::total(&rest).add(units).le(self.bound) {
            return 0;
        }
        loop {
            let head = rest.remove(0);
            let start = time;
            time = time.add(self.span(head.units));
            if Naive::total(&rest).add(units).le(self.bound) {
                return start.sub(now_f).ceil().max(0);
            }
        }
    }

    /// What happens by itself up to `t`.
    fn advance(&mut self, t: i128, out: &mut Vec<Value>) {
        while let Some(head) = self.queue.first().cloned() {
            let deadline = head.arrived + self.max_wait;
            if self.f.le(Frac::int(deadline)) {
                if !self.f.le(Frac::int(t)) {
                    break;
                }
                out.push(json!({"t": self.f.ceil(), "id": head.name, "outcome": "started"}));
                self.f = self.f.add(self.span(head.units));
                self.queue.remove(0);
                self.running.push((head.name, head.class));
            } else {
                if deadline > t {
                    break;
                }
                self.queue.remove(0);
                let r = self.idle(deadline);
                out.push(json!({"t": deadline, "id": head.name, "outcome": "expired", "retry_after_ms": r}));
            }
        }
    }

    fn arrive(
        &mut self,
        t: i128,
        name: &str,
        class: &str,
        critical: Option<bool>,
        out: &mut Vec<Value>,
    ) {
        let critical = critical.unwrap_or(self.default_critical);
        let predicted = self.estimate(class);
        let units = if self.cost {
            Frac::new(predicted, 1000)
        } else {
            Frac::int(1)
        };
        let p = json!(predicted as f64 / 1000.0);
        let now = Frac::int(t);
        let w = Waiting {
            name: name.into(),
            class: class.into(),
            units,
            arrived: t,
            critical,
        };
        if self.queue.is_empty() && self.f.le(now) {
            self.f = now.add(self.span(units));
            self.running.push((name.into(), class.into()));
            out.push(json!({"t": t, "id": name, "outcome": "started", "predicted_ms": p}));
        } else if Naive::total(&self.queue).add(units).le(self.bound) {
            self.queue.push(w);
            out.push(json!({"t": t, "id": name, "outcome": "queued", "predicted_ms": p}));
        } else {
            let critical_units = self
                .queue
                .iter()
                .filter(|w| w.critical)
                .fold(Frac::int(0), |s, w| s.add(w.units));
            if critical && critical_units.add(units).le(self.bound) {
                let mut evicted = Vec::new();
                while !Naive::total(&self.queue).add(units).le(self.bound) {
                    let i = self
                        .queue
                        .iter()
                        .rposition(|w| !w.critical)
                        .expect("evictable");
                    evicted.push(self.queue.remove(i));
                }
                self.queue.push(w);
                out.push(json!({"t": t, "id": name, "outcome": "queued", "predicted_ms": p}));
                for e in evicted {
                    let r = self.retry(t, e.units);
                    out.push(
                        json!({"t": t, "id": e.name, "outcome": "evicted", "retry_after_ms": r}),
                    );
                }
            } else {
                let r = self.retry(t, units);
                out.push(json!({"t": t, "id": name, "outcome": "rejected", "predicted_ms": p, "retry_after_ms": r}));
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Pick {
    Arrive {
        dt: u64,
        class: u8,
        critical: Option<bool>,
    },
    Finish {
        dt: u64,
        which: usize,
        cpu_us: u64,
    },
    Leave {
        dt: u64,
        which: usize,
    },
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0u64..80, 0u8..3, prop_oneof![Just(None), Just(Some(true)), Just(Some(false))])
                .prop_map(|(dt, class, critical)| Pick::Arrive { dt, class, critical }),
            3 => (0u64..80, any::<usize>(), 0u64..40_000)
                .prop_map(|(dt, which, cpu_us)| Pick::Finish { dt, which, cpu_us }),
            2 => (0u64..80, any::<usize>()).prop_map(|(dt, which)| Pick::Leave { dt, which }),
        ],
        1..120,
    )
}

fn configs() -> impl Strategy<Value = ThrottleConfig> {
    (
        any::<bool>(),
        1u64..60,
        0u64..8,
        0u64..600,
        any::<bool>(),
        1u64..20_000,
        1u64..30_000,
    )
        .prop_map(
            |(cost, rate, queue, wait, critical, default_cost, class1)| {
                let d = if cost {
                    Discipline::Cost
                } else {
                    Discipline::Qps
                };
                // The cost discipline's queue holds predicted CPU-ms: scale it
                // so that a few requests fit.
                let mut c = ThrottleConfig::new(
                    d,
                    if cost { rate * 10 } else { rate },
                    if cost { queue * 8 } else { queue },
                );
                c.max_wait = wait;
                c.default_cost_us = default_cost;
                c.default_criticality = if critical {
                    charon_core::throttle::Criticality::Critical
                } else {
                    charon_core::throttle::Criticality::NotCritical
                };
                c.classes.insert("c1".into(), class1);
                c
            },
        )
}

fn run(config: ThrottleConfig, picks: Vec<Pick>) -> (Vec<Value>, Vec<Value>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let (limits, _) = Config::from_yaml("resources: []").expect("valid");
    let mut sim = Simulation::new(limits).with_throttle(Some(config.clone()));
    let mut naive = Naive::new(&config);
    let (mut real, mut model) = (Vec::new(), Vec::new());
    let mut t = 0u64;
    let mut next = 0;
    for pick in picks {
        let event = match pick {
            Pick::Arrive {
                dt,
                class,
                critical,
            } => {
                t += dt;
                next += 1;
                naive.advance(i128::from(t), &mut model);
                let (name, class) = (format!("r{next}"), format!("c{class}"));
                naive.arrive(i128::from(t), &name, &class, critical, &mut model);
                let mut e = json!({"t": t, "op": "arrive", "id": name, "class": class});
                if let Some(c) = critical {
                    e["critical"] = json!(c);
                }
                e
            }
            Pick::Finish { dt, which, cpu_us } => {
                t += dt;
                naive.advance(i128::from(t), &mut model);
                if naive.running.is_empty() {
                    continue;
                }
                let (name, class) = naive.running.remove(which % naive.running.len());
                naive
                    .history
                    .entry(class.clone())
                    .or_default()
                    .push(i128::from(cpu_us));
                let estimate = naive.estimate(&class);
                model.push(json!({"t": t, "id": name, "class": class, "predicted_ms": estimate as f64 / 1000.0}));
                json!({"t": t, "op": "finish", "id": name, "cpu_ms": cpu_us as f64 / 1000.0})
            }
            Pick::Leave { dt, which } => {
                t += dt;
                naive.advance(i128::from(t), &mut model);
                let n = naive.queue.len() + naive.running.len();
                if n == 0 {
                    continue;
                }
                let i = which % n;
                let name = if i < naive.queue.len() {
                    naive.queue.remove(i).name
                } else {
                    naive.running.remove(i - naive.queue.len()).0
                };
                model.push(json!({"t": t, "id": name, "outcome": "left"}));
                json!({"t": t, "op": "leave", "id": name})
            }
        };
        let line = serde_json::to_vec(&event).expect("encode");
        real.extend(runtime.block_on(sim.lines(&line)));
    }
    real.extend(runtime.block_on(sim.end()));
    naive.advance(1 << 50, &mut model);
    (real, model)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn the_simulated_throttler_matches_the_naive_model(config in configs(), picks in picks()) {
        let (real, model) = run(config, picks);
        prop_assert_eq!(real, model);
    }
}

#[test]
fn the_spec_example_lines() {
    let config = ThrottleConfig::from_value(
        &json!({"discipline": "cost", "rate": 100, "queue": 10, "max_wait": "300ms", "default_cost": "5ms"}),
        &charon_core::fields::Path::root().key("throttle"),
    )
    .expect("valid");
    let (real, model) = run(
        config,
        vec![
            Pick::Arrive {
                dt: 0,
                class: 0,
                critical: Some(true),
            },
            Pick::Arrive {
                dt: 0,
                class: 0,
                critical: Some(false),
            },
            Pick::Finish {
                dt: 10,
                which: 0,
                cpu_us: 3200,
            },
        ],
    );
    assert_eq!(real, model);
    assert_eq!(
        real,
        vec![
            json!({"t": 0, "id": "r1", "outcome": "started", "predicted_ms": 5.0}),
            json!({"t": 0, "id": "r2", "outcome": "queued", "predicted_ms": 5.0}),
            json!({"t": 10, "id": "r1", "class": "c0", "predicted_ms": 3.2}),
            json!({"t": 50, "id": "r2", "outcome": "started"}),
        ]
    );
}
