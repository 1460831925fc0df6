//! Capacity leases (SPEC §12) under random capacities, clients, wants and
//! refresh orders:
//! - at every step, no lease is more than its client wants, the leases of
//!   `proportional_share` and `fair_share` never add up to more than the
//!   capacity, and `static` never gives more than the capacity per
//!   subclient — in learning mode too, with clients claiming anything;
//! - after every client has refreshed twice with unchanged wants, every
//!   lease is the algorithm's share, and a further refresh changes
//!   nothing (the fixed point);
//! - those shares are the algorithms' as a deliberately naive model
//!   computes them in exact fractions: the paper's rounds for
//!   `fair_share`, Doorman's formula for `proportional_share`.

use crate::naive;

use charon_core::Millis;
use charon_core::lease::{
    Algorithm, LeaseContext, LeaseParams, LeaseSet, MAX_SUBCLIENTS, Quantity, Shares, Want, expire,
    get_capacity, release_capacity,
};
use naive::Q;
use proptest::prelude::*;

const LEASE: Millis = 10_000;

fn quantity(micros: u64) -> Quantity {
    Quantity::from_micros(micros.min(Quantity::MAX.micros())).expect("in range")
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::None),
        Just(Algorithm::Static),
        Just(Algorithm::ProportionalShare),
        Just(Algorithm::FairShare),
    ]
}

fn shared() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::ProportionalShare),
        Just(Algorithm::FairShare)
    ]
}

/// Small amounts most of the time (where clients compete), the largest
/// sometimes (where the exact arithmetic needs its 128 bits).
fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=20_000_000,
        1 => 0u64..=Quantity::MAX.micros(),
        1 => Just(Quantity::MAX.micros()),
    ]
}

fn subclients() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 1u64..=4, 1 => Just(MAX_SUBCLIENTS), 1 => 1u64..=MAX_SUBCLIENTS]
}

#[derive(Debug, Clone)]
enum Step {
    Get {
        client: usize,
        wants: u64,
        has: u64,
        subclients: u64,
    },
    Release {
        client: usize,
    },
    Wait(Millis),
    /// A store's sweep of lapsed leases.
    Expire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..6, amount(), amount(), subclients()).prop_map(|(client, wants, has, subclients)| {
            Step::Get { client, wants, has, subclients }
        }),
        1 => (0usize..6).prop_map(|client| Step::Release { client }),
        2 => (0u64..=LEASE).prop_map(Step::Wait),
        1 => Just(Step::Expire),
    ]
}

fn name(i: usize) -> String {
    format!("client-{i}")
}

/// Every promise of SPEC §12 about the set as it stands at `now`; right
/// after a decision (`decided`), no lapsed lease is left in it either.
fn check(
    set: &LeaseSet,
    params: &LeaseParams,
    now: Millis,
    decided: bool,
) -> Result<(), TestCaseError> {
    let capacity = u128::from(params.capacity().micros());
    let (mut has, mut wants, mut subclients) = (0u128, 0u128, 0u128);
    for (client, lease) in set.iter() {
        prop_assert!(
            lease.has <= lease.wants,
            "{client} holds more than it wants: {lease:?}"
        );
        prop_assert!(
            !decided || lease.expires_at_ms > now,
            "{client}'s lapsed lease is still counted"
        );
        if params.algorithm() == Algorithm::Static {
            prop_assert!(
                u128::from(lease.has.micros()) <= capacity * u128::from(lease.subclients),
                "{client} holds more than static allows: {lease:?}"
            );
        }
        has += u128::from(lease.has.micros());
        wants += u128::from(lease.wants.micros());
        subclients += u128::from(lease.subclients);
    }
    if params.algorithm().shares_capacity() {
        prop_assert!(has <= capacity, "over-committed: {has} of {capacity}");
    }
    prop_assert_eq!(
        (
            set.sum_has_micros(),
            set.sum_wants_micros(),
            set.subclients()
        ),
        (has, wants, subclients),
        "totals"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn leases_never_exceed_wants_nor_the_capacity(
        algorithm in algorithm(),
        capacity in amount(),
        learning_mode in prop_oneof![Just(0u64), 0u64..=3 * LEASE],
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let params = LeaseParams::new(quantity(capacity), algorithm, LEASE, LEASE / 4)
            .expect("valid")
            .with_learning_mode(learning_mode)
            .expect("valid");
        let mut set = LeaseSet::new();
        let mut now = 0;
        for step in steps {
            match step {
                Step::Get { client, wants, has, subclients } => {
                    let want = Want::new(quantity(wants), quantity(has), subclients).expect("valid");
                    let ctx = LeaseContext::root(&params, 0, now);
                    let reply = get_capacity(&mut set, &params, ctx, &name(client), want);
                    let lease = set.get(&name(client)).copied();
                    prop_assert_eq!(lease.map(|l| l.has), Some(reply.capacity));
                    prop_assert_eq!(reply.expires_at_ms, now + LEASE);
                    if ctx.learning && algorithm != Algorithm::None {
                        prop_assert!(reply.capacity <= quantity(has));
                    }
                }
                Step::Release { client } => {
                    let held = set.get(&name(client)).is_some_and(|l| l.expires_at_ms > now);
                    prop_assert_eq!(release_capacity(&mut set, &name(client), now), held);
                    prop_assert!(set.get(&name(client)).is_none());
                }
                Step::Expire => {
                    let lapsed: Vec<String> = set
                        .iter()
                        .filter(|(_, l)| l.expires_at_ms <= now)
                        .map(|(c, _)| c.to_owned())
                        .collect();
                    prop_assert_eq!(expire(&mut set, now), lapsed);
                }
                Step::Wait(ms) => {
                    // Time passes; only decisions drop lapsed leases.
                    now += ms;
                    check(&set, &params, now, false)?;
                    continue;
                }
            }
            check(&set, &params, now, true)?;
        }
    }

    #[test]
    fn two_refreshes_with_unchanged_wants_reach_the_algorithms_shares(
        algorithm in algorithm(),
        capacity in amount(),
        first in prop::collection::vec((amount(), subclients()), 1..8),
        then in prop::collection::vec(amount(), 8),
        orders in prop::collection::vec(any::<u64>(), 3),
    ) {
        let params = LeaseParams::new(quantity(capacity), algorithm, LEASE, LEASE / 4)
            .expect("valid")
            .with_learning_mode(0)
            .expect("valid");
        let n = first.len();
        let mut set = LeaseSet::new();
        let mut now = 0;
        let refresh = |set: &mut LeaseSet, now: Millis, i: usize, wants: u64, subclients: u64| {
            let has = set.get(&name(i)).map_or(Quantity::ZERO, |l| l.has);
            let want = Want::new(quantity(wants), has, subclients).expect("valid");
            let reply = get_capacity(set, &params, LeaseContext::root(&params, 0, now), &name(i), want);
            check(set, &params, now, true).map(|()| reply.capacity)
        };
        // Join with the first wants, in order.
        for (i, &(wants, subclients)) in first.iter().enumerate() {
            refresh(&mut set, now, i, wants, subclients)?;
        }
        // Everyone changes its wants (keeping its subclients), then
        // refreshes twice more, each round in a random order.
        let wanted: Vec<(u64, u64)> = (0..n).map(|i| (then[i], first[i].1)).collect();
        let mut got = vec![Quantity::ZERO; n];
        for seed in orders {
            now += 1;
            for i in permutation(n, seed) {
                got[i] = refresh(&mut set, now, i, wanted[i].0, wanted[i].1)?;
            }
        }
        let shares = Shares::new(
            algorithm,
            params.capacity(),
            wanted.iter().map(|&(w, s)| (quantity(w), s)),
        );
        let expected: Vec<Quantity> = wanted.iter().map(|&(w, s)| shares.of(quantity(w), s)).collect();
        prop_assert_eq!(&got, &expected, "not at the shares after two refreshes");
        // A fixed point: one more round changes nothing.
        now += 1;
        for i in permutation(n, 7) {
            prop_assert_eq!(refresh(&mut set, now, i, wanted[i].0, wanted[i].1)?, expected[i]);
        }
        fair_share_is_max_min_fair(algorithm, params.capacity(), &wanted, &expected)?;
    }

    #[test]
    fn shares_are_the_naive_models(
        algorithm in shared(),
        capacity in 0u64..=20_000_000,
        clients in prop::collection::vec((0u64..=20_000_000, 1u64..=3), 1..7),
    ) {
        let shares = Shares::new(
            algorithm,
            quantity(capacity),
            clients.iter().map(|&(w, s)| (quantity(w), s)),
        );
        let model = match algorithm {
            Algorithm::FairShare => naive_fair_share(capacity, &clients),
            _ => naive_proportional_share(capacity, &clients),
        };
        for (i, &(w, s)) in clients.iter().enumerate() {
            let exact = model[i];
            prop_assert_eq!(
                i128::from(shares.of(quantity(w), s).micros()),
                exact.floor(),
                "client {} of {:?}", i, clients
            );
        }
    }
}

/// A permutation of `0..n` from a seed (a Fisher–Yates shuffle driven by
/// a tiny LCG, so the order is a function of the seed proptest shrinks).
fn permutation(n: usize, mut seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j =
            usize::try_from((seed >> 33) % (u64::try_from(i).expect("small") + 1)).expect("small");
        v.swap(i, j);
    }
    v
}

/// Max-min fairness, as exact as the shares' rounding down allows: when the
/// wants do not fit, nothing worth a millionth per client is left on the
/// table, and no client short of its wants has a smaller share per
/// subclient than any other client.
fn fair_share_is_max_min_fair(
    algorithm: Algorithm,
    capacity: Quantity,
    clients: &[(u64, u64)],
    shares: &[Quantity],
) -> Result<(), TestCaseError> {
    if algorithm != Algorithm::FairShare {
        return Ok(());
    }
    let wants: u128 = clients
        .iter()
        .map(|&(w, _)| u128::from(quantity(w).micros()))
        .sum();
    let total: u128 = shares.iter().map(|s| u128::from(s.micros())).sum();
    let capacity = u128::from(capacity.micros());
    if wants <= capacity {
        prop_assert_eq!(total, wants);
        return Ok(());
    }
    let n = u128::try_from(clients.len()).expect("few");
    prop_assert!(
        total <= capacity && total + n >= capacity,
        "{total} of {capacity}"
    );
    for (i, &(wi, si)) in clients.iter().enumerate() {
        if shares[i] == quantity(wi) {
            continue;
        }
        for (j, &(_, sj)) in clients.iter().enumerate() {
            // share_j / s_j < (share_i + 1) / s_i: i is at the level.
            let (hi, hj) = (
                u128::from(shares[i].micros()),
                u128::from(shares[j].micros()),
            );
            prop_assert!(
                hj * u128::from(si) < (hi + 1) * u128::from(sj),
                "client {i} (short of its wants) gets less per subclient than client {j}"
            );
        }
    }
    Ok(())
}

/// The paper's fair-share rounds, literally: each round splits what is
/// left among the clients still short of their wants, in proportion to
/// their subclients, each taking at most what it still lacks; until
/// nothing is left or nobody lacks anything. Exact fractions.
fn naive_fair_share(capacity: u64, clients: &[(u64, u64)]) -> Vec<Q> {
    let mut got = vec![Q::int(0); clients.len()];
    let mut left = Q::int(capacity.into());
    loop {
        let short: Vec<usize> = (0..clients.len())
            .filter(|&i| got[i] < Q::int(clients[i].0.into()))
            .collect();
        if short.is_empty() || left <= Q::int(0) {
            return got;
        }
        let weight: u64 = short.iter().map(|&i| clients[i].1).sum();
        let split = left;
        for &i in &short {
            let lacks = Q::int(clients[i].0.into()).sub(got[i]);
            let offer = split.mul(Q::new(clients[i].1.into(), weight.into()));
            let take = offer.min(lacks);
            got[i] = got[i].add(take);
            left = left.sub(take);
        }
    }
}

/// Doorman's ProportionalShare, literally, in exact fractions: wants when
/// they all fit or when at most the equal share; else the equal share plus
/// the excess times (capacity left by those under their equal share) /
/// (excess wanted by the others).
fn naive_proportional_share(capacity: u64, clients: &[(u64, u64)]) -> Vec<Q> {
    let c = Q::int(capacity.into());
    let n: u64 = clients.iter().map(|&(_, s)| s).sum();
    let wants: u64 = clients.iter().map(|&(w, _)| w).sum();
    let equal = |s: u64| c.mul(Q::new(s.into(), n.into()));
    let (mut extra, mut need) = (Q::int(0), Q::int(0));
    for &(w, s) in clients {
        let (w, e) = (Q::int(w.into()), equal(s));
        if w < e {
            extra = extra.add(e.sub(w));
        } else {
            need = need.add(w.sub(e));
        }
    }
    clients
        .iter()
        .map(|&(w, s)| {
            let (wq, e) = (Q::int(w.into()), equal(s));
            if wants <= capacity || wq <= e {
                wq
            } else {
                e.add(wq.sub(e).mul(extra).div(need))
            }
        })
        .collect()
}
