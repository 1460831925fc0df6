//! Envoy's per-descriptor and per-call counters on the hot path, resolved
//! once per label set rather than by name on every call.
//!
//! Resolving a series by name builds its labels (copying the domain and
//! node names), hashes them and looks them up in the recorder's map; an
//! Envoy call did that once per descriptor and once more for the call. The
//! label values come from the configuration (a configured domain, a node's
//! label), so the handles are kept in a map from domain to node, looked up
//! by `&str` without copying; each series is still registered the first
//! time it counts, so `/metrics` shows exactly the series it showed.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use metrics::{Counter, counter};

use super::catalog::{
    ENVOY_CALLS, ENVOY_DESCRIPTORS, ENVOY_NEAR_LIMIT, ENVOY_OVER_LIMIT, ENVOY_SHADOW,
};
use super::install;

/// The counters of one `(domain, node)` label set, in the order of
/// [`NODE_METRICS`].
#[derive(Debug, Default)]
struct NodeCounters([OnceLock<Counter>; 4]);

/// The per-descriptor metrics, by their place in [`NodeCounters`].
const NODE_METRICS: [&str; 4] = [
    ENVOY_DESCRIPTORS.name,
    ENVOY_OVER_LIMIT.name,
    ENVOY_NEAR_LIMIT.name,
    ENVOY_SHADOW.name,
];

/// The counters of one domain: per node, and its calls by code (ok, over
/// limit).
#[derive(Debug, Default)]
struct DomainCounters {
    nodes: HashMap<Box<str>, NodeCounters>,
    calls: [OnceLock<Counter>; 2],
}

/// Every domain's counters. Label values are configured names (and the
/// fixed `(unknown)`, `(none)`), so the map is bounded by the names the
/// configurations in force have used. Written only the first time a label
/// set is seen; a call takes the read lock once.
type Domains = RwLock<HashMap<Box<str>, DomainCounters>>;

fn domains() -> &'static Domains {
    static DOMAINS: OnceLock<Domains> = OnceLock::new();
    DOMAINS.get_or_init(|| {
        // A handle taken before the recorder is installed would count
        // nothing for the life of the process.
        install();
        RwLock::default()
    })
}

/// Runs `f` on the counters of `domain` (and of `node` in it, when given),
/// made on first use.
fn with<T>(
    domain: &str,
    node: Option<&str>,
    f: impl Fn(&DomainCounters, Option<&NodeCounters>) -> T,
) -> T {
    let find = |map: &HashMap<Box<str>, DomainCounters>| {
        let d = map.get(domain)?;
        match node {
            None => Some(f(d, None)),
            Some(n) => d.nodes.get(n).map(|n| f(d, Some(n))),
        }
    };
    // A poisoned lock only means a panic elsewhere while it was held; the
    // map itself is always whole (an insert either happened or not).
    if let Some(v) = find(
        &domains()
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    ) {
        return v;
    }
    let mut w = domains()
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let d = w.entry(domain.into()).or_default();
    if let Some(n) = node {
        d.nodes.entry(n.into()).or_default();
    }
    find(&w).unwrap_or_else(|| unreachable!("just inserted"))
}

/// One descriptor of an Envoy call: counted, and whether it was over its
/// limit, over its soft limit, and over but shadowed.
pub fn envoy_descriptor(domain: &str, node: &str, over: bool, near: bool, shadow: bool) {
    with(domain, Some(node), |_, n| {
        let Some(n) = n else { return };
        for (i, counts) in [true, over, near, shadow].into_iter().enumerate() {
            if counts {
                n.0[i]
                    .get_or_init(|| {
                        counter!(NODE_METRICS[i], "domain" => domain.to_owned(), "node" => node.to_owned())
                    })
                    .increment(1);
            }
        }
    });
}

/// One answered Envoy call and its overall code.
pub fn envoy_call(domain: &str, over: bool) {
    let code = if over { "over_limit" } else { "ok" };
    with(domain, None, |d, _| {
        d.calls[usize::from(over)]
            .get_or_init(
                || counter!(ENVOY_CALLS.name, "domain" => domain.to_owned(), "code" => code),
            )
            .increment(1);
    });
}
