//! The limiter's integration tests, one test binary (issue 28, item 7): each
//! module is a former `tests/*.rs` binary, so they compile and link once
//! instead of four times.

#![allow(clippy::unwrap_used)]

mod differential;
mod meters;
mod redis_rebuild;
mod sessions;
