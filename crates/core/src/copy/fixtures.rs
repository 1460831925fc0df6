//! Fixtures of the copy rules' unit tests (`copy` and `copy::state`).

use crate::config::{CopyLimits, GroupLimit};
use crate::request::Amount;

/// Copy limits: `domain` per domain, `global` in all, and these groups.
pub(crate) fn limits(domain: u64, global: Option<u64>, groups: &[(&str, u64)]) -> CopyLimits {
    CopyLimits {
        domain_limit: domain,
        global_limit: global,
        groups: groups
            .iter()
            .map(|(n, l)| GroupLimit {
                name: (*n).to_owned(),
                limit: *l,
            })
            .collect(),
    }
}

/// A valid amount: `c` copies, at least `m`.
pub(crate) fn amount(c: u64, m: u64) -> Amount {
    Amount::new(c, m).expect("valid")
}
