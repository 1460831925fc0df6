//! A private `redis-server`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::free_port;

/// A `redis-server` of its own: a free port, a temporary directory, no
/// persistence. Killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    /// Only the first start may move to another port: a restart keeps the
    /// port its clients know.
    fresh_port_allowed: bool,
}

impl RedisServer {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = Self {
            child: None,
            port: free_port(),
            dir,
            fresh_port_allowed: true,
        };
        server.spawn();
        server.fresh_port_allowed = false;
        server
    }

    /// Starts `redis-server` on `self.port` and waits until *that* process
    /// answers `PING`. A port that was free a moment ago may have been
    /// taken since by a parallel test (the CI failure of stop 19: a
    /// connection reset by something else on the port), so on a first
    /// start a server that exits early is started again on a fresh port.
    fn spawn(&mut self) {
        for _attempt in 0..5 {
            match self.spawn_once() {
                Ok(()) => return,
                Err(why) if self.fresh_port_allowed => {
                    eprintln!(
                        "redis-server on port {}: {why}; trying another port",
                        self.port
                    );
                    self.port = free_port();
                }
                Err(why) => {
                    eprintln!("redis-server on port {}: {why}; trying again", self.port);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        panic!("redis-server did not start after 5 attempts");
    }

    fn spawn_once(&mut self) -> Result<(), String> {
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
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited at start ({status})"));
            }
            if answers_ping(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err("no PONG after 10 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// Whether a Redis on `port` answers `PING` with `+PONG` within 500 ms.
fn answers_ping(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
