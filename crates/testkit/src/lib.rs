//! Test support for Charon's integration tests: start real things on free
//! ports in temporary directories, wait until they are ready, and clean
//! them up on drop, so tests run in parallel and never touch anyone's data.
//!
//! Everything is started from binaries on `PATH` (`redis-server`,
//! `initdb`/`pg_ctl`); nothing is installed here.

#![allow(clippy::unwrap_used)]

mod charon;
#[cfg(feature = "server")]
mod in_process;
mod postgres;
mod redis;
mod redis_cluster;
mod small_fs;
#[cfg(feature = "store")]
pub mod stores;
#[cfg(feature = "tls")]
mod tls;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub use charon::{CharonProcess, HttpProbe, http_get, signal};
#[cfg(feature = "server")]
pub use in_process::InProcessServer;
pub use postgres::Postgres;
pub use redis::{RedisServer, RedisSetup, RedisTlsSetup};
pub use redis_cluster::RedisCluster;
pub use small_fs::SmallFs;
#[cfg(feature = "tls")]
pub use tls::{TestPki, https_get, presented_certificate};

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Waits until something accepts TCP connections on `port`.
pub fn wait_for_port(port: u16, timeout: Duration) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing listens on port {port} after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `ready` every 25 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, ready: impl FnMut() -> bool) -> bool {
    poll_until(timeout, Duration::from_millis(25), ready)
}

/// Polls `ready` every `every` until it returns true or `timeout` passes:
/// for what lasts only milliseconds (a process's start-up), which
/// [`wait_until`]'s 25 ms poll would see only once it is over.
pub fn poll_until(timeout: Duration, every: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(every);
    }
    ready()
}

/// What every refusal at the bound of kept counts says (issue 9, defect 8),
/// after the count it names.
pub const BOUND: &str = "beyond 9007199254740991 (2^53-1), the largest count Charon keeps";

/// The message of a grant of `n` refused because it would take `count`
/// (which holds `held`) past 2^53 - 1, written out here rather than taken
/// from core, so that the stores' tests and the process tests check the
/// text a client sees against one independent spelling.
pub fn refusal_at_bound(count: &str, held: u64, n: u64) -> String {
    format!(
        "granting {n} would take {count} to {}, {BOUND}",
        u128::from(held) + u128::from(n)
    )
}
