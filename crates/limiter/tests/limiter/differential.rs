//! The randomized differential test: the same random scenarios — rate and
//! copy operations, multi-hit, several domains, sessions with their hold
//! sets, transfers, seizes, ends of sessions, time jumps past windows,
//! cooldowns, forget times and transfer expiry — through the in-memory
//! store and the Redis store on one manual clock must give identical
//! replies. This is what keeps the Lua port of `decide` equal to the Rust.
//!
//! Each seed has its own random configuration: tier lists, per-domain
//! overrides, H and G from the generator of the naive-model property test,
//! soft limits and bans, a random bucket, window and queue (SPEC §7–§10),
//! and random copy limits and groups, so the scripts see every shape. Rate
//! operations are requests, dry runs, charges and refunds on every kind.
//!
//! `CHARON_DIFF_SEEDS=n` runs more seeds; a failure prints its seed, and
//! `CHARON_DIFF_SEED=s` replays that one.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use charon_core::config::{Config, Tier};
use charon_core::copy::Hold;
use charon_core::rate::DORMANT_GRACE;
use charon_core::request::Amount;
use charon_core::testing::{self, Draw};
use charon_core::{MAX_COUNT, ManualClock};
use charon_limiter::{Decision, LimitError, Limiter, RequestOptions, Session};
use charon_store::MemoryStore;
use charon_testkit::RedisServer;
use charon_testkit::stores::Seeded;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// What every seed has: namespaces that allow unconfigured resources and
/// ignore configured limits, and a resource in each. The rest of the
/// configuration is random per seed (see [`config`]).
const FIXED: &str = r#"
namespaces:
  free: { allow_unconfigured: true }
  loose: { ignore_configured: true, allow_unconfigured: true }
resources:
  - name: loose/r
    kind: rate
    tiers:
      - { limit: 1, window: 100ms }
  - name: loose/vm
    kind: copy
    domain_limit: 1
"#;

/// Random rate resources (`api/*`), buckets, windows and queues (`m/*`)
/// and copy resources (`vm/*`).
const RANDOM_RATE: &[&str] = &["api/a", "api/b", "api/c"];
const RANDOM_COPY: &[&str] = &["vm/x", "vm/y"];

/// Every span of a random tier is a multiple of this, and so are most time
/// jumps: boundaries (t + window, entry + active, + cooldown, + 1000 for H
/// and G) are hit exactly, and the 1 ms steps land just after them.
const UNIT: u64 = 50;

/// A limit as drawn, or one time in `huge_one_in` a count at or near the
/// bound (so that huge requests can be granted, and sums cross it).
fn limit(rng: &mut StdRng, drawn: u64, huge_one_in: u32) -> u64 {
    if rng.random_range(0..huge_one_in) == 0 {
        HUGE[rng.random_range(0..HUGE.len())]
    } else {
        drawn
    }
}

fn span(ms: u64) -> String {
    format!("{ms}ms")
}

fn tiers_yaml(rng: &mut StdRng, tiers: &[Tier], indent: &str) -> String {
    if tiers.is_empty() {
        return " []\n".to_owned();
    }
    let mut y = "\n".to_owned();
    for t in tiers {
        let active = t.active.map_or_else(|| "infinite".to_owned(), span);
        y += &format!(
            "{indent}- {{ limit: {}, window: {}, active: {active}, cooldown: {}, skippable: {} }}\n",
            limit(rng, t.limit, 16),
            span(t.window),
            span(t.cooldown),
            t.skippable
        );
    }
    y
}

/// A random `soft_limit` and `ban` (SPEC §10), each one time in three;
/// bans are short enough to end within a scenario.
fn policy_yaml(rng: &mut StdRng, indent: &str, shapes: &mut Vec<String>) -> String {
    let mut y = String::new();
    if rng.random_range(0..3) == 0 {
        y += &format!(
            "{indent}soft_limit: {}%
",
            rng.random_range(1..=100)
        );
        shapes.push("config: soft limit".to_owned());
    }
    if rng.random_range(0..3) == 0 {
        let ban = if rng.random_range(0..4) == 0 {
            rng.random_range(1..=3)
        } else {
            UNIT * rng.random_range(1..=40)
        };
        y += &format!(
            "{indent}ban: {ban}ms
"
        );
        shapes.push("config: ban".to_owned());
    }
    y
}

/// A random bucket, window and queue (SPEC §7–§9) with their soft limits,
/// bans and overrides.
fn meters_yaml(rng: &mut StdRng, shapes: &mut Vec<String>) -> String {
    let mut y = String::new();
    let period = |rng: &mut StdRng| span(UNIT * rng.random_range(1..=20));
    y += &format!(
        "  - name: m/b
    kind: bucket
    burst: {}
    count: {}
    period: {}
",
        rng.random_range(1..=6),
        rng.random_range(1..=5),
        period(rng)
    );
    y += &policy_yaml(rng, "    ", shapes);
    if rng.random_range(0..2) == 0 {
        y += &format!(
            "    domains: {{ d1: {{ count: {} }} }}
",
            rng.random_range(1..=9)
        );
    }
    let algorithm = if rng.random_range(0..2) == 0 {
        "fixed"
    } else {
        "sliding_counter"
    };
    shapes.push(format!("config: window {algorithm}"));
    y += &format!(
        "  - name: m/w
    kind: window
    algorithm: {algorithm}
    limit: {}
    window: {}
",
        rng.random_range(1..=6),
        period(rng)
    );
    y += &policy_yaml(rng, "    ", shapes);
    y += &format!(
        "  - name: m/q
    kind: queue
    rate: {}
    period: {}
    size: {}
",
        rng.random_range(1..=5),
        period(rng),
        rng.random_range(1..=6)
    );
    y += &policy_yaml(rng, "    ", shapes);
    y
}

fn optional(rng: &mut StdRng, key: &str, v: Option<u64>, indent: &str) -> String {
    v.map_or_else(String::new, |v| {
        format!("{indent}{key}: {}\n", limit(rng, v, 12))
    })
}

/// The configuration of one seed: [`FIXED`] and random tier lists, H, G
/// and per-domain overrides (tiers, H) for the rate resources, the
/// generator of the naive-model property test (`charon_core::testing`);
/// random domain and global limits, per-domain limits and groups for the
/// copy resources. Limits are small, and now and then near the bound.
fn config(rng: &mut StdRng, shapes: &mut Vec<String>) -> String {
    let mut y = FIXED.to_owned();
    for name in RANDOM_RATE {
        let (tiers, hard, global) = testing::rate_limits(&mut Seeded(rng), UNIT);
        shapes.push(format!("config: rate resource with {} tiers", tiers.len()));
        y += &format!("  - name: {name}\n    kind: rate\n");
        y += &optional(rng, "hard_limit", hard, "    ");
        y += &optional(rng, "global_limit", global, "    ");
        y += &policy_yaml(rng, "    ", shapes);
        y += "    tiers:";
        y += &tiers_yaml(rng, &tiers, "      ");
        let mut overrides = String::new();
        for d in DOMAINS {
            if rng.random_range(0..3) != 0 {
                continue;
            }
            overrides += &format!("      {d}:\n");
            let hard = Seeded(rng).maybe(0..=12);
            let tiers = (hard.is_none() || rng.random_range(0..2) == 0)
                .then(|| testing::tiers(&mut Seeded(rng), UNIT));
            overrides += &optional(rng, "hard_limit", hard, "        ");
            if rng.random_range(0..3) == 0 {
                overrides += &policy_yaml(rng, "        ", shapes);
            }
            shapes.push(
                if tiers.is_some() {
                    "config: domain override with tiers"
                } else {
                    "config: domain override with H only"
                }
                .to_owned(),
            );
            if let Some(tiers) = tiers {
                overrides += "        tiers:";
                overrides += &tiers_yaml(rng, &tiers, "          ");
            }
        }
        if !overrides.is_empty() {
            y += "    domains:\n";
            y += &overrides;
        }
    }
    y += &meters_yaml(rng, shapes);
    for name in RANDOM_COPY {
        let domain_limit = rng.random_range(0..=6);
        y += &format!(
            "  - name: {name}\n    kind: copy\n    domain_limit: {}\n",
            limit(rng, domain_limit, 12)
        );
        let global = Seeded(rng).maybe(0..=10);
        y += &optional(rng, "global_limit", global, "    ");
        let mut overrides = String::new();
        for d in DOMAINS {
            if rng.random_range(0..3) == 0 {
                let l = rng.random_range(0..=8);
                overrides += &format!("      {d}: {{ domain_limit: {} }}\n", limit(rng, l, 12));
            }
        }
        if !overrides.is_empty() {
            y += "    domains:\n";
            y += &overrides;
        }
        let groups = rng.random_range(0..=3);
        shapes.push(format!("config: copy resource with {groups} groups"));
        if groups > 0 {
            y += "    groups:\n";
        }
        for g in 1..=groups {
            let members: Vec<&str> = DOMAINS
                .iter()
                .copied()
                .filter(|_| rng.random_range(0..2) == 0)
                .collect();
            let l = rng.random_range(0..=6);
            y += &format!(
                "      - {{ name: g{g}, limit: {}, domains: [{}] }}\n",
                limit(rng, l, 12),
                members.join(", ")
            );
        }
    }
    y
}

const RATE_RESOURCES: &[&str] = &[
    "api/a", "api/a", "api/b", "api/b", "api/c", "loose/r", "free/z", "nope/r", "vm/x", "m/b",
    "m/w", "m/q",
];
const COPY_RESOURCES: &[&str] = &["vm/x", "vm/y", "loose/vm", "free/vm", "api/a"];
const DOMAINS: &[&str] = &["d1", "d2", "d3", "d4"];
const SESSIONS: usize = 4;

/// Counts at and near the bound every kept count stays within (defect 8):
/// 2^53 - 1 itself, just below it, and values whose sums cross 2^53 - 1
/// (two of 2^52 + 1, three of a third, any two of the others).
const HUGE: &[u64] = &[
    MAX_COUNT,
    MAX_COUNT - 1,
    1 << 52,
    (1 << 52) + 1,
    (1 << 52) - 1,
    MAX_COUNT / 3 + 1,
    MAX_COUNT - 5,
];

/// (copies, min_copies) of a request or reserve: mostly small, one time in
/// eight near the bound (with min_copies 1, the same, or small).
fn counts(rng: &mut StdRng, small: u64) -> (u64, u64) {
    if rng.random_range(0..8) == 0 {
        let copies = HUGE[rng.random_range(0..HUGE.len())];
        let min = match rng.random_range(0..3) {
            0 => 1,
            1 => copies,
            _ => rng.random_range(1..=small),
        };
        return (copies, min);
    }
    let copies = rng.random_range(1..=small);
    (copies, rng.random_range(1..=copies))
}

/// What a client error is, for the tally of outcomes.
fn client_error_kind(e: &LimitError) -> &'static str {
    if e.to_string().contains("the largest count Charon keeps") {
        "refused at the bound"
    } else {
        "client error"
    }
}

/// One store under test: its limiter and sessions.
struct Side {
    limiter: Arc<Limiter>,
    sessions: Vec<Option<Session>>,
}

impl Side {
    fn new(limiter: Arc<Limiter>) -> Self {
        let sessions = (0..SESSIONS).map(|_| Some(limiter.session())).collect();
        Self { limiter, sessions }
    }

    fn session(&mut self, i: usize) -> &mut Session {
        self.sessions[i].as_mut().unwrap()
    }

    fn holds(&self, i: usize) -> Vec<(Hold, u64)> {
        self.sessions[i]
            .as_ref()
            .unwrap()
            .holds()
            .map(|(h, n)| (h.clone(), n))
            .collect()
    }
}

/// What a reply is compared by: the value, or the class of the error (and
/// for client errors, which come from the same code on both sides, the
/// message).
fn outcome<T: Debug>(r: &Result<T, LimitError>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(LimitError::Client(charon_core::ClientError::UnknownTransfer(_))) => {
            "client error: unknown transfer".to_owned()
        }
        Err(LimitError::Client(e)) => format!("client error: {e}"),
        Err(LimitError::Server(e)) => panic!("a server error has no place here: {e}"),
    }
}

/// The outcome of `Session::end`.
type Ended = Result<u64, (LimitError, Vec<(Hold, u64)>)>;

fn ended(e: Ended) -> String {
    match e {
        Ok(n) => format!("released {n}"),
        Err((e, _)) => panic!("ending a session failed: {e}"),
    }
}

struct Scenario {
    clock: Arc<ManualClock>,
    memory: Side,
    redis: Side,
    /// (memory id, redis id) of every transfer so far, and some bogus ones.
    transfers: Vec<(String, String)>,
    log: Vec<String>,
    /// The seed's configuration, shown when the stores disagree.
    config: String,
    /// How often each kind of outcome happened, to show the scenarios
    /// reach what they should.
    seen: BTreeMap<String, usize>,
}

impl Scenario {
    fn saw(&mut self, what: impl Into<String>) {
        *self.seen.entry(what.into()).or_default() += 1;
    }

    /// Counts what a rate-like operation `op` got, by kind.
    fn tally(&mut self, op: &str, d: &Result<Decision, LimitError>, copies: u64) {
        let d = match d {
            Ok(d) => d,
            Err(e) => return self.saw(format!("{op} {}", client_error_kind(e))),
        };
        let (kind, banned, warning, retry) = match d {
            Decision::Tiers(r) => {
                match () {
                    () if r.granted == 0 => self.saw(format!("{op} rejected")),
                    () if r.burst => self.saw(format!("{op} burst into tier {}", r.tier)),
                    () if r.hard_limited || r.global_limited => {
                        self.saw(format!("{op} granted, limited by H/G"));
                    }
                    () if r.granted < copies => self.saw(format!("{op} granted partly")),
                    () if r.granted > 7 => self.saw(format!("{op} granted, huge")),
                    () => self.saw(format!("{op} granted")),
                }
                let c = r.context;
                ("tiers", c.banned, c.warning, c.retry_after_ms)
            }
            Decision::Meter { reply, .. } => {
                if reply.granted == 0 {
                    self.saw(format!("meter {op} rejected"));
                }
                ("meter", reply.banned, reply.warning, reply.retry_after_ms)
            }
        };
        self.saw(format!("{kind} {op}"));
        if banned {
            self.saw(format!("{kind} {op} banned"));
        }
        if warning {
            self.saw(format!("{kind} {op} warning"));
        }
        match retry {
            None => self.saw(format!("{kind} {op} retry null")),
            Some(0) => {}
            Some(_) => self.saw(format!("{kind} {op} retry later")),
        }
    }

    fn check(&mut self, what: String, memory: String, redis: String) {
        self.log.push(format!("{what} -> {memory}"));
        if memory != redis {
            let tail: Vec<&String> = self.log.iter().rev().take(25).rev().collect();
            panic!(
                "the stores disagree at t={} on {what}\n  memory: {memory}\n  redis:  {redis}\nlast steps:\n{}\nconfiguration:{}",
                charon_core::Clock::now(&*self.clock),
                tail.iter()
                    .map(|s| format!("  {s}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.config
            );
        }
    }

    async fn step(&mut self, rng: &mut StdRng) {
        let t = charon_core::Clock::now(&*self.clock);
        match rng.random_range(0..100) {
            0..=24 => {
                // Most jumps are multiples of UNIT, like every span.
                let jump = match rng.random_range(0..100) {
                    0..=34 => 0,
                    35..=49 => 1,
                    50..=84 => UNIT * rng.random_range(1..=8),
                    85..=94 => 250 * rng.random_range(1..=12),
                    95..=97 => 1_000 * rng.random_range(1..=4) + rng.random_range(0..=1),
                    // Past every cooldown, forget time and transfer.
                    _ => DORMANT_GRACE + 1_000 * rng.random_range(0..=3) + rng.random_range(0..=1),
                };
                self.clock.set(t + jump);
                if jump > DORMANT_GRACE {
                    self.saw("time jump past the dormant grace");
                }
                self.log.push(format!("t += {jump}"));
            }
            25..=46 => {
                let resource = RATE_RESOURCES[rng.random_range(0..RATE_RESOURCES.len())];
                let domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
                let (copies, min) = counts(rng, 7);
                let amount = Amount::new(copies, min).unwrap();
                let options = RequestOptions {
                    dry_run: rng.random_range(0..4) == 0,
                };
                let m = self
                    .memory
                    .limiter
                    .decide(resource, domain, amount, options)
                    .await;
                let r = self
                    .redis
                    .limiter
                    .decide(resource, domain, amount, options)
                    .await;
                let op = if options.dry_run {
                    "dry run"
                } else {
                    "request"
                };
                self.tally(op, &m, copies);
                let what = format!("t={t} {op}({resource}, {domain}, {copies}, {min})");
                self.check(what, outcome(&m), outcome(&r));
            }
            47..=54 => {
                let resource = RATE_RESOURCES[rng.random_range(0..RATE_RESOURCES.len())];
                let domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
                let copies = match rng.random_range(0..16) {
                    0 => 0,
                    1 => HUGE[rng.random_range(0..HUGE.len())],
                    _ => rng.random_range(1..=5),
                };
                let refund = rng.random_range(0..6) == 0;
                let (m, r) = if refund {
                    (
                        self.memory.limiter.refund(resource, domain, copies).await,
                        self.redis.limiter.refund(resource, domain, copies).await,
                    )
                } else {
                    (
                        self.memory.limiter.charge(resource, domain, copies).await,
                        self.redis.limiter.charge(resource, domain, copies).await,
                    )
                };
                let op = if refund { "refund" } else { "charge" };
                self.tally(op, &m, copies);
                let what = format!("t={t} {op}({resource}, {domain}, {copies})");
                self.check(what, outcome(&m), outcome(&r));
            }
            55..=69 => {
                let s = rng.random_range(0..SESSIONS);
                let resource = COPY_RESOURCES[rng.random_range(0..COPY_RESOURCES.len())];
                let domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
                let (copies, min) = counts(rng, 5);
                let amount = Amount::new(copies, min).unwrap();
                let m = self
                    .memory
                    .session(s)
                    .reserve(resource, domain, amount)
                    .await;
                let r = self
                    .redis
                    .session(s)
                    .reserve(resource, domain, amount)
                    .await;
                match &m {
                    Ok(r) if r.granted == 0 => self.saw("reserve rejected"),
                    Ok(r) if r.granted > 5 => self.saw("reserve granted, huge"),
                    Ok(_) => self.saw("reserve granted"),
                    Err(e) => self.saw(format!("reserve {}", client_error_kind(e))),
                }
                if let Ok(r) = &m
                    && r.granted < copies
                    && !r.ignored
                    && r.groups.iter().any(|g| g.holds >= g.limit)
                {
                    self.saw("reserve limited by a group");
                }
                let what = format!("t={t} s{s}.reserve({resource}, {domain}, {copies}, {min})");
                self.check(what, outcome(&m), outcome(&r));
            }
            70..=79 => {
                let s = rng.random_range(0..SESSIONS);
                let Some((hold, held)) = self.pick_hold(rng, s) else {
                    return;
                };
                let copies = if rng.random_range(0..8) == 0 {
                    held + 1
                } else {
                    rng.random_range(1..=held)
                };
                let m = self.memory.session(s).release(&hold, copies).await;
                let r = self.redis.session(s).release(&hold, copies).await;
                self.saw(if m.is_ok() {
                    "release ok"
                } else {
                    "release client error"
                });
                let what = format!("t={t} s{s}.release({hold:?}, {copies})");
                self.check(what, outcome(&m), outcome(&r));
            }
            80..=87 => {
                let s = rng.random_range(0..SESSIONS);
                let Some((hold, held)) = self.pick_hold(rng, s) else {
                    return;
                };
                let copies = rng.random_range(1..=held);
                let ttl = 50 * rng.random_range(1..=12);
                let m = self.memory.session(s).transfer(&hold, copies, ttl).await;
                let r = self.redis.session(s).transfer(&hold, copies, ttl).await;
                let what = format!("t={t} s{s}.transfer({hold:?}, {copies}, ttl {ttl})");
                match (&m, &r) {
                    (Ok(mi), Ok(ri)) => {
                        self.saw("transfer ok");
                        self.transfers.push((mi.clone(), ri.clone()));
                        self.check(what, "ok".into(), "ok".into());
                    }
                    _ => self.check(what, outcome(&m), outcome(&r)),
                }
            }
            88..=94 => {
                if self.transfers.is_empty() {
                    return;
                }
                let s = rng.random_range(0..SESSIONS);
                // Mostly a recent transfer (likely still staged), sometimes
                // any (likely seized or expired).
                let n = self.transfers.len();
                let i = if rng.random_range(0..3) == 0 {
                    rng.random_range(0..n)
                } else {
                    n - 1 - rng.random_range(0..n.min(3))
                };
                let (mi, ri) = self.transfers[i].clone();
                let m = self.memory.session(s).seize(&mi).await;
                let r = self.redis.session(s).seize(&ri).await;
                self.saw(if m.is_ok() {
                    "seize ok"
                } else {
                    "seize unknown or expired"
                });
                let what = format!("t={t} s{s}.seize({mi})");
                self.check(what, outcome(&m), outcome(&r));
            }
            _ => {
                let s = rng.random_range(0..SESSIONS);
                let m = self.memory.sessions[s].take().unwrap().end().await;
                let r = self.redis.sessions[s].take().unwrap().end().await;
                self.memory.sessions[s] = Some(self.memory.limiter.session());
                self.redis.sessions[s] = Some(self.redis.limiter.session());
                self.saw("session ended");
                let what = format!("t={t} s{s}.end()");
                self.check(what, ended(m), ended(r));
            }
        }
        for s in 0..SESSIONS {
            let (m, r) = (self.memory.holds(s), self.redis.holds(s));
            if m != r {
                self.check(format!("s{s} holds"), format!("{m:?}"), format!("{r:?}"));
            }
        }
    }

    /// A hold of session `s` (the same on both sides), or sometimes one it
    /// does not have.
    fn pick_hold(&self, rng: &mut StdRng, s: usize) -> Option<(Hold, u64)> {
        let holds = self.memory.holds(s);
        if holds.is_empty() && rng.random_range(0..2) == 0 {
            return None;
        }
        if holds.is_empty() || rng.random_range(0..10) == 0 {
            let resource = COPY_RESOURCES[rng.random_range(0..COPY_RESOURCES.len())];
            let domain = DOMAINS[rng.random_range(0..DOMAINS.len())];
            return Some((Hold::new(resource, domain, []), 1));
        }
        Some(holds[rng.random_range(0..holds.len())].clone())
    }
}

async fn run(seed: u64, steps: usize, redis: &RedisServer, seen: &mut BTreeMap<String, usize>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = if seed.is_multiple_of(2) {
        0
    } else {
        1_700_000_000_000
    };
    let clock = Arc::new(ManualClock::new(start));
    let mut shapes = Vec::new();
    let yaml = config(&mut rng, &mut shapes);
    for shape in shapes {
        *seen.entry(shape).or_default() += 1;
    }
    let config = match Config::from_yaml(&yaml) {
        Ok((config, _)) => config,
        Err(e) => panic!("seed {seed}: the generated configuration is refused: {e}\n{yaml}"),
    };
    let memory = Limiter::new(
        config.clone(),
        Arc::new(MemoryStore::with_sequential_ids(clock.clone())),
    );
    let (store, maintain) = charon_testkit::stores::seed_store(redis, &clock, "diff", seed).await;
    let redis = Limiter::new(config, store);
    let mut scenario = Scenario {
        clock,
        memory: Side::new(memory),
        redis: Side::new(redis),
        transfers: vec![("t0".into(), format!("{}.vm/x", "0".repeat(32)))],
        log: Vec::new(),
        config: yaml,
        seen: BTreeMap::new(),
    };
    for i in 0..steps {
        scenario.log.push(format!("-- seed {seed} step {i}"));
        scenario.step(&mut rng).await;
    }
    maintain.abort();
    for (k, v) in scenario.seen {
        *seen.entry(k).or_default() += v;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_give_identical_replies() {
    let redis = RedisServer::start();
    let seeds = charon_testkit::stores::diff_seeds();
    let mut seen = BTreeMap::new();
    for seed in seeds {
        run(seed, 600, &redis, &mut seen).await;
    }
    charon_testkit::stores::print_outcomes(&seen);
    for must in [
        "request burst into tier 2",
        "request burst into tier 3",
        "dry run burst into tier 2",
        "dry run rejected",
        "charge granted",
        "tiers request banned",
        "tiers dry run banned",
        "tiers charge banned",
        "tiers request warning",
        "tiers request retry null",
        "tiers request retry later",
        "tiers dry run retry later",
        "tiers charge retry later",
        "refund client error",
        "charge client error",
        "meter request",
        "meter request rejected",
        "meter dry run",
        "meter charge",
        "meter refund",
        "meter request banned",
        "meter request warning",
        "config: soft limit",
        "config: ban",
        "config: window fixed",
        "config: window sliding_counter",
        "request granted, limited by H/G",
        "request rejected",
        "reserve rejected",
        "seize ok",
        "seize unknown or expired",
        "time jump past the dormant grace",
        "request granted, huge",
        "request refused at the bound",
        "reserve granted, huge",
        "reserve refused at the bound",
        "reserve limited by a group",
        "config: rate resource with 0 tiers",
        "config: rate resource with 4 tiers",
        "config: domain override with tiers",
        "config: domain override with H only",
        "config: copy resource with 0 groups",
        "config: copy resource with 3 groups",
    ] {
        assert!(
            seen.get(must).copied().unwrap_or(0) > 0,
            "no {must:?}: the scenarios miss something"
        );
    }
}
