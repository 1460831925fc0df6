//! A private `redis-server`, plain or TLS only, with or without
//! passwords and ACL users.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
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
    setup: RedisSetup,
}

/// How a [`RedisServer`] differs from a plain one without passwords.
/// Kept across restarts.
#[derive(Debug, Clone, Default)]
pub struct RedisSetup {
    /// TLS only: the plain port is closed (`--port 0`) and the server
    /// listens with `--tls-port`.
    pub tls: Option<RedisTlsSetup>,
    /// `--requirepass`: the `default` user's password.
    pub requirepass: Option<String>,
    /// ACL users, one `--user` line each, e.g.
    /// `"charon on >secret ~charon:* +evalsha"`.
    pub users: Vec<String>,
}

/// The TLS side of a [`RedisSetup`]: files in PEM.
#[derive(Debug, Clone)]
pub struct RedisTlsSetup {
    /// `--tls-cert-file`: the server's certificate.
    pub cert: PathBuf,
    /// `--tls-key-file`: its key.
    pub key: PathBuf,
    /// `--tls-ca-cert-file`: the CA client certificates must chain to.
    pub ca: PathBuf,
    /// `--tls-auth-clients`: `yes` (a client certificate is required),
    /// `no` or `optional`.
    pub auth_clients: &'static str,
    /// A client certificate and key signed by `ca` and a CA file that
    /// trusts `cert`, with which the readiness probe (`redis-cli --tls`)
    /// connects.
    pub probe: (PathBuf, PathBuf, PathBuf),
}

#[cfg(feature = "tls")]
impl RedisTlsSetup {
    /// The files of `pki`: its server certificate, clients checked
    /// against its CA as `auth_clients` says.
    pub fn from_pki(pki: &crate::TestPki, auth_clients: &'static str) -> Self {
        Self {
            cert: pki.server_cert(),
            key: pki.server_key(),
            ca: pki.ca(),
            auth_clients,
            probe: (pki.client_cert(), pki.client_key(), pki.ca()),
        }
    }
}

impl RedisServer {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(RedisSetup::default())
    }

    /// Starts one set up as `setup` says and waits until it answers.
    pub fn start_with(setup: RedisSetup) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = Self {
            child: None,
            port: free_port(),
            dir,
            fresh_port_allowed: true,
            setup,
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
        let mut command = Command::new("redis-server");
        match &self.setup.tls {
            None => {
                command.args(["--port", &self.port.to_string()]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args(["--tls-auth-clients", tls.auth_clients]);
            }
        }
        if let Some(pass) = &self.setup.requirepass {
            command.args(["--requirepass", pass]);
        }
        for user in &self.setup.users {
            // One config line: the name and each rule are words of it.
            command.arg("--user").args(user.split_whitespace());
        }
        let child = command
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
            if self.answers() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err("no PONG after 10 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers `PING` (an answer that it needs a password
    /// counts: it is this server answering).
    fn answers(&self) -> bool {
        let Some(tls) = &self.setup.tls else {
            return answers_ping(self.port);
        };
        let (cert, key, ca) = &tls.probe;
        Command::new("redis-cli")
            .args(["--tls", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .arg("--cacert")
            .arg(ca)
            .arg("PING")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|out| {
                let text = String::from_utf8_lossy(&out.stdout);
                text.contains("PONG") || text.contains("NOAUTH")
            })
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://…` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.setup.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// [`RedisServer::url`] with a user and password
    /// (`redis://user:password@127.0.0.1:PORT`); an empty `user` is the
    /// `default` user (`redis://:password@…`).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
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
    s.write_all(b"PING\r\n").is_ok()
        && s.read_exact(&mut buf).is_ok()
        && (&buf == b"+PONG\r\n" || &buf == b"-NOAUTH")
}
