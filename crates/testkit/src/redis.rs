//! A private `redis-server`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{free_port, wait_for_port};

/// A `redis-server` of its own: a free port, a temporary directory, no
/// persistence. Killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = Self {
            child: None,
            port: free_port(),
            dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH");
        self.child = Some(child);
        wait_for_port(self.port, Duration::from_secs(10)).expect("redis-server starts");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL), losing all data, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id (0 once killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Stops it (SIGSTOP), as a stalled host or a long fork would: it keeps
    /// its connections and data and answers nothing until [`resume`].
    ///
    /// [`resume`]: RedisServer::resume
    pub fn stop(&self) {
        crate::signal(self.pid(), "STOP");
    }

    /// Lets a stopped server go on (SIGCONT).
    pub fn resume(&self) {
        crate::signal(self.pid(), "CONT");
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills it, leaves the port closed for `down`, then starts it again,
    /// empty, on the same port (a restart without persistence).
    pub fn restart_after(&mut self, down: Duration) {
        self.kill();
        std::thread::sleep(down);
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
