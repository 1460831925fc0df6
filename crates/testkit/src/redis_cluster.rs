//! A private Redis Cluster: six `redis-server` processes (three masters,
//! three replicas) on free ports, made into a cluster by
//! `redis-cli --cluster create`, with the faults the cluster tests need
//! (a master killed, a slot moved while serving). Everything is stopped
//! and removed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::RedisTlsSetup;

/// How many nodes: three masters, each with one replica.
const NODES: usize = 6;

/// One node of a [`RedisCluster`].
#[derive(Debug)]
struct Node {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

/// A private Redis Cluster of three masters and three replicas.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    users: Vec<String>,
    /// Masters killed whose slots another node must take over.
    killed: Vec<u16>,
    /// TLS only (`tls-cluster yes`), if set.
    tls: Option<RedisTlsSetup>,
    /// `redis-cli`'s TLS options for [`RedisCluster::tls`].
    tls_args: Vec<String>,
}

/// A node's line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts a cluster whose default user has no password.
    pub fn start() -> Self {
        Self::start_with_users(Vec::new())
    }

    /// Starts a cluster with ACL users (`--user` lines, as
    /// `RedisSetup::users`) on every node; the default user stays open
    /// so that the nodes and `redis-cli --cluster` need no password.
    pub fn start_with_users(users: Vec<String>) -> Self {
        Self::start_with(users, None)
    }

    /// Starts a cluster with ACL users and, with `tls`, TLS only: clients,
    /// the cluster bus and replication (`tls-cluster yes`,
    /// `tls-replication yes`), the nodes showing each other the server
    /// certificate.
    pub fn start_with(users: Vec<String>, tls: Option<RedisTlsSetup>) -> Self {
        let tls_args = tls.as_ref().map_or_else(Vec::new, |t| {
            let (cert, key, ca) = &t.probe;
            vec![
                "--tls".to_owned(),
                "--cert".to_owned(),
                cert.display().to_string(),
                "--key".to_owned(),
                key.display().to_string(),
                "--cacert".to_owned(),
                ca.display().to_string(),
            ]
        });
        let ports = free_cluster_ports(NODES);
        let mut cluster = Self {
            nodes: ports
                .into_iter()
                .map(|port| Node {
                    port,
                    dir: tempfile::tempdir().expect("temp dir for a cluster node"),
                    child: None,
                })
                .collect(),
            users,
            killed: Vec::new(),
            tls,
            tls_args,
        };
        for i in 0..NODES {
            cluster.spawn(i);
        }
        let mut create = Command::new("redis-cli");
        create
            .args(&cluster.tls_args)
            .arg("--cluster")
            .arg("create");
        for n in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let mut child = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli must be on PATH");
        // It waits for the nodes to join: if they cannot (a bus that
        // refuses them), the test fails instead of hanging.
        let mut status = None;
        let created = crate::wait_until(Duration::from_secs(30), || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        if !created {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "redis-cli --cluster create failed or did not finish in 30 s ({status:?})"
        );
        cluster.wait_ok(Duration::from_secs(20));
        cluster.wait_in_sync(NODES / 2);
        cluster
    }

    /// Waits until `replicas` nodes are replicas whose link to their
    /// master is up (a replica syncs after `cluster_state:ok`, and until it
    /// has, `WAIT 1` on its master answers 0).
    fn wait_in_sync(&self, replicas: usize) {
        let ok = crate::wait_until(Duration::from_secs(30), || {
            let synced = self
                .live_ports()
                .iter()
                .filter(|p| {
                    self.cli(**p, &["INFO", "replication"]).is_some_and(|r| {
                        r.contains("role:slave") && r.contains("master_link_status:up")
                    })
                })
                .count();
            synced >= replicas
        });
        assert!(
            ok,
            "{replicas} replicas did not get in sync with their masters"
        );
    }

    fn spawn(&mut self, i: usize) {
        let node = &self.nodes[i];
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => {
                command.args(["--port", &node.port.to_string()]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &node.port.to_string()])
                    .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    // Nodes are each other's clients (bus, replication):
                    // they show the client certificate.
                    .arg("--tls-client-cert-file")
                    .arg(&tls.probe.0)
                    .arg("--tls-client-key-file")
                    .arg(&tls.probe.1)
                    .args(["--tls-auth-clients", tls.auth_clients]);
            }
        }
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "1000"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(node.dir.path())
            .args(["--logfile", "node.log"]);
        for user in &self.users {
            command.arg("--user").args(user.split_whitespace());
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH");
        let port = node.port;
        self.nodes[i].child = Some(child);
        let up = crate::wait_until(Duration::from_secs(10), || {
            self.cli(port, &["PING"])
                .is_some_and(|r| r.contains("PONG"))
        });
        assert!(up, "cluster node on port {port} did not answer PING");
    }

    /// The store URL: `redis+cluster://` with every master as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .live_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", seeds.join(","))
    }

    /// [`RedisCluster::url`] as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
    }

    /// The ports of the live masters that serve slots.
    pub fn masters(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .view()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The slot of `key` (its hash tag's, if it has one).
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        self.cli(port, &["CLUSTER", "KEYSLOT", key])
            .and_then(|r| r.trim().parse().ok())
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the master serving `slot`.
    pub fn master_of(&self, slot: u16) -> u16 {
        self.view()
            .into_iter()
            .find(|n| {
                n.master && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no live master serves slot {slot}"))
    }

    /// Kills (SIGKILL) the master serving `key`'s slot and gives its
    /// port.
    pub fn kill_master_of(&mut self, key: &str) -> u16 {
        let port = self.master_of(self.slot_of(key));
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.killed.push(port);
        port
    }

    /// Waits until every slot is served again by a live master (a replica
    /// of each killed master promoted: until the cluster marks it failed,
    /// after the node timeout, it still owns its slots) and every live node
    /// says `cluster_state:ok`.
    pub fn wait_for_failover(&mut self) {
        let killed = std::mem::take(&mut self.killed);
        let taken_over = crate::wait_until(Duration::from_secs(30), || {
            self.live_ports().iter().all(|p| {
                owners(&self.cli(*p, &["CLUSTER", "NODES"]).unwrap_or_default())
                    .iter()
                    .all(|(_, _, owner)| !killed.contains(owner))
            })
        });
        assert!(taken_over, "no replica took over the slots of {killed:?}");
        self.wait_ok(Duration::from_secs(30));
    }

    /// Starts a killed node again with its old configuration: it joins
    /// as a replica of the master that replaced it.
    pub fn restart(&mut self, port: u16) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster");
        assert!(self.nodes[i].child.is_none(), "node {port} still runs");
        self.spawn(i);
        self.wait_ok(Duration::from_secs(30));
        self.wait_in_sync(NODES / 2);
    }

    /// Moves `slot` with its keys to the master on port `to`, the way
    /// `redis-cli --cluster reshard` does: IMPORTING on the target,
    /// MIGRATING on the source, `MIGRATE` of its keys in batches, then
    /// `SETSLOT … NODE` on every master. Clients meanwhile get ASK and
    /// MOVED redirections.
    pub fn migrate_slot(&self, slot: u16, to: u16) {
        let view = self.view();
        let from = self.master_of(slot);
        if from == to {
            return;
        }
        let id = |port: u16| {
            view.iter()
                .find(|n| n.port == port)
                .map(|n| n.id.clone())
                .expect("node id")
        };
        let (from_id, to_id) = (id(from), id(to));
        let s = slot.to_string();
        self.must(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        self.must(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
        loop {
            let keys = self
                .cli(from, &["CLUSTER", "GETKEYSINSLOT", &s, "100"])
                .unwrap_or_default();
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            self.must(from, &args);
        }
        for port in [to, from] {
            self.must(port, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
        for m in self.masters() {
            if m != to && m != from {
                self.must(m, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
            }
        }
        self.wait_ok(Duration::from_secs(20));
    }

    /// Runs a command on the node on `port` (as the default user) and
    /// gives its raw reply.
    pub fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        cli_as(&self.tls_args, port, args)
    }

    fn must(&self, port: u16, args: &[&str]) {
        must(&self.tls_args, port, args);
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as a live node sees it.
    fn view(&self) -> Vec<NodeLine> {
        let port = self.live_ports()[0];
        let text = self
            .cli(port, &["CLUSTER", "NODES"])
            .expect("CLUSTER NODES");
        text.lines().filter_map(parse_node_line).collect()
    }

    fn wait_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let all_ok = self.live_ports().iter().all(|p| {
                self.cli(*p, &["CLUSTER", "INFO"])
                    .is_some_and(|r| r.contains("cluster_state:ok"))
            });
            // Every live node agrees on who serves each slot range.
            let agreed = all_ok && {
                let views: Vec<Vec<(u16, u16, u16)>> = self
                    .live_ports()
                    .iter()
                    .map(|p| owners(&self.cli(*p, &["CLUSTER", "NODES"]).unwrap_or_default()))
                    .collect();
                views.windows(2).all(|w| w[0] == w[1]) && views.first().is_some_and(|v| covered(v))
            };
            if agreed {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// `(first slot, last slot, master port)` of every live master, sorted.
fn owners(nodes: &str) -> Vec<(u16, u16, u16)> {
    let mut v: Vec<(u16, u16, u16)> = nodes
        .lines()
        .filter_map(parse_node_line)
        .filter(|n| n.master && !n.failed)
        .flat_map(|n| {
            n.slots
                .iter()
                .map(move |(a, b)| (*a, *b, n.port))
                .collect::<Vec<_>>()
        })
        .collect();
    v.sort_unstable();
    v
}

/// Whether sorted ranges cover every slot.
fn covered(ranges: &[(u16, u16, u16)]) -> bool {
    let mut next = 0u32;
    for (a, b, _) in ranges {
        if u32::from(*a) != next {
            return false;
        }
        next = u32::from(*b) + 1;
    }
    next == 16_384
}

/// `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`
fn parse_node_line(line: &str) -> Option<NodeLine> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.len() < 8 {
        return None;
    }
    let port = words[1]
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let flags = words[2];
    let slots = words[8..]
        .iter()
        // `[slot->-id]` entries are migrations in progress.
        .filter(|w| !w.starts_with('['))
        .filter_map(|w| match w.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => w.parse().ok().map(|s| (s, s)),
        })
        .collect();
    Some(NodeLine {
        id: words[0].to_owned(),
        port,
        master: flags.contains("master"),
        failed: flags.contains("fail") && !flags.contains("fail?"),
        slots,
    })
}

fn cli_as(tls: &[String], port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(tls)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn must(tls: &[String], port: u16, args: &[&str]) {
    let reply = cli_as(tls, port, args).unwrap_or_default();
    assert!(
        !reply.starts_with("ERR") && !reply.contains("(error)") && reply.trim() != "",
        "{args:?} on {port}: {reply:?}"
    );
}

/// `n` ports that are free and whose cluster bus port (+10000) is free
/// too, below the usual ephemeral range so that `free_port` users do not
/// take them meanwhile.
fn free_cluster_ports(n: usize) -> Vec<u16> {
    // A random start from std's hasher keys: no dependency needed.
    let mut seed = std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        std::process::id(),
    ) | 1;
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        // xorshift: no dependency for a random start.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = 12_000 + (seed % 10_000) as u16;
        let (Ok(a), Ok(b)) = (
            TcpListener::bind(("127.0.0.1", port)),
            TcpListener::bind(("127.0.0.1", port + 10_000)),
        ) else {
            continue;
        };
        held.push((a, b));
        ports.push(port);
    }
    ports
}
