//! The simulator page's integration tests, one test binary (issue 28, item
//! 7): each module is a former `tests/*.rs` binary, so they compile and link
//! once instead of twice.

mod api;
mod e2e;
mod stampede;
