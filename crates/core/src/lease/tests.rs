//! Every rule of SPEC §12 at its boundary, and every number of the paper's
//! two tables (§5.1).

use super::*;

fn q(units: f64) -> Quantity {
    Quantity::parse("test", units).expect("a capacity")
}

fn micros(m: u64) -> Quantity {
    Quantity::from_micros(m).expect("in range")
}

fn params(capacity: f64, algorithm: Algorithm) -> LeaseParams {
    LeaseParams::new(q(capacity), algorithm, 60_000, 5_000)
        .expect("valid")
        .with_learning_mode(0)
        .expect("valid")
}

fn want(wants: f64, has: f64) -> Want {
    Want::parse(wants, has, 1).expect("valid")
}

fn at(now: Millis, params: &LeaseParams) -> LeaseContext {
    LeaseContext {
        now,
        capacity: params.capacity(),
        learning: false,
    }
}

/// Refreshes each client in order with its wants and what it holds; returns
/// what each got.
fn round(
    set: &mut LeaseSet,
    params: &LeaseParams,
    now: Millis,
    clients: &[(&str, f64)],
) -> Vec<Quantity> {
    clients
        .iter()
        .map(|&(client, wants)| {
            let has = set.get(client).map_or(Quantity::ZERO, |l| l.has);
            let w = Want::new(q(wants), has, 1).expect("valid");
            get_capacity(set, params, at(now, params), client, w).capacity
        })
        .collect()
}

fn sum(set: &LeaseSet) -> u128 {
    set.iter().map(|(_, l)| u128::from(l.has.micros())).sum()
}

// The paper's ProportionalShare table: capacity 90, three clients.
//
// | Client | Requested | Share | Additional |
// | A      | 100       | 30    | 15.6       |
// | B      | 50        | 30    | 4.4        |
// | C      | 10        | 10    | 0          |
#[test]
fn proportional_share_table_of_the_paper() {
    let shares = Shares::new(
        Algorithm::ProportionalShare,
        q(90.0),
        [(q(100.0), 1), (q(50.0), 1), (q(10.0), 1)],
    );
    let (a, b, c) = (
        shares.of(q(100.0), 1),
        shares.of(q(50.0), 1),
        shares.of(q(10.0), 1),
    );
    // Share: an equal third each, C only what it wants.
    let equal = q(30.0);
    // Additional: C's 20 left on the table, split 70 : 20 between A and B
    // (A wants 70 over its share, B 20): 15.5…6 and 4.4…4, rounded down to
    // the millionth.
    assert_eq!(a.saturating_sub(equal), micros(15_555_555));
    assert_eq!(b.saturating_sub(equal), micros(4_444_444));
    assert_eq!(c, q(10.0));
    assert_eq!((a, b), (micros(45_555_555), micros(34_444_444)));
    // To the paper's one decimal: 45.6 and 34.4.
    assert_eq!(format!("{:.1} {:.1}", a.to_f64(), b.to_f64()), "45.6 34.4");

    // The same through a server: after the clients joined and refreshed
    // twice, the leases are the table's.
    let p = params(90.0, Algorithm::ProportionalShare);
    let mut set = LeaseSet::new();
    let clients = [("a", 100.0), ("b", 50.0), ("c", 10.0)];
    round(&mut set, &p, 0, &clients);
    round(&mut set, &p, 1, &clients);
    assert_eq!(round(&mut set, &p, 2, &clients), vec![a, b, c]);
    assert!(sum(&set) <= 90_000_000);
}

// The paper's FairShare table: capacity 160, four clients, in rounds.
//
// | Client | Requested | R1 | R2 | R3 |
// | A      | 100       | 40 | 10 | 5  |
// | B      | 50        | 40 | 10 | 0  |
// | C      | 45        | 40 | 5  | 0  |
// | D      | 10        | 10 | 0  | 0  |
#[test]
fn fair_share_table_of_the_paper() {
    let wants = [100.0, 50.0, 45.0, 10.0];
    // The paper's rounds, written out: each round splits what is left
    // equally among the clients still short of their wants.
    let mut got = [0.0f64; 4];
    let mut left = 160.0;
    let mut rounds = Vec::new();
    while left > 0.0 {
        let short: Vec<usize> = (0..4).filter(|&i| got[i] < wants[i]).collect();
        if short.is_empty() {
            break;
        }
        let split = left / f64::from(u32::try_from(short.len()).expect("few"));
        let mut this_round = [0.0f64; 4];
        for &i in &short {
            this_round[i] = split.min(wants[i] - got[i]);
            got[i] += this_round[i];
            left -= this_round[i];
        }
        rounds.push(this_round);
    }
    assert_eq!(
        rounds,
        vec![
            [40.0, 40.0, 40.0, 10.0],
            [10.0, 10.0, 5.0, 0.0],
            [5.0, 0.0, 0.0, 0.0]
        ]
    );

    // Charon's water-filling ends where the rounds end.
    let shares = Shares::new(
        Algorithm::FairShare,
        q(160.0),
        wants.iter().map(|&w| (q(w), 1)),
    );
    let ours: Vec<Quantity> = wants.iter().map(|&w| shares.of(q(w), 1)).collect();
    assert_eq!(ours, got.iter().map(|&g| q(g)).collect::<Vec<_>>());
    assert_eq!(ours, vec![q(55.0), q(50.0), q(45.0), q(10.0)]);

    // And so does a server, after a join and two refreshes.
    let p = params(160.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    let clients = [("a", 100.0), ("b", 50.0), ("c", 45.0), ("d", 10.0)];
    round(&mut set, &p, 0, &clients);
    round(&mut set, &p, 1, &clients);
    assert_eq!(round(&mut set, &p, 2, &clients), ours);
    assert_eq!(sum(&set), 160_000_000);
}

#[test]
fn fair_share_never_gives_more_than_wanted_where_doormans_two_rounds_do() {
    // Doorman's FairShare code computes B (wants 50) as 40 + 10 + 2.5 in
    // the table above: its second round splits C's 5 between A and B,
    // though B is already satisfied.
    let shares = Shares::new(
        Algorithm::FairShare,
        q(160.0),
        [(q(100.0), 1), (q(50.0), 1), (q(45.0), 1), (q(10.0), 1)],
    );
    assert_eq!(shares.of(q(50.0), 1), q(50.0));
}

#[test]
fn wants_that_fit_are_granted_whole_by_both_shared_algorithms() {
    for algorithm in [Algorithm::ProportionalShare, Algorithm::FairShare] {
        let shares = Shares::new(algorithm, q(100.0), [(q(60.0), 1), (q(40.0), 1)]);
        assert_eq!(shares.of(q(60.0), 1), q(60.0), "{algorithm}");
        assert_eq!(shares.of(q(40.0), 1), q(40.0), "{algorithm}");
    }
}

#[test]
fn subclients_weigh_a_client_as_that_many_clients() {
    // A leaf standing for 3 clients and one client, all wanting a lot:
    // 3/4 and 1/4 of the capacity.
    for algorithm in [Algorithm::ProportionalShare, Algorithm::FairShare] {
        let shares = Shares::new(algorithm, q(100.0), [(q(1000.0), 3), (q(1000.0), 1)]);
        assert_eq!(shares.of(q(1000.0), 3), q(75.0), "{algorithm}");
        assert_eq!(shares.of(q(1000.0), 1), q(25.0), "{algorithm}");
    }
    // Fair share: a leaf of 3 wanting 30 in all is satisfied, the other
    // client gets the rest.
    let shares = Shares::new(
        Algorithm::FairShare,
        q(100.0),
        [(q(30.0), 3), (q(1000.0), 1)],
    );
    assert_eq!(shares.of(q(30.0), 3), q(30.0));
    assert_eq!(shares.of(q(1000.0), 1), q(70.0));
}

#[test]
fn static_capacity_is_per_client_and_may_add_up_to_more() {
    let p = params(10.0, Algorithm::Static);
    let mut set = LeaseSet::new();
    let got = round(&mut set, &p, 0, &[("a", 15.0), ("b", 5.0), ("c", 100.0)]);
    assert_eq!(got, vec![q(10.0), q(5.0), q(10.0)]);
    assert_eq!(sum(&set), 25_000_000, "more than the capacity in all");
    // Per subclient: a leaf of 3 gets up to 30.
    let leaf = Want::parse(100.0, 0.0, 3).expect("valid");
    assert_eq!(
        get_capacity(&mut set, &p, at(0, &p), "leaf", leaf).capacity,
        q(30.0)
    );
    // The safe capacity of static is the per-client capacity.
    assert_eq!(
        get_capacity(&mut set, &p, at(0, &p), "a", want(1.0, 10.0)).safe_capacity,
        q(10.0)
    );
}

#[test]
fn none_gives_everyone_what_it_wants() {
    let p = params(10.0, Algorithm::None);
    let mut set = LeaseSet::new();
    let got = round(&mut set, &p, 0, &[("a", 1_000_000.0), ("b", 7.5)]);
    assert_eq!(got, vec![q(1_000_000.0), q(7.5)]);
    // Learning mode changes nothing for `none`.
    let learning = LeaseContext {
        learning: true,
        ..at(1, &p)
    };
    assert_eq!(
        get_capacity(&mut set, &p, learning, "b", want(8.0, 7.5)).capacity,
        q(8.0)
    );
}

#[test]
fn a_grant_never_exceeds_the_capacity_others_do_not_hold() {
    for algorithm in [Algorithm::ProportionalShare, Algorithm::FairShare] {
        let p = params(100.0, algorithm);
        let mut set = LeaseSet::new();
        // A alone takes everything.
        assert_eq!(round(&mut set, &p, 0, &[("a", 100.0)]), vec![q(100.0)]);
        // B's share is 50, but A holds all of it until A refreshes.
        assert_eq!(
            round(&mut set, &p, 1, &[("b", 100.0)]),
            vec![Quantity::ZERO],
            "{algorithm}"
        );
        // A shrinks to its share at its next refresh; then B grows into it.
        assert_eq!(
            round(&mut set, &p, 2, &[("a", 100.0)]),
            vec![q(50.0)],
            "{algorithm}"
        );
        assert_eq!(
            round(&mut set, &p, 3, &[("b", 100.0)]),
            vec![q(50.0)],
            "{algorithm}"
        );
        // A client's own lease counts as free for it: A refreshes to 50
        // again, not to 0.
        assert_eq!(
            round(&mut set, &p, 4, &[("a", 100.0)]),
            vec![q(50.0)],
            "{algorithm}"
        );
        assert_eq!(sum(&set), 100_000_000);
    }
}

#[test]
fn a_client_can_shrink_and_give_back_what_it_no_longer_wants() {
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    round(&mut set, &p, 0, &[("a", 100.0)]);
    assert_eq!(round(&mut set, &p, 1, &[("a", 20.0)]), vec![q(20.0)]);
    assert_eq!(round(&mut set, &p, 2, &[("b", 100.0)]), vec![q(80.0)]);
}

#[test]
fn learning_mode_gives_what_clients_say_they_have_until_its_last_millisecond() {
    let p = LeaseParams::new(q(100.0), Algorithm::FairShare, 60_000, 5_000).expect("valid");
    assert_eq!(p.learning_mode(), 60_000, "a lease length by default");
    let started = 1_000;
    let mut set = LeaseSet::new();
    let ctx = |now| LeaseContext::root(&p, started, now);
    assert!(ctx(started).learning);
    // A client that held 70 before the server started keeps 70, though
    // alone it would get all it wants.
    assert_eq!(
        get_capacity(&mut set, &p, ctx(started), "a", want(90.0, 70.0)).capacity,
        q(70.0)
    );
    // Never more than it wants…
    assert_eq!(
        get_capacity(&mut set, &p, ctx(started + 1), "b", want(10.0, 25.0)).capacity,
        q(10.0)
    );
    // …nor more than others leave: a confused client claiming 50 gets 20.
    assert_eq!(
        get_capacity(&mut set, &p, ctx(started + 2), "c", want(50.0, 50.0)).capacity,
        q(20.0)
    );
    assert_eq!(sum(&set), 100_000_000);
    // The last learning millisecond, then the algorithm.
    assert!(ctx(started + 59_999).learning);
    assert_eq!(
        get_capacity(&mut set, &p, ctx(started + 59_999), "a", want(90.0, 70.0)).capacity,
        q(70.0)
    );
    assert!(!ctx(started + 60_000).learning);
    // Fair shares of 100 for wants 90/10/50: 10, 45, 45; A holds 70 and
    // its share is 45.
    assert_eq!(
        get_capacity(&mut set, &p, ctx(started + 60_000), "a", want(90.0, 70.0)).capacity,
        q(45.0)
    );
    // Learning mode off.
    let off = p.with_learning_mode(0).expect("valid");
    assert!(!off.learning(started, started));
}

#[test]
fn safe_capacity_configured_or_divided_among_the_clients() {
    let configured = params(100.0, Algorithm::FairShare).with_safe_capacity(q(7.5));
    let mut set = LeaseSet::new();
    assert_eq!(
        get_capacity(
            &mut set,
            &configured,
            at(0, &configured),
            "a",
            want(10.0, 0.0)
        )
        .safe_capacity,
        q(7.5)
    );

    // Dynamic: the capacity over the clients (subclients) holding leases,
    // this one included.
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    let reply = |set: &mut LeaseSet, client, subclients| {
        let w = Want::parse(10.0, 0.0, subclients).expect("valid");
        get_capacity(set, &p, at(0, &p), client, w).safe_capacity
    };
    assert_eq!(reply(&mut set, "a", 1), q(100.0));
    assert_eq!(reply(&mut set, "b", 1), q(50.0));
    assert_eq!(reply(&mut set, "c", 1), micros(33_333_333), "rounded down");
    assert_eq!(reply(&mut set, "leaf", 5), q(12.5));
    assert!(release_capacity(&mut set, "leaf", 0));
    assert_eq!(
        p.safe_capacity(q(100.0), set.subclients()),
        micros(33_333_333)
    );
    assert_eq!(
        p.safe_capacity(q(100.0), 0),
        q(100.0),
        "no clients: all of it"
    );
}

#[test]
fn a_lease_lapses_at_its_exact_millisecond_and_returns_its_capacity() {
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    let a = get_capacity(&mut set, &p, at(1_000, &p), "a", want(100.0, 0.0));
    assert_eq!(
        (a.capacity, a.expires_at_ms, a.refresh_interval_ms),
        (q(100.0), 61_000, 5_000)
    );
    // One millisecond before its expiry A still holds everything.
    assert_eq!(
        get_capacity(&mut set, &p, at(60_999, &p), "b", want(100.0, 0.0)).capacity,
        Quantity::ZERO
    );
    // At its expiry it is gone: B, alone, gets all it wants.
    assert_eq!(
        get_capacity(&mut set, &p, at(61_000, &p), "b", want(100.0, 0.0)).capacity,
        q(100.0)
    );
    assert!(set.get("a").is_none());
    assert_eq!(set.len(), 1);

    // `expire` on its own, at the boundary.
    let mut set = LeaseSet::new();
    get_capacity(&mut set, &p, at(0, &p), "a", want(1.0, 0.0));
    assert!(expire(&mut set, 59_999).is_empty());
    assert_eq!(expire(&mut set, 60_000), vec!["a".to_owned()]);
    assert_eq!(
        (
            set.sum_has_micros(),
            set.sum_wants_micros(),
            set.subclients()
        ),
        (0, 0, 0)
    );
}

#[test]
fn release_gives_the_capacity_back_once() {
    let p = params(100.0, Algorithm::ProportionalShare);
    let mut set = LeaseSet::new();
    round(&mut set, &p, 0, &[("a", 100.0)]);
    assert!(release_capacity(&mut set, "a", 1));
    assert!(!release_capacity(&mut set, "a", 2), "already released");
    assert_eq!(round(&mut set, &p, 3, &[("b", 100.0)]), vec![q(100.0)]);
    assert!(!release_capacity(&mut set, "b", 60_003), "lapsed at 60 003");
    assert!(!release_capacity(&mut set, "nobody", 0));
}

#[test]
fn a_server_in_a_tree_asks_for_its_clients_wants_as_one_client() {
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    assert_eq!(
        set.upstream_want(Quantity::ZERO),
        None,
        "no clients: nothing to ask"
    );
    round(&mut set, &p, 0, &[("a", 30.0), ("b", 12.5)]);
    get_capacity(
        &mut set,
        &p,
        at(0, &p),
        "leaf",
        Want::parse(40.0, 0.0, 4).expect("valid"),
    );
    let up = set.upstream_want(q(50.0)).expect("clients");
    assert_eq!(
        (up.wants(), up.has(), up.subclients()),
        (q(82.5), q(50.0), 6)
    );

    // The root shares among such requests by their weight: a leaf of 6
    // wanting 600 and a client wanting 600 of 70 get 60 and 10.
    let root = params(70.0, Algorithm::FairShare);
    let mut top = LeaseSet::new();
    let leaf = Want::parse(600.0, 0.0, 6).expect("valid");
    get_capacity(&mut top, &root, at(0, &root), "leaf", leaf);
    get_capacity(&mut top, &root, at(0, &root), "c", want(600.0, 0.0));
    assert_eq!(
        get_capacity(&mut top, &root, at(1, &root), "leaf", leaf).capacity,
        q(60.0)
    );
    assert_eq!(
        get_capacity(&mut top, &root, at(1, &root), "c", want(600.0, 0.0)).capacity,
        q(10.0)
    );

    // A leaf shares what its parent granted, not the configured capacity.
    let mut below = LeaseSet::new();
    let granted = LeaseContext {
        capacity: q(60.0),
        ..at(2, &p)
    };
    assert_eq!(
        get_capacity(&mut below, &p, granted, "x", want(100.0, 0.0)).capacity,
        q(60.0)
    );
}

#[test]
fn bad_requests_are_client_errors() {
    for (wants, has) in [
        (f64::NAN, 0.0),
        (-1.0, 0.0),
        (1.0, f64::NAN),
        (1.0, -0.5),
        (f64::INFINITY, 0.0),
    ] {
        assert!(
            matches!(
                Want::parse(wants, has, 1),
                Err(ClientError::InvalidArgument(_))
            ),
            "{wants} {has}"
        );
    }
    assert!(
        matches!(Want::parse(1.0, 0.0, 0), Err(ClientError::InvalidArgument(m)) if m.contains("subclients"))
    );
    assert!(Want::parse(1.0, 0.0, MAX_SUBCLIENTS + 1).is_err());
    assert!(Want::parse(1.0, 0.0, MAX_SUBCLIENTS).is_ok());
}

#[test]
fn parameters_are_checked_by_field() {
    let new = |length, refresh| LeaseParams::new(q(1.0), Algorithm::FairShare, length, refresh);
    assert_eq!(new(0, 0).map_err(|e| e.field), Err("lease_length"));
    assert_eq!(new(1_000, 0).map_err(|e| e.field), Err("refresh_interval"));
    assert_eq!(
        new(1_000, 1_001).map_err(|e| e.field),
        Err("refresh_interval")
    );
    assert!(new(1_000, 1_000).is_ok());
    assert_eq!(
        new(1_000, 1)
            .and_then(|p| p.with_learning_mode(MAX_COUNT + 1))
            .map_err(|e| e.field),
        Err("learning_mode")
    );
    assert_eq!("fair_share".parse(), Ok(Algorithm::FairShare));
    assert_eq!(
        "proportional_share".parse(),
        Ok(Algorithm::ProportionalShare)
    );
    assert!(
        "fair"
            .parse::<Algorithm>()
            .is_err_and(|e| e.contains("fair_share"))
    );
    for name in Algorithm::NAMES {
        assert_eq!(name.parse::<Algorithm>().map(Algorithm::name), Ok(*name));
    }
}

#[test]
fn the_reply_has_the_field_names_of_the_spec() {
    let p = params(90.0, Algorithm::ProportionalShare);
    let mut set = LeaseSet::new();
    round(&mut set, &p, 0, &[("a", 100.0), ("b", 50.0), ("c", 10.0)]);
    round(&mut set, &p, 1, &[("a", 100.0), ("b", 50.0), ("c", 10.0)]);
    let reply = get_capacity(&mut set, &p, at(2, &p), "a", want(100.0, 45.555_555));
    assert_eq!(
        serde_json::to_string(&reply).expect("json"),
        r#"{"capacity":45.555555,"expires_at_ms":60002,"refresh_interval_ms":5000,"safe_capacity":30}"#
    );
}

#[test]
fn kept_shares_follow_the_capacity_and_wants_changed_in_learning_mode() {
    // A leaf whose parent grants less: the same wants, a smaller capacity.
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    let ctx = |now, capacity: f64, learning| LeaseContext {
        now,
        capacity: q(capacity),
        learning,
    };
    get_capacity(&mut set, &p, ctx(0, 60.0, false), "a", want(100.0, 0.0));
    get_capacity(&mut set, &p, ctx(0, 60.0, false), "b", want(100.0, 0.0));
    assert_eq!(
        get_capacity(&mut set, &p, ctx(1, 60.0, false), "a", want(100.0, 0.0)).capacity,
        q(30.0)
    );
    assert_eq!(
        get_capacity(&mut set, &p, ctx(2, 30.0, false), "a", want(100.0, 15.0)).capacity,
        q(15.0)
    );

    // Wants that changed while learning count once learning is over.
    let p = params(100.0, Algorithm::FairShare);
    let mut set = LeaseSet::new();
    get_capacity(&mut set, &p, ctx(0, 100.0, false), "a", want(100.0, 0.0));
    get_capacity(&mut set, &p, ctx(0, 100.0, false), "b", want(100.0, 0.0));
    get_capacity(&mut set, &p, ctx(1, 100.0, true), "b", want(10.0, 0.0));
    // B wants 10 now: A's fair share is 90, not the 50 of before.
    assert_eq!(
        get_capacity(&mut set, &p, ctx(2, 100.0, false), "a", want(100.0, 0.0)).capacity,
        q(90.0)
    );
}
