//! Waiting for a copy (SPEC §14) against a deliberately naive model: every
//! grant kept as one entry of a list, every count summed from that list
//! whenever it is needed, the queue a plain vector walked from the front.
//! Random limits (domain, global, groups) and random timelines of
//! reserves that may wait, releases (with and without `result_ready`),
//! waiters leaving and deadlines must give the same answers, in the same
//! order, as `charon_core::copy`; and the model checks the promises
//! themselves: no count ever above its limit, every waiter answered by its
//! deadline, waiters of one domain asking the same served in arrival order.

use std::collections::HashMap;

use charon_core::config::{CopyLimits, Enforcement, GroupLimit};
use charon_core::copy::{self, CopyState, Hold, Joined, WaitAsk, WaitQueue};
use charon_core::request::Amount;
use proptest::prelude::*;

const DOMAINS: u8 = 3;

#[derive(Debug, Clone)]
struct Limits {
    domain: u64,
    global: Option<u64>,
    /// (limit, member domains)
    groups: Vec<(u64, Vec<u8>)>,
    queue_limit: u64,
}

#[derive(Debug, Clone)]
enum Ev {
    Reserve {
        domain: u8,
        copies: u64,
        min: u64,
        wait: u64,
    },
    Release {
        pick: usize,
        ready: bool,
    },
    Leave {
        pick: usize,
    },
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        1..4u64,
        prop::option::of(1..5u64),
        prop::collection::vec((1..4u64, prop::collection::vec(0..DOMAINS, 0..3)), 0..3),
        0..4u64,
    )
        .prop_map(|(domain, global, groups, queue_limit)| Limits {
            domain,
            global,
            groups,
            queue_limit,
        })
}

fn events() -> impl Strategy<Value = Vec<(u64, Ev)>> {
    let ev = prop_oneof![
        4 => (0..DOMAINS, 1..4u64, 1..4u64, prop_oneof![Just(0u64), 1..40u64]).prop_map(
            |(domain, copies, min, wait)| Ev::Reserve {
                domain,
                copies,
                min: min.min(copies),
                wait
            }
        ),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, ready)| Ev::Release { pick, ready }),
        1 => any::<usize>().prop_map(|pick| Ev::Leave { pick }),
    ];
    prop::collection::vec((0..15u64, ev), 1..60)
}

/// What a waiter (or an arrival) was answered: ticket, time, granted,
/// result_ready, queue_full, waited_ms.
type Answer = (u64, u64, u64, bool, bool, Option<u64>);

#[derive(Debug, Clone)]
struct NWaiter {
    ticket: u64,
    domain: u8,
    copies: u64,
    min: u64,
    arrived: u64,
    deadline: u64,
}

/// The naive model.
struct Model {
    l: Limits,
    /// Every grant still held: (grant id, domain, copies).
    grants: Vec<(u64, u8, u64)>,
    waiters: Vec<NWaiter>,
    answers: Vec<Answer>,
}

impl Model {
    fn held_by(&self, d: u8) -> u64 {
        self.grants.iter().filter(|g| g.1 == d).map(|g| g.2).sum()
    }
    fn held(&self) -> u64 {
        self.grants.iter().map(|g| g.2).sum()
    }
    fn group_held(&self, members: &[u8]) -> u64 {
        self.grants
            .iter()
            .filter(|g| members.contains(&g.1))
            .map(|g| g.2)
            .sum()
    }
    /// Room under the domain's own limits (domain and groups).
    fn own_room(&self, d: u8) -> u64 {
        let mut room = self.l.domain.saturating_sub(self.held_by(d));
        for (limit, members) in &self.l.groups {
            if members.contains(&d) {
                room = room.min(limit.saturating_sub(self.group_held(members)));
            }
        }
        room
    }
    fn global_room(&self) -> u64 {
        self.l
            .global
            .map_or(u64::MAX, |g| g.saturating_sub(self.held()))
    }
    fn check_limits(&self) {
        for d in 0..DOMAINS {
            assert!(
                self.held_by(d) <= self.l.domain,
                "domain {d} over its limit"
            );
        }
        if let Some(g) = self.l.global {
            assert!(self.held() <= g, "over the global limit");
        }
        for (limit, members) in &self.l.groups {
            assert!(self.group_held(members) <= *limit, "a group over its limit");
        }
    }
    fn serve(&mut self, now: u64) {
        let mut i = 0;
        while i < self.waiters.len() {
            let w = self.waiters[i].clone();
            let own = self.own_room(w.domain);
            let global = self.global_room();
            let free = own.min(global);
            if free >= w.min {
                let n = w.copies.min(free);
                self.waiters.remove(i);
                self.grants.push((w.ticket, w.domain, n));
                self.answers
                    .push((w.ticket, now, n, false, false, Some(now - w.arrived)));
                continue;
            }
            if own >= w.min && global < w.min {
                break;
            }
            i += 1;
        }
        self.check_limits();
    }
    fn deadlines(&mut self, now: u64) {
        loop {
            let due = self
                .waiters
                .iter()
                .enumerate()
                .filter(|(_, w)| w.deadline <= now)
                .min_by_key(|(i, w)| (w.deadline, *i))
                .map(|(i, _)| i);
            let Some(i) = due else { break };
            let w = self.waiters.remove(i);
            assert!(now >= w.deadline);
            self.answers
                .push((w.ticket, now, 0, false, false, Some(now - w.arrived)));
            self.serve(now);
        }
    }
}

fn core_limits(l: &Limits, d: u8) -> CopyLimits {
    CopyLimits {
        domain_limit: l.domain,
        global_limit: l.global,
        groups: l
            .groups
            .iter()
            .enumerate()
            .filter(|(_, (_, m))| m.contains(&d))
            .map(|(i, (limit, _))| GroupLimit {
                name: format!("g{i}"),
                limit: *limit,
            })
            .collect(),
    }
}

fn answer(ticket: u64, now: u64, r: &copy::ReserveReply) -> Answer {
    (
        ticket,
        now,
        r.granted,
        r.result_ready,
        r.queue_full,
        r.waited_ms,
    )
}

fn run(l: &Limits, evs: &[(u64, Ev)]) {
    let mut m = Model {
        l: l.clone(),
        grants: Vec::new(),
        waiters: Vec::new(),
        answers: Vec::new(),
    };
    let mut state: CopyState = CopyState::default();
    let mut queue = WaitQueue::default();
    let mut real: Vec<Answer> = Vec::new();
    // grant id → (hold, copies) on the core side.
    let mut holds: HashMap<u64, (Hold, u64)> = HashMap::new();
    let mut deadlines: HashMap<u64, u64> = HashMap::new();
    let mut now = 0;
    let mut next_ticket = 1;
    let record = |real: &mut Vec<Answer>,
                  holds: &mut HashMap<u64, (Hold, u64)>,
                  ds: Vec<copy::Decided>,
                  domains: &HashMap<u64, u8>,
                  now: u64| {
        for d in ds {
            if d.reply.granted > 0 {
                let domain = format!("d{}", domains[&d.ticket]);
                let hold = Hold::new("r", domain, d.reply.group_set());
                holds.insert(d.ticket, (hold, d.reply.granted));
            }
            real.push(answer(d.ticket, now, &d.reply));
        }
    };
    let mut domains: HashMap<u64, u8> = HashMap::new();
    let mut mins: HashMap<u64, u64> = HashMap::new();
    for (dt, ev) in evs {
        now += dt;
        // Every deadline up to now, at its own instant.
        while let Some(x) = queue.next_deadline().filter(|&x| x <= now) {
            let ds = copy::expire_waiters(&mut state, &mut queue, x);
            record(&mut real, &mut holds, ds, &domains, x);
            m.deadlines(x);
        }
        m.deadlines(now);
        match *ev {
            Ev::Reserve {
                domain,
                copies,
                min,
                wait,
            } => {
                let ticket = next_ticket;
                next_ticket += 1;
                domains.insert(ticket, domain);
                mins.insert(ticket, min);
                deadlines.insert(ticket, now + wait);
                let ask = WaitAsk {
                    ticket,
                    wait_ms: wait,
                    queue_limit: l.queue_limit,
                };
                let a = copy::arrive(
                    &mut state,
                    &mut queue,
                    &format!("d{domain}"),
                    &core_limits(l, domain),
                    Amount::new(copies, min).expect("valid"),
                    Enforcement::Enforce,
                    ask,
                    now,
                )
                .expect("no bound reached");
                if let Joined::Now(r) = &a.joined {
                    record(
                        &mut real,
                        &mut holds,
                        vec![copy::Decided {
                            ticket,
                            reply: r.clone(),
                        }],
                        &domains,
                        now,
                    );
                }
                record(&mut real, &mut holds, a.served, &domains, now);
                // The model: join, serve, then answer the arrival if it
                // must not wait.
                m.waiters.push(NWaiter {
                    ticket,
                    domain,
                    copies,
                    min,
                    arrived: now,
                    deadline: now + wait,
                });
                let before = m.answers.len();
                m.serve(now);
                let served_self = m.answers[before..].iter().any(|a| a.0 == ticket);
                if served_self {
                    let i = m.answers[before..]
                        .iter()
                        .position(|a| a.0 == ticket)
                        .expect("found")
                        + before;
                    let mut a = m.answers.remove(i);
                    a.5 = (wait > 0).then_some(0);
                    m.answers.insert(before, a);
                } else if wait == 0 || m.waiters.len() as u64 > l.queue_limit {
                    m.waiters.retain(|w| w.ticket != ticket);
                    let a = (ticket, now, 0, false, wait > 0, (wait > 0).then_some(0));
                    m.answers.insert(before, a);
                }
            }
            Ev::Release { pick, ready } => {
                if m.grants.is_empty() {
                    continue;
                }
                let (id, domain, n) = m.grants.remove(pick % m.grants.len());
                let (hold, copies) = holds.remove(&id).expect("core holds it too");
                assert_eq!(copies, n);
                copy::release(&mut state, &hold, copies).expect("held");
                let mut ds = Vec::new();
                if ready {
                    ds.extend(copy::result_ready(&state, &mut queue, &hold.domain, now));
                }
                ds.extend(copy::serve(&mut state, &mut queue, now));
                record(&mut real, &mut holds, ds, &domains, now);
                if ready {
                    let (ready_ones, rest): (Vec<NWaiter>, Vec<NWaiter>) =
                        m.waiters.drain(..).partition(|w| w.domain == domain);
                    m.waiters = rest;
                    for w in ready_ones {
                        m.answers
                            .push((w.ticket, now, 0, true, false, Some(now - w.arrived)));
                    }
                }
                m.serve(now);
            }
            Ev::Leave { pick } => {
                if m.waiters.is_empty() {
                    continue;
                }
                let w = m.waiters.remove(pick % m.waiters.len());
                assert!(copy::leave(&mut queue, w.ticket).is_some());
                let ds = copy::serve(&mut state, &mut queue, now);
                record(&mut real, &mut holds, ds, &domains, now);
                m.serve(now);
            }
        }
        assert_eq!(real, m.answers, "after {ev:?} at {now}");
        assert_eq!(state.global, m.held());
    }
    // Time runs out: every waiter is answered by its deadline.
    let ds = copy::expire_waiters(&mut state, &mut queue, u64::MAX / 2);
    assert!(queue.is_empty());
    for d in &ds {
        assert!(d.reply.granted > 0 || d.reply.waited_ms.is_some());
    }
    for (ticket, deadline) in &deadlines {
        if let Some(a) = real.iter().find(|a| a.0 == *ticket) {
            assert!(
                a.1 <= *deadline,
                "ticket {ticket} answered after its deadline"
            );
        }
    }
    // Waiters of one domain content with one copy are granted in arrival
    // order (tickets are issued in arrival order).
    for d in 0..DOMAINS {
        let granted: Vec<u64> = m
            .answers
            .iter()
            .filter(|a| a.2 > 0 && domains[&a.0] == d && mins[&a.0] == 1)
            .map(|a| a.0)
            .collect();
        let mut sorted = granted.clone();
        sorted.sort_unstable();
        assert_eq!(granted, sorted, "domain {d}: waiters granted out of order");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn waiting_matches_the_naive_model(l in limits(), evs in events()) {
        run(&l, &evs);
    }
}

#[test]
fn a_waiter_blocked_by_the_global_limit_stops_the_serving() {
    // Global 2; a holds both. w1 (b, 2 copies) waits; w2 (c, 1) arrives:
    // one copy comes back, w1 cannot take 2, and w2 may not jump it.
    let l = Limits {
        domain: 2,
        global: Some(2),
        groups: vec![],
        queue_limit: 10,
    };
    let evs = vec![
        (
            0,
            Ev::Reserve {
                domain: 0,
                copies: 1,
                min: 1,
                wait: 0,
            },
        ),
        (
            0,
            Ev::Reserve {
                domain: 0,
                copies: 1,
                min: 1,
                wait: 0,
            },
        ),
        (
            1,
            Ev::Reserve {
                domain: 1,
                copies: 2,
                min: 2,
                wait: 50,
            },
        ),
        (
            1,
            Ev::Reserve {
                domain: 2,
                copies: 1,
                min: 1,
                wait: 50,
            },
        ),
        (
            1,
            Ev::Release {
                pick: 0,
                ready: false,
            },
        ),
    ];
    run(&l, &evs);
}
