//! A real `charon serve` process.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use tempfile::TempDir;

use crate::free_port;

/// How a test reaches a server's HTTP side: plain HTTP by default,
/// HTTPS for a server under TLS (`TestPki::probe`, feature `tls`).
#[derive(Clone)]
pub struct HttpProbe(Arc<Get>);

/// A GET on a port and path: (status, body), or `None`.
type Get = dyn Fn(u16, &str) -> Option<(u16, String)> + Send + Sync;

impl HttpProbe {
    /// A probe that GETs a path on a port: (status, body), or `None`.
    pub fn new(get: impl Fn(u16, &str) -> Option<(u16, String)> + Send + Sync + 'static) -> Self {
        Self(Arc::new(get))
    }
}

impl Default for HttpProbe {
    fn default() -> Self {
        Self::new(http_get)
    }
}

impl std::fmt::Debug for HttpProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpProbe")
    }
}

/// `charon serve` on free ports with a configuration file in a temporary
/// directory; its log goes to a file there. Killed on drop.
#[derive(Debug)]
pub struct CharonProcess {
    child: Option<Child>,
    /// The gRPC port.
    pub grpc_port: u16,
    /// The HTTP port.
    pub http_port: u16,
    dir: TempDir,
    /// What [`CharonProcess::restart`] starts again.
    started: Option<(PathBuf, Vec<String>, String)>,
    /// How readiness and [`CharonProcess::http_get`] reach the HTTP side.
    probe: HttpProbe,
}

impl CharonProcess {
    /// Starts `bin serve --config <config> <extra args>` and waits until
    /// `/readyz` answers 200.
    pub fn start(bin: &Path, config: &str, extra: &[&str]) -> Self {
        let process = Self::unstarted();
        std::fs::write(process.config_path(), config).expect("write config");
        let config_path = process.config_path().display().to_string();
        let mut args = vec!["--config", config_path.as_str()];
        args.extend_from_slice(extra);
        process.spawn_into(bin, &args, "/readyz")
    }

    /// Starts `bin serve <args>` (with free `--listen`/`--http-listen`) and
    /// waits until `ready_path` answers 200. `{dir}` in an argument is
    /// replaced by the process's temporary directory.
    pub fn start_args(bin: &Path, args: &[&str], ready_path: &str) -> Self {
        Self::start_probed(bin, args, ready_path, HttpProbe::default())
    }

    /// [`CharonProcess::start_args`] for a server whose HTTP side `probe`
    /// reaches (HTTPS under TLS).
    pub fn start_probed(bin: &Path, args: &[&str], ready_path: &str, probe: HttpProbe) -> Self {
        Self::start_probed_with(bin, args, ready_path, probe, |_| {})
    }

    /// [`CharonProcess::start_probed`], after `prepare` has put what the
    /// server reads at start (certificates, say) in its directory.
    pub fn start_probed_with(
        bin: &Path,
        args: &[&str],
        ready_path: &str,
        probe: HttpProbe,
        prepare: impl FnOnce(&Path),
    ) -> Self {
        let mut process = Self::unstarted();
        process.probe = probe;
        prepare(process.dir());
        let dir = process.dir().display().to_string();
        let args: Vec<String> = args.iter().map(|a| a.replace("{dir}", &dir)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        process.spawn_into(bin, &args, ready_path)
    }

    fn unstarted() -> Self {
        Self {
            child: None,
            grpc_port: free_port(),
            http_port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            started: None,
            probe: HttpProbe::default(),
        }
    }

    /// The process's temporary directory (configuration, log, databases).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://127.0.0.1:PORT` of the HTTP side.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    fn spawn_into(mut self, bin: &Path, args: &[&str], ready_path: &str) -> Self {
        self.started = Some((
            bin.to_owned(),
            args.iter().map(|a| (*a).to_owned()).collect(),
            ready_path.to_owned(),
        ));
        // A port free a moment ago may be taken by a parallel test before
        // the server binds it: then it exits saying "cannot listen on", and
        // a first start tries two fresh ports.
        for _attempt in 0..4 {
            if self.try_spawn() {
                return self;
            }
            if !self.log().contains("cannot listen on") {
                break;
            }
            self.grpc_port = free_port();
            self.http_port = free_port();
        }
        panic!("charon serve did not become ready:\n{}", self.log());
    }

    /// Starts the process again, after a [`CharonProcess::kill`] (or kills
    /// it first), on the same ports, directory and arguments, as a
    /// supervisor would restart a crashed server; waits until it is ready.
    /// The log goes on in the same file.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "charon serve did not become ready:\n{}",
            self.log()
        );
    }

    /// Starts the process and waits until it is ready (true) or has exited
    /// or 20 s have passed (false).
    fn try_spawn(&mut self) -> bool {
        let (bin, args, ready_path) = self.started.clone().expect("started once");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("charon.log"))
            .expect("log file");
        let child = Command::new(&bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.grpc_port)])
            .args(["--http-listen", &format!("127.0.0.1:{}", self.http_port)])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn charon serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let ready = loop {
            // Ready only when the answer comes from this child: a parallel
            // test's server may hold a port that was free when it was
            // chosen, and would answer in its place while this child exits.
            if self
                .http_get(&ready_path)
                .is_some_and(|(code, _)| code == 200)
                && self.owns_its_http_port()
            {
                break true;
            }
            let exited = self
                .child
                .as_mut()
                .is_none_or(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        if !ready {
            self.kill();
        }
        ready
    }

    /// Whether this process's child is the one listening on the HTTP port
    /// that answered (a configuration service alone has no gRPC port).
    fn owns_its_http_port(&self) -> bool {
        let pid = self.pid();
        pid != 0 && listens_on(pid, self.http_port)
    }

    /// The configuration file the server reads (rewrite it to reload).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("limits.yaml")
    }

    /// `http://127.0.0.1:PORT` of the gRPC side.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("charon.log")).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// A GET on the HTTP side: (status, body), or `None` if it cannot
    /// connect.
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        (self.probe.0)(self.http_port, path)
    }

    /// Sends a signal (`TERM`, `HUP`, `STOP`, `CONT`, `KILL`).
    pub fn signal(&self, name: &str) {
        signal(self.pid(), name);
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit by itself, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for CharonProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends signal `name` to process `pid` with `kill(1)`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -{name} {pid}");
    if name == "STOP" {
        until_stopped(pid);
    }
}

/// Waits until every thread of `pid` has stopped: `kill` returns once the
/// signal is queued, and a thread that was busy may still answer a request
/// or two before it stops, which a test that stops a server to hold
/// requests in flight must not see.
fn until_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.filter_map(Result::ok).all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                    // The state follows the command name in parentheses.
                    stat.rsplit_once(") ")
                        .and_then(|(_, rest)| rest.chars().next())
                        .is_some_and(|state| matches!(state, 'T' | 't'))
                })
            })
        })
    };
    while !stopped() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether process `pid` holds a listening TCP socket on `port`: the
/// socket inodes among its open files (`/proc/PID/fd`) against the
/// listening sockets of `/proc/net/tcp{,6}`.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // local address (ADDR:PORT in hex), state 0A = LISTEN, inode.
                f.len() > 9
                    && f[3] == "0A"
                    && f[1]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
                    && inodes.contains(f[9])
            })
        })
    })
}

/// A minimal HTTP/1.1 GET on 127.0.0.1:`port`.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    parse_response(&raw)
}

/// (status, body) of a whole HTTP/1.1 response.
pub(crate) fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((code, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
