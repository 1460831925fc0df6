//! The client library's integration tests, one test binary (issue 28, item
//! 7): each module is a former `tests/*.rs` binary, so they compile and link
//! once instead of three times.

#![allow(clippy::unwrap_used)]

mod in_process;
mod leases;
mod sessions;
