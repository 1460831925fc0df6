//! The server's integration tests, one test binary (issue 28, item 7): each
//! module is a former `tests/*.rs` binary, so they compile and link once
//! instead of four times.

mod copy_waits;
mod copy_waits_fleet;
mod envoy;
mod in_process;
mod listeners;
