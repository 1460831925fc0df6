//! One module per operation, each mapping protobuf to core types and back
//! and nothing else.

pub mod charge;
pub mod release;
pub mod request;
pub mod reserve;
pub mod seize;
pub mod transfer;

use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_core::{ClientError, UNBOUNDED};

/// `copies`/`min_copies` as sent: unset means 1, an explicit 0 is refused.
pub fn amount(copies: Option<u64>, min_copies: Option<u64>) -> Result<Amount, ClientError> {
    Amount::new(copies.unwrap_or(1), min_copies.unwrap_or(1))
}

/// A limit for the wire: unset when unbounded.
pub fn limit(l: u64) -> Option<u64> {
    (l != UNBOUNDED).then_some(l)
}

/// The most groups a hold may name; more is a malformed request.
const MAX_GROUPS: usize = 256;

/// A hold key from a release or transfer message.
pub fn hold(resource: String, domain: String, groups: Vec<String>) -> Result<Hold, ClientError> {
    if groups.len() > MAX_GROUPS {
        return Err(ClientError::invalid(format!(
            "at most {MAX_GROUPS} groups may be named"
        )));
    }
    Ok(Hold::new(resource, domain, groups))
}
