//! A private PostgreSQL cluster.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{free_port, wait_for_port};

/// A PostgreSQL cluster of its own (`initdb` into a temporary directory,
/// trust authentication, a free port). Stopped on drop.
///
/// PostgreSQL refuses to run as root; when the tests do, the cluster runs
/// as the `postgres` user through `runuser`.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    data: PathBuf,
    _dir: TempDir,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A command from the PostgreSQL binaries, as the right user.
fn pg(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    }
}

fn chown_to_postgres(path: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .expect("chown");
        assert!(status.success(), "chown {} to postgres", path.display());
    }
}

impl Postgres {
    /// Initializes and starts a cluster; waits until it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for postgres");
        chown_to_postgres(dir.path());
        let data = dir.path().join("data");
        let out = pg("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .stdout(Stdio::null())
            .output()
            .expect("initdb must be on PATH");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A port free a moment ago may be taken by a parallel test before
        // the postmaster binds it; then pg_ctl fails and another port is
        // tried.
        let mut port = free_port();
        let mut attempts = 0;
        loop {
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off",
                dir.path().display()
            );
            let out = pg("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["-o", &options, "-l"])
                .arg(dir.path().join("log"))
                .args(["-w", "start"])
                .stdout(Stdio::null())
                .output()
                .expect("pg_ctl must be on PATH");
            if out.status.success() {
                break;
            }
            attempts += 1;
            assert!(
                attempts < 5,
                "pg_ctl start: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(dir.path().join("log")).unwrap_or_default()
            );
            port = free_port();
        }
        wait_for_port(port, Duration::from_secs(20)).expect("postgres starts");
        Self {
            port,
            data,
            _dir: dir,
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a database and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let out = pg("createdb")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                name,
            ])
            .output()
            .expect("createdb must be on PATH");
        assert!(
            out.status.success(),
            "createdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = pg("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
