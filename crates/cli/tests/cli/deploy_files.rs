//! The deployment files of `deploy/` against the real `charon` binary:
//! the Kubernetes manifests' server answers its probes as documented (on a
//! private Redis with the Secret's password), their limits pass `charon
//! config check` and their flags exist; the Dockerfile copies what exists
//! and sets only real flags; the systemd unit's environment names real
//! flags and keeps its state where the unit says; the Envoy example's
//! cluster reaches Charon's gRPC port and Envoy's descriptors are limited
//! after the configured count. (`systemd-analyze verify` runs in
//! scripts/check-deploy.)

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use charon_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_testkit::{RedisServer, RedisSetup, free_port, http_get};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every YAML document of a file.
fn yaml_docs(path: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    let mut docs = yaml_docs(path);
    assert_eq!(docs.len(), 1, "{path}: one document");
    docs.remove(0)
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {v}"))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{addr}: no port"))
}

/// The flags and environment variables `charon serve --help` lists.
struct ServeHelp {
    flags: BTreeSet<String>,
    env: BTreeSet<String>,
}

fn serve_help() -> ServeHelp {
    let out = crate::support::charon()
        .args(["serve", "--help"])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeSet::new();
    for word in text.split(|c: char| c.is_whitespace() || c == ',' || c == '`' || c == '(') {
        if let Some(name) = word.strip_prefix("--") {
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !name.is_empty() {
                flags.insert(format!("--{name}"));
            }
        }
    }
    let env = text
        .split("[env: ")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect();
    ServeHelp { flags, env }
}

impl ServeHelp {
    /// Every `--flag` of `args` (as `--flag` or `--flag=value`) is one of
    /// `charon serve`'s.
    fn check_args(&self, args: &[String], what: &str) {
        for arg in args.iter().filter(|a| a.starts_with("--")) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                self.flags.contains(flag),
                "{what}: {flag} is not a flag of charon serve ({:?})",
                self.flags
            );
        }
    }

    fn check_env(&self, name: &str, what: &str) {
        assert!(
            self.env.contains(name),
            "{what}: {name} is not an environment variable of charon serve ({:?})",
            self.env
        );
    }
}

/// `charon config check` on `text`: passes, or panics with its errors.
fn config_check(text: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, text).unwrap();
    let out = crate::support::charon()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: charon config check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `charon serve` started from a manifest's arguments and environment
/// (nothing inherited from the test's environment), killed on drop.
struct Server {
    child: Child,
    http_port: u16,
    grpc_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// `charon ARGS` with `--listen` / `--http-listen` set to free ports
    /// (`{grpc}` and `{http}` in `args` are replaced by them), in `cwd`;
    /// waits until `ready_path` answers 200.
    fn start(args: &[String], env: &BTreeMap<String, String>, cwd: &Path, ready: &str) -> Self {
        for _attempt in 0..4 {
            let (grpc_port, http_port) = (free_port(), free_port());
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("charon.log");
            let args: Vec<String> = args
                .iter()
                .map(|a| {
                    a.replace("{grpc}", &format!("127.0.0.1:{grpc_port}"))
                        .replace("{http}", &format!("127.0.0.1:{http_port}"))
                })
                .collect();
            let child = Command::new(crate::support::bin())
                .args(&args)
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .envs(env)
                .current_dir(cwd)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut server = Self {
                child,
                http_port,
                grpc_port,
                log,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if server.get(ready).is_some_and(|(code, _)| code == 200) {
                    return server;
                }
                if server.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let log = server.log();
            assert!(
                log.contains("cannot listen on"),
                "charon {args:?} did not become ready:\n{log}"
            );
        }
        panic!("no free ports for charon serve");
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http_port, path)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `path` until it answers `code`, at most `limit`.
    fn wait_for(&self, path: &str, code: u16, limit: Duration) -> (u16, String) {
        let deadline = Instant::now() + limit;
        loop {
            let answer = self.get(path).unwrap_or((0, String::new()));
            if answer.0 == code || Instant::now() > deadline {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Kubernetes manifests of deploy/k8s (as kustomization.yaml lists
/// them), by kind and name.
fn k8s() -> BTreeMap<(String, String), Value> {
    let kustomization = yaml("deploy/k8s/kustomization.yaml");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| str_of(r, "resource").to_owned())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(repo().join("deploy/k8s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "kustomization.yaml lists every manifest");
    let mut objects = BTreeMap::new();
    for file in listed {
        for doc in yaml_docs(&format!("deploy/k8s/{file}")) {
            let kind = str_of(&doc["kind"], "kind").to_owned();
            let name = str_of(&doc["metadata"]["name"], "metadata.name").to_owned();
            assert!(
                objects.insert((kind.clone(), name.clone()), doc).is_none(),
                "{kind}/{name} twice"
            );
        }
    }
    objects
}

fn object<'a>(objects: &'a BTreeMap<(String, String), Value>, kind: &str, name: &str) -> &'a Value {
    objects
        .get(&(kind.to_owned(), name.to_owned()))
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy/k8s"))
}

/// The container port named `name`.
fn container_port(container: &Value, name: &str) -> u16 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

/// The value of `--flag=value` or `--flag value` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
            Some(v.to_owned())
        } else if a == flag {
            args.get(i + 1).cloned()
        } else {
            None
        }
    })
}

/// `args` with the value of `flag` replaced.
fn with_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            out.push(value.to_owned());
        } else if a.starts_with(&format!("{flag}=")) {
            out.push(format!("{flag}={value}"));
        } else {
            skip = a == flag;
            out.push(a.clone());
        }
    }
    out
}

#[test]
fn k8s_manifests_hold_their_promises_on_a_real_server() {
    let objects = k8s();
    let help = serve_help();
    let deployment = object(&objects, "Deployment", "charon");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["automountServiceAccountToken"], false);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for what in ["requests", "limits"] {
        assert!(
            c["resources"][what]["memory"].is_string(),
            "resources.{what}"
        );
    }
    assert!(c["resources"]["requests"]["cpu"].is_string());

    // The Service and the disruption budget select these pods, by the
    // container's port names.
    let service = object(&objects, "Service", "charon");
    assert_eq!(&service["spec"]["selector"], labels);
    let grpc = container_port(c, "grpc");
    let http = container_port(c, "http");
    assert_eq!((grpc, http), (7070, 7071));
    for p in service["spec"]["ports"].as_array().unwrap() {
        let target = str_of(&p["targetPort"], "targetPort");
        assert_eq!(
            p["port"].as_u64(),
            Some(u64::from(container_port(c, target)))
        );
    }
    let pdb = object(&objects, "PodDisruptionBudget", "charon");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    assert!(pdb["spec"]["minAvailable"].as_u64() < deployment["spec"]["replicas"].as_u64());

    // The arguments: real flags, listening on the container's ports.
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| str_of(a, "args").to_owned())
        .collect();
    assert_eq!(args[0], "serve");
    help.check_args(&args, "deploy/k8s/deployment.yaml");
    assert_eq!(port_of(&flag_value(&args, "--listen").unwrap()), grpc);
    assert_eq!(port_of(&flag_value(&args, "--http-listen").unwrap()), http);

    // The limits: the ConfigMap mounted where --config reads, and valid.
    let config_path = flag_value(&args, "--config").unwrap();
    let (mount_dir, key) = config_path.rsplit_once('/').unwrap();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == mount_dir)
        .unwrap_or_else(|| panic!("nothing mounted at {mount_dir}"));
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount never sees ConfigMap updates"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = object(
        &objects,
        "ConfigMap",
        str_of(&volume["configMap"]["name"], "configMap.name"),
    );
    let limits = str_of(&config_map["data"][key], "the limits");
    config_check(limits, "the ConfigMap");

    // The environment: real variables; the store URL from the Secret names
    // the Redis Service with the password Redis is started with.
    let mut env = BTreeMap::new();
    let mut redis_password = None;
    for e in c["env"].as_array().unwrap() {
        let name = str_of(&e["name"], "env.name").to_owned();
        if name != "RUST_LOG" {
            help.check_env(&name, "deploy/k8s/deployment.yaml");
        }
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            let key_ref = &e["valueFrom"]["secretKeyRef"];
            let secret = object(&objects, "Secret", str_of(&key_ref["name"], "secret name"));
            let data = &secret["stringData"];
            redis_password = data["password"].as_str().map(str::to_owned);
            str_of(&data[str_of(&key_ref["key"], "secret key")], "secret value").to_owned()
        };
        env.insert(name, value);
    }
    let store = env.get("CHARON_STORE").expect("CHARON_STORE").clone();
    let redis_service = object(&objects, "Service", "charon-redis");
    let redis_port = redis_service["spec"]["ports"][0]["port"].as_u64().unwrap();
    let password = redis_password.expect("the Secret's password");
    assert_eq!(
        store,
        format!("redis://:{password}@charon-redis:{redis_port}")
    );
    let redis = RedisServer::start_with(RedisSetup {
        requirepass: Some(password.clone()),
        ..RedisSetup::default()
    });
    env.insert("CHARON_STORE".to_owned(), redis.url_as("", &password));

    // A real server on those arguments, the ConfigMap's file and Redis.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(key), limits).unwrap();
    let args = with_flag(
        &args,
        "--config",
        &dir.path().join(key).display().to_string(),
    );
    let args = with_flag(&args, "--listen", "{grpc}");
    let args = with_flag(&args, "--http-listen", "{http}");
    let probe_path = |probe: &str| {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["port"], "http", "{probe} on the HTTP port");
        str_of(&get["path"], "probe path").to_owned()
    };
    let (liveness, readiness) = (probe_path("livenessProbe"), probe_path("readinessProbe"));
    assert_eq!(
        (liveness.as_str(), readiness.as_str()),
        ("/healthz", "/readyz")
    );
    let server = Server::start(&args, &env, dir.path(), &readiness);
    assert_eq!(server.get(&liveness), Some((200, "ok\n".to_owned())));
    let (code, body) = server.get(&readiness).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("redis"), "{body}");
    assert!(!body.contains(&password), "{body}");

    // Not ready while Redis does not answer, alive all the same; ready
    // again once it does.
    redis.stop();
    let (code, body) = server.wait_for(&readiness, 503, Duration::from_secs(15));
    assert_eq!(code, 503, "{body}\n{}", server.log());
    assert_eq!(server.get(&liveness).map(|a| a.0), Some(200));
    redis.resume();
    let (code, body) = server.wait_for(&readiness, 200, Duration::from_secs(15));
    assert_eq!(code, 200, "{body}\n{}", server.log());
    assert!(
        !server.log().contains(&password),
        "the password is never logged"
    );
}

/// The Dockerfile's instructions, continuation lines joined.
fn dockerfile() -> Vec<(String, String)> {
    let text = read("deploy/docker/Dockerfile");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (op, rest) = current
            .trim()
            .split_once(' ')
            .unwrap_or((current.trim(), ""));
        out.push((op.to_ascii_uppercase(), rest.trim().to_owned()));
        current.clear();
    }
    out
}

/// Whether one path segment matches a pattern segment (`*` stands for
/// any run of characters).
fn segment_matches(pattern: &str, segment: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == segment,
        Some((head, rest)) => {
            let Some(tail) = segment.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && segment_matches(rest, &tail[i..]))
        }
    }
}

/// Whether a `.dockerignore` pattern (segments with `*`, `**` for any
/// number of segments) matches `path` exactly.
fn glob_matches(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => {
            glob_matches(&pattern[1..], path)
                || (!path.is_empty() && glob_matches(pattern, &path[1..]))
        }
        (Some(p), Some(s)) => segment_matches(p, s) && glob_matches(&pattern[1..], &path[1..]),
        _ => false,
    }
}

/// Whether `.dockerignore` keeps `path` (relative to the repository) out
/// of the build context: the last pattern that matches the path or one of
/// its parent directories wins; `!` re-includes.
fn docker_ignored(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let mut ignored = false;
    for line in read(".dockerignore").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keep, pattern) = match line.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, line),
        };
        let pattern: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        if (1..=segments.len()).any(|n| glob_matches(&pattern, &segments[..n])) {
            ignored = !keep;
        }
    }
    ignored
}

#[test]
fn dockerfile_copies_what_exists_and_sets_real_flags() {
    let help = serve_help();
    let instructions = dockerfile();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| op == "FROM")
        .map(|(i, _)| i)
        .collect();
    assert!(stages.len() >= 2, "multi-stage");
    let runtime = &instructions[*stages.last().unwrap()..];

    // What the build stage copies from the context exists and is not kept
    // out of it by .dockerignore.
    for (op, rest) in &instructions[..*stages.last().unwrap()] {
        if op != "COPY" || rest.starts_with("--from") {
            continue;
        }
        let mut parts: Vec<&str> = rest
            .split_whitespace()
            .filter(|p| !p.starts_with("--"))
            .collect();
        parts.pop(); // the destination
        for source in parts {
            assert!(repo().join(source).exists(), "COPY {source}: no such path");
            assert!(
                !docker_ignored(source),
                "COPY {source}: excluded by .dockerignore"
            );
        }
    }
    for excluded in [
        "target",
        ".git",
        "clients/python",
        "crates/cli/target",
        "crates/simulator-web/e2e/node_modules/x",
    ] {
        assert!(
            docker_ignored(excluded),
            "{excluded} should stay out of the context"
        );
    }
    assert!(!docker_ignored("crates/cli/src/main.rs"));
    let build = instructions
        .iter()
        .find(|(op, rest)| op == "RUN" && rest.contains("cargo build"))
        .map(|(_, rest)| rest.clone())
        .expect("a cargo build");
    assert!(
        build.contains("--locked") && build.contains("-p charon"),
        "{build}"
    );
    assert!(build.contains("type=cache"), "cache mounts: {build}");

    // The runtime stage: a non-root user, the ports, real variables.
    let user = runtime
        .iter()
        .rev()
        .find(|(op, _)| op == "USER")
        .map(|(_, u)| u.clone())
        .expect("USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "USER {user}");
    let exposed: BTreeSet<u16> = runtime
        .iter()
        .filter(|(op, _)| op == "EXPOSE")
        .flat_map(|(_, ports)| ports.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    assert_eq!(exposed, BTreeSet::from([7070, 7071]));
    let mut env = BTreeMap::new();
    for (_, rest) in runtime.iter().filter(|(op, _)| op == "ENV") {
        for pair in rest.split_whitespace() {
            let (name, value) = pair.split_once('=').unwrap();
            env.insert(name.to_owned(), value.to_owned());
        }
    }
    for name in env.keys().filter(|n| n.starts_with("CHARON_")) {
        help.check_env(name, "deploy/docker/Dockerfile");
    }
    assert_eq!(port_of(&env["CHARON_LISTEN"]), 7070);
    assert_eq!(port_of(&env["CHARON_HTTP_LISTEN"]), 7071);
    // The database lives in the volume (the root file system is read-only).
    let volume = runtime
        .iter()
        .find(|(op, _)| op == "VOLUME")
        .map(|(_, v)| v.clone())
        .expect("VOLUME");
    let state: Vec<String> = serde_json::from_str(&volume).unwrap();
    assert!(
        state
            .iter()
            .any(|dir| env["CHARON_DB"].starts_with(&format!("{dir}/"))),
        "CHARON_DB {} outside the volume {state:?}",
        env["CHARON_DB"]
    );
    let json_arg = |op: &str| -> Vec<String> {
        let (_, v) = runtime.iter().find(|(o, _)| o == op).unwrap();
        serde_json::from_str(v).unwrap()
    };
    assert_eq!(json_arg("ENTRYPOINT"), ["/usr/local/bin/charon"]);
    let cmd = json_arg("CMD");
    assert_eq!(cmd[0], "serve");
    help.check_args(&cmd, "the Dockerfile's CMD");

    // The image's environment and command start a server that keeps its
    // state in the volume's directory.
    let state_dir = tempfile::tempdir().unwrap();
    let db = state_dir.path().join("charon.db");
    env.insert("CHARON_DB".to_owned(), db.display().to_string());
    // Free loopback ports instead of the image's 0.0.0.0:7070/7071 (the
    // flags win over the variables).
    let mut args = cmd.clone();
    args.extend([
        "--listen={grpc}".to_owned(),
        "--http-listen={http}".to_owned(),
    ]);
    let server = Server::start(&args, &env, state_dir.path(), "/readyz");
    assert_eq!(server.get("/healthz").map(|a| a.0), Some(200));
    assert!(db.exists() && state_dir.path().join("charon.db.token").exists());
}

/// `KEY=VALUE` lines of an environment file (comments and blanks skipped).
fn env_file(path: &str) -> BTreeMap<String, String> {
    read(path)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{path}: {l}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn systemd_unit_keeps_state_in_its_state_directory_with_real_flags() {
    let help = serve_help();
    let unit = read("deploy/systemd/charon.service");
    let settings: Vec<(&str, &str)> = unit
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect();
    let get = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .collect()
    };
    assert_eq!(get("DynamicUser"), ["yes"]);
    assert_eq!(get("ProtectSystem"), ["strict"]);
    let state = format!("/var/lib/{}", get("StateDirectory")[0]);
    assert_eq!(get("WorkingDirectory"), [state.as_str()]);
    assert_eq!(get("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    let exec = get("ExecStart")[0];
    assert_eq!(exec, "/usr/local/bin/charon serve $CHARON_ARGS");

    // The unit's own environment, then the sample environment file (which
    // wins, as systemd applies EnvironmentFile= after Environment=).
    let mut env: BTreeMap<String, String> = get("Environment")
        .iter()
        .map(|e| {
            let (k, v) = e.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert!(
        env["CHARON_DB"].starts_with(&format!("{state}/")),
        "the database in the state directory"
    );
    assert_eq!(get("EnvironmentFile"), ["-/etc/charon/charon.env"]);
    env.extend(env_file("deploy/systemd/charon.env"));
    let extra: Vec<String> = env["CHARON_ARGS"]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    help.check_args(&extra, "CHARON_ARGS");
    for name in env
        .keys()
        .filter(|n| n.starts_with("CHARON_") && *n != "CHARON_ARGS")
    {
        help.check_env(name, "deploy/systemd");
    }
    // Commented-out examples in the file name real variables too.
    for line in read("deploy/systemd/charon.env").lines() {
        if let Some((name, value)) = line.trim_start_matches('#').split_once('=')
            && name.starts_with("CHARON_")
        {
            if name == "CHARON_ARGS" {
                let args: Vec<String> = value.split_whitespace().map(str::to_owned).collect();
                help.check_args(&args, "CHARON_ARGS");
            } else {
                help.check_env(name, "deploy/systemd/charon.env");
            }
        }
    }

    // As systemd would run it: in the state directory, on the unit's
    // environment; the database and the write token land there.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("charon.db");
    env.insert("CHARON_DB".to_owned(), db.display().to_string());
    env.remove("CHARON_LISTEN");
    env.remove("CHARON_HTTP_LISTEN");
    let mut args = vec!["serve".to_owned()];
    args.extend(extra);
    args.extend([
        "--listen={grpc}".to_owned(),
        "--http-listen={http}".to_owned(),
    ]);
    let server = Server::start(&args, &env, dir.path(), "/readyz");
    assert_eq!(server.get("/healthz").map(|a| a.0), Some(200));
    let token = std::fs::read_to_string(dir.path().join("charon.db.token")).unwrap();
    assert_eq!(token.trim().len(), 32, "{token}");
    assert!(db.exists());
}

/// The descriptors Envoy sends for one request with `x-tenant: acme` from
/// 203.0.113.7, made from the route's rate-limit actions.
fn envoy_descriptors(actions: &[Value]) -> Vec<(String, String)> {
    actions
        .iter()
        .map(|a| {
            if let Some(g) = a.get("generic_key") {
                let key = g["descriptor_key"].as_str().unwrap_or("generic_key");
                (
                    key.to_owned(),
                    str_of(&g["descriptor_value"], "descriptor_value").to_owned(),
                )
            } else if let Some(h) = a.get("request_headers") {
                assert_eq!(h["header_name"], "x-tenant", "the README's header");
                (
                    str_of(&h["descriptor_key"], "descriptor_key").to_owned(),
                    "acme".to_owned(),
                )
            } else if a.get("remote_address").is_some() {
                ("remote_address".to_owned(), "203.0.113.7".to_owned())
            } else {
                panic!("an action this test does not know: {a}")
            }
        })
        .collect()
}

/// How many requests `descriptor` allows in Charon's configuration
/// (SPEC §11 matching: a valued node beats a value-less one, the deepest
/// node with an action applies), or `None` when it is not limited.
fn allowed(config: &Value, domain: &str, descriptor: &[(String, String)]) -> Option<u64> {
    let domains = config["envoy"]["domains"].as_array().unwrap();
    let mut nodes = domains
        .iter()
        .find(|d| d["domain"] == domain)
        .unwrap_or_else(|| panic!("Envoy domain {domain} is not configured"))["descriptors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut limit = None;
    for (key, value) in descriptor {
        let node = nodes
            .iter()
            .find(|n| n["key"] == key.as_str() && n["value"] == value.as_str())
            .or_else(|| {
                nodes
                    .iter()
                    .find(|n| n["key"] == key.as_str() && n["value"].is_null())
            });
        let Some(node) = node.cloned() else { break };
        if let Some(n) = node["rate_limit"]["requests_per_unit"].as_u64() {
            limit = Some(n);
        } else if let Some(resource) = node["resource"].as_str() {
            let r = config["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == resource)
                .unwrap();
            assert_eq!(r["kind"], "rate", "{resource}: this test counts rate tiers");
            limit = r["tiers"][0]["limit"].as_u64();
        }
        nodes = node["descriptors"].as_array().cloned().unwrap_or_default();
    }
    limit
}

#[test]
fn envoy_example_reaches_charon_and_is_limited_after_the_configured_count() {
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let compose = yaml("deploy/envoy/docker-compose.yml");
    let charon_config_text = read("deploy/envoy/charon.yaml");
    let charon_config: Value = serde_saphyr::from_str(&charon_config_text).unwrap();
    config_check(&charon_config_text, "deploy/envoy/charon.yaml");

    // The HTTP connection manager, its rate-limit filter and routes.
    let listener = &envoy["static_resources"]["listeners"][0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    assert!(str_of(&hcm["@type"], "@type").ends_with("v3.HttpConnectionManager"));
    let filters = hcm["http_filters"].as_array().unwrap();
    let ratelimit = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the ratelimit filter")["typed_config"]
        .clone();
    assert_eq!(filters.last().unwrap()["name"], "envoy.filters.http.router");
    let domain = str_of(&ratelimit["domain"], "domain");
    let service = &ratelimit["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3");
    let cluster_name = str_of(
        &service["grpc_service"]["envoy_grpc"]["cluster_name"],
        "cluster",
    );
    let clusters = envoy["static_resources"]["clusters"].as_array().unwrap();
    let cluster_address = |name: &str| -> (String, u16, Value) {
        let cluster = clusters
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no cluster {name}"));
        let socket = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"];
        let port = u16::try_from(socket["port_value"].as_u64().unwrap()).unwrap();
        (
            str_of(&socket["address"], "address").to_owned(),
            port,
            cluster.clone(),
        )
    };
    let (host, port, cluster) = cluster_address(cluster_name);
    assert!(
        cluster["typed_extension_protocol_options"]
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
            .get("http2_protocol_options")
            .is_some(),
        "gRPC needs HTTP/2 to {cluster_name}"
    );

    // The compose file runs Charon as that host, on that gRPC port, with
    // charon.yaml; and Envoy with envoy.yaml, the upstream where Envoy
    // sends requests.
    let services = &compose["services"];
    let charon = &services[&host];
    assert!(charon.is_object(), "compose has no service {host}");
    assert_eq!(
        port_of(str_of(
            &charon["environment"]["CHARON_LISTEN"],
            "CHARON_LISTEN"
        )),
        port
    );
    let command: Vec<String> = charon["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| str_of(a, "command").to_owned())
        .collect();
    let help = serve_help();
    help.check_args(&command, "docker-compose.yml");
    for name in charon["environment"].as_object().unwrap().keys() {
        help.check_env(name, "docker-compose.yml");
    }
    let mounted = |service: &Value, file: &str| -> String {
        service["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .find_map(|v| {
                let mut parts = v.split(':');
                (parts.next() == Some(&format!("./{file}")))
                    .then(|| parts.next().unwrap().to_owned())
            })
            .unwrap_or_else(|| panic!("{file} is not mounted"))
    };
    assert_eq!(
        flag_value(&command, "--config"),
        Some(mounted(charon, "charon.yaml"))
    );
    let envoy_service = &services["envoy"];
    let envoy_command = envoy_service["command"].as_array().unwrap();
    let c_at = envoy_command.iter().position(|a| a == "-c").unwrap();
    assert_eq!(
        envoy_command[c_at + 1],
        mounted(envoy_service, "envoy.yaml").as_str()
    );
    let (up_host, up_port, _) = cluster_address("upstream");
    let upstream = &services[&up_host];
    assert!(
        upstream["command"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str() == Some(&format!("-listen=:{up_port}"))),
        "the upstream listens on {up_port}"
    );

    // Envoy's descriptors, as its actions make them.
    let rate_limits = hcm["route_config"]["virtual_hosts"][0]["rate_limits"]
        .as_array()
        .unwrap();
    let descriptors: Vec<Vec<(String, String)>> = rate_limits
        .iter()
        .map(|r| envoy_descriptors(r["actions"].as_array().unwrap()))
        .collect();
    let limits: Vec<Option<u64>> = descriptors
        .iter()
        .map(|d| allowed(&charon_config, domain, d))
        .collect();
    assert!(
        limits.iter().all(Option::is_some),
        "every descriptor is limited: {limits:?}"
    );
    let n = limits.iter().flatten().copied().min().unwrap();
    let over = limits.iter().position(|l| *l == Some(n)).unwrap();

    // The real server on charon.yaml: n calls pass, the next is over the
    // limit on the descriptor with the lowest limit.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("charon.yaml"), &charon_config_text).unwrap();
    let args: Vec<String> = with_flag(
        &command,
        "--config",
        &dir.path().join("charon.yaml").display().to_string(),
    )
    .into_iter()
    .chain([
        "--listen={grpc}".to_owned(),
        "--http-listen={http}".to_owned(),
    ])
    .collect();
    let server = Server::start(&args, &BTreeMap::new(), dir.path(), "/readyz");
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", server.grpc_port))
                .await
                .unwrap();
        for i in 1..=n {
            let r = client
                .should_rate_limit(request.clone())
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32, "call {i} of {n}: {r:?}");
        }
        let r = client
            .should_rate_limit(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.overall_code,
            Code::OverLimit as i32,
            "call {}: {r:?}",
            n + 1
        );
        assert_eq!(r.statuses[over].code, Code::OverLimit as i32, "{r:?}");
        // charon.yaml asks for RateLimit-* headers.
        assert!(
            r.response_headers_to_add
                .iter()
                .any(|h| h.key.eq_ignore_ascii_case("ratelimit-limit")),
            "{r:?}"
        );
    });
}
