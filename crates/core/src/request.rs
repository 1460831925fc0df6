//! Validated request arguments. Raw numbers from the network or a file
//! become these types through `new`, so an invalid count cannot reach an
//! algorithm (parse, don't validate).

use crate::{ClientError, MAX_COUNT, Millis};

/// How many hits or copies a request asks for: grant the largest `n` in
/// `[min_copies, copies]`, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amount {
    copies: u64,
    min_copies: u64,
}

impl Amount {
    /// Checks SPEC §2 rule 5: `copies = 0`, `min_copies = 0` and
    /// `min_copies > copies` are client errors.
    pub fn new(copies: u64, min_copies: u64) -> Result<Self, ClientError> {
        if copies == 0 {
            return Err(ClientError::invalid("copies must be at least 1"));
        }
        if min_copies == 0 {
            return Err(ClientError::invalid("min_copies must be at least 1"));
        }
        if copies > MAX_COUNT {
            return Err(ClientError::invalid(format!(
                "copies must be at most {MAX_COUNT}"
            )));
        }
        if min_copies > copies {
            return Err(ClientError::invalid(format!(
                "min_copies ({min_copies}) must not exceed copies ({copies})"
            )));
        }
        Ok(Self { copies, min_copies })
    }

    /// Exactly `n` (`copies = min_copies = n`).
    pub fn exactly(n: u64) -> Result<Self, ClientError> {
        Self::new(n, n)
    }

    /// The most that may be granted.
    pub fn copies(self) -> u64 {
        self.copies
    }

    /// The least that is worth granting.
    pub fn min_copies(self) -> u64 {
        self.min_copies
    }

    /// The grant for a request that may take at most `available`: the
    /// largest n in `[min_copies, copies]` not above it, or `None`.
    pub fn grant_within(self, available: u64) -> Option<u64> {
        let n = self.copies.min(available);
        (n >= self.min_copies).then_some(n)
    }
}

/// A count of copies to give back (release, transfer): at least one.
pub fn positive_count(field: &str, n: u64) -> Result<u64, ClientError> {
    if n == 0 {
        return Err(ClientError::invalid(format!("{field} must be at least 1")));
    }
    if n > MAX_COUNT {
        return Err(ClientError::invalid(format!(
            "{field} must be at most {MAX_COUNT}"
        )));
    }
    Ok(n)
}

/// A transfer's time to live: at least one millisecond.
pub fn transfer_ttl(ms: Millis) -> Result<Millis, ClientError> {
    positive_count("ttl_ms", ms)
}

/// A resource or domain name: non-empty, at most 1024 bytes, no control
/// characters (they would break logs, metrics labels and Redis keys).
pub fn check_name(field: &str, name: &str) -> Result<(), ClientError> {
    if name.is_empty() {
        return Err(ClientError::invalid(format!("{field} must not be empty")));
    }
    if name.len() > 1024 {
        return Err(ClientError::invalid(format!(
            "{field} is {} bytes long; at most 1024 are allowed",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(ClientError::invalid(format!(
            "{field} must not contain control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_follow_rule_5() {
        assert!(Amount::new(0, 1).is_err());
        assert!(Amount::new(1, 0).is_err());
        assert!(Amount::new(2, 3).is_err());
        assert!(Amount::new(MAX_COUNT + 1, 1).is_err());
        let a = Amount::new(5, 2).expect("valid");
        assert_eq!(a.grant_within(10), Some(5));
        assert_eq!(a.grant_within(3), Some(3));
        assert_eq!(a.grant_within(1), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("domain", "").is_err());
        assert!(check_name("domain", "a\nb").is_err());
        assert!(check_name("domain", &"x".repeat(1025)).is_err());
        assert!(check_name("domain", "tenant-42").is_ok());
    }
}
