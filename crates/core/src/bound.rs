//! The bound on every count a store keeps (issue 9, defect 8).
//!
//! Counts up to [`MAX_COUNT`] (2^53 − 1) are valid in a request, and a
//! store must keep each of its counts exact: copies held per domain, per
//! group and of the resource; hits of a domain and of all domains in the
//! last second (every other count — a tier's hits, a staging area — is
//! part of one of these). Redis' Lua numbers are doubles, exact only up to
//! 2^53, and `HINCRBY` stops at 2^63; a u64 stops at 2^64.
//!
//! The rule, the same in every store: **a grant that would take any kept
//! count beyond [`MAX_COUNT`] is refused as a client error naming the
//! bound, and nothing changes.** The limits decide the grant first (a
//! rejection stays a rejection); only a grant is checked, against each
//! count in a fixed order (domain, then resource, then each group), and the
//! first count it would overflow is named. So every kept count is always at
//! most [`MAX_COUNT`], and so are the sums the Redis scripts compute.

use std::fmt;

use crate::{ClientError, MAX_COUNT};

/// A count a store keeps, as a refusal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept<'a> {
    /// Copies held by one domain.
    DomainCopies(&'a str),
    /// Copies held of the resource, by all domains.
    ResourceCopies,
    /// Copies held by one group.
    GroupCopies(&'a str),
    /// Hits of the requesting domain in the last second.
    DomainHits,
    /// Hits of all domains in the last second.
    ResourceHits,
    /// Hits in the current tier's window: the one count a `charge` can take
    /// past its limit (and past the domain's last second, for windows
    /// longer than a second).
    TierHits,
}

impl fmt::Display for Kept<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::DomainCopies(d) => write!(f, "the copies held by domain {d:?}"),
            Kept::ResourceCopies => f.write_str("the copies held of the resource"),
            Kept::GroupCopies(g) => write!(f, "the copies held by group {g:?}"),
            Kept::DomainHits => f.write_str("the hits of this domain in the last second"),
            Kept::ResourceHits => f.write_str("the hits of all domains in the last second"),
            Kept::TierHits => f.write_str("the hits in the current tier's window"),
        }
    }
}

/// Whether `n` more keep `count`, now `held`, within [`MAX_COUNT`]; if not,
/// the client error that names the bound. A count already above the bound
/// (data from before the bound existed) takes nothing more.
pub fn check(count: Kept<'_>, held: u64, n: u64) -> Result<(), ClientError> {
    if n <= MAX_COUNT.saturating_sub(held) {
        return Ok(());
    }
    Err(refusal(count, held, n))
}

/// The client error for a grant of `n` that `count`, now `held`, cannot
/// take: what a store reports when its own atomic step found it (the Redis
/// scripts repeat [`check`] and send `held` and `n` back).
pub fn refusal(count: Kept<'_>, held: u64, n: u64) -> ClientError {
    ClientError::invalid(format!(
        "granting {n} would take {count} to {}, beyond {MAX_COUNT} (2^53-1), the largest count Charon keeps",
        u128::from(held) + u128::from(n)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_inclusive_and_never_overflows() {
        let d = Kept::DomainCopies("a");
        assert!(check(d, 0, MAX_COUNT).is_ok());
        assert!(check(d, MAX_COUNT - 1, 1).is_ok());
        assert!(check(d, MAX_COUNT, 1).is_err());
        assert!(check(d, 1, MAX_COUNT).is_err());
        assert!(check(d, u64::MAX, u64::MAX).is_err(), "no u64 overflow");
        assert_eq!(
            check(Kept::ResourceHits, MAX_COUNT, MAX_COUNT)
                .expect_err("past the bound")
                .to_string(),
            "granting 9007199254740991 would take the hits of all domains in the last second \
             to 18014398509481982, beyond 9007199254740991 (2^53-1), the largest count Charon keeps"
        );
    }
}
