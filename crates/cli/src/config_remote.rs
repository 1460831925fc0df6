//! `charon config apply`, `export`, `log` and `rollback`: the whole
//! configuration of a configuration service, from and to a SPEC §6 file.
//!
//! `apply` asks the service for the difference first (a dry run), shows it,
//! and applies it with `If-Match` set to the version the difference was
//! computed against, so what is applied is exactly what was shown: if
//! someone changed the configuration in between, nothing is applied.
//!
//! `log` prints the service's audit trail; `rollback --to V` takes the
//! configuration commit V left from it and goes the way of `apply`.
//!
//! Before a difference is shown for `apply` or `rollback`, the token is
//! checked with a write the service cannot apply (an `If-Match` no version
//! has: 401 or 403 if the token may not write, 412 if it may), so a
//! refused token is said before, not after, a screenful of diff. Errors
//! say what is wrong: a server without the configuration API (a limiting
//! server fed by a file or another service: 404), a refused token and
//! where it came from (`charon.db.token`), an unreachable service. Exit
//! status: 1 for a client error, 3 when the service cannot be reached or
//! answers 5xx (see `crate::exit`).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use charon_config_client::{ConfigClient, ConfigClientError};
use charon_config_service::wire::{DiffEntry, ImportOutcome};
use clap::Args;
use serde_json::Value;

use crate::tls_args::TlsArgs;

/// How a change is confirmed: `apply` and `rollback` show the difference,
/// then ask, unless told not to ask or not to apply.
#[derive(Args, Debug, Clone, Copy)]
pub struct ConfirmArgs {
    /// Apply without asking.
    #[arg(long)]
    yes: bool,
    /// Only show the difference.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
}

/// Where the configuration service is.
#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Base URL of the configuration service.
    #[arg(
        long,
        env = "CHARON_CONFIG_URL",
        default_value = "http://127.0.0.1:7071",
        value_name = "URL"
    )]
    url: String,
    /// Bearer token (a write token for `apply` and `rollback`). Prefer the environment
    /// variable: command lines are visible to other users. Without one,
    /// the token `charon serve` made for its embedded service is used if
    /// `charon.db.token` is in the current directory.
    #[arg(
        long,
        env = "CHARON_CONFIG_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// Where the token sent came from, for the hint when it is refused.
#[derive(Debug)]
enum TokenSource {
    /// `--token` or `CHARON_CONFIG_TOKEN`.
    Given,
    /// The embedded service's token file in the current directory.
    File(std::path::PathBuf),
    /// None: no flag, and no file where one was looked for.
    Nothing(std::path::PathBuf),
}

impl TokenSource {
    /// What to say when the service refused the token (or its absence).
    fn hint(&self) -> String {
        const WHERE: &str = "`charon serve` with its embedded configuration service writes its \
                             write token to <db>.token beside its database: charon.db.token in \
                             the directory it runs in, unless --db or --config-token say otherwise";
        match self {
            TokenSource::Given => {
                "the token given with --token or CHARON_CONFIG_TOKEN was \
                                   refused: is it a write token of this service? "
                    .to_owned()
                    + WHERE
            }
            TokenSource::File(path) => format!(
                "the token read from {} was refused: it is the token of the embedded service of \
                 a `charon serve` started in that directory, not of this one; pass this \
                 service's write token with --token or CHARON_CONFIG_TOKEN. {WHERE}",
                path.display()
            ),
            TokenSource::Nothing(path) => format!(
                "no token was given (--token or CHARON_CONFIG_TOKEN) and {} does not exist. \
                 {WHERE}; pass it with --token \"$(cat DIR/charon.db.token)\"",
                path.display()
            ),
        }
    }
}

/// A client of the service and where its token came from.
struct Remote {
    client: ConfigClient,
    token: TokenSource,
}

impl RemoteArgs {
    fn client(&self) -> anyhow::Result<Remote> {
        let file = std::env::current_dir()
            .unwrap_or_default()
            .join(charon_server::token_file("charon.db"));
        let (token, source) = match &self.token {
            Some(t) => (Some(t.clone()), TokenSource::Given),
            None => match std::fs::read_to_string(&file) {
                Ok(t) => (Some(t.trim().to_owned()), TokenSource::File(file)),
                Err(_) => (None, TokenSource::Nothing(file)),
            },
        };
        Ok(Remote {
            client: ConfigClient::with_tls(
                &self.tls.url(&self.url),
                token,
                Duration::from_secs(30),
                &self.tls.config()?,
            )?,
            token: source,
        })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Explains an error answer of the service at `remote` (`file` prefixes
/// the problems of a document) on stderr; the exit status it deserves.
fn report(e: &ConfigClientError, file: Option<&Path>, remote: &Remote) -> ExitCode {
    let url = remote.client.base_url();
    match e {
        // Not the API's JSON: no configuration API at this address.
        ConfigClientError::Api { status: 404, body } if body.error == "http" => {
            eprintln!(
                "charon: {url} has no configuration API (HTTP 404): a limiting server started \
                 with --config FILE takes its limits from that file (edit the file: it is \
                 re-read when it changes and on SIGHUP), and one started with --config-url \
                 follows the configuration service at that URL. Point --url (CHARON_CONFIG_URL) \
                 at a configuration service: the HTTP port of a `charon serve` started without \
                 --config and --config-url, or of `charon serve --config-api-only`."
            );
        }
        ConfigClientError::Api { status, body } => {
            if body.problems.is_empty() {
                eprintln!("charon: {url} answered {status}: {}", body.message);
            }
            for p in &body.problems {
                let at = file
                    .map(|f| format!("{}: ", f.display()))
                    .unwrap_or_default();
                if p.path.is_empty() {
                    eprintln!("{at}{}", p.message);
                } else {
                    eprintln!("{at}{}: {}", p.path, p.message);
                }
            }
            if *status == 401 || *status == 403 {
                eprintln!("charon: {}", remote.token.hint());
            }
            if *status >= 500 {
                return ExitCode::from(crate::exit::SERVER_UNAVAILABLE);
            }
        }
        ConfigClientError::Unreachable { message, .. } if closed_without_answer(message) => {
            eprintln!(
                "charon: {url} closed the connection without an HTTP answer ({message}): is it \
                 the gRPC port? The configuration API is on the HTTP port (7071 unless \
                 --http-listen says otherwise)."
            );
        }
        ConfigClientError::Unreachable { .. } => {
            eprintln!("charon: {e}");
            return ExitCode::from(crate::exit::SERVER_UNAVAILABLE);
        }
        other => eprintln!("charon: {other}"),
    }
    ExitCode::from(crate::exit::CLIENT_ERROR)
}

/// Whether an HTTP client's failure is a server that took the connection
/// and closed it without a word on seeing HTTP/1: a gRPC port (HTTP/2
/// only) given as the configuration API.
fn closed_without_answer(message: &str) -> bool {
    message.contains("connection closed before message completed")
        || message.contains("received unexpected message from connection")
        || message.contains("invalid HTTP version")
        || message.contains("connection reset")
}

/// Checks, before anything is shown, that the token may write: a write the
/// service cannot apply (an `If-Match` no version has) is refused 401 or
/// 403 if it may not, 412 if it may; nothing is ever written. `None`: go
/// on; else the exit status (the error was explained).
fn check_write_token(
    rt: &tokio::runtime::Runtime,
    remote: &Remote,
    yaml: &str,
    file: &Path,
) -> Option<ExitCode> {
    match rt.block_on(remote.client.import_yaml(yaml, false, Some(u64::MAX))) {
        Err(ConfigClientError::Api { status: 412, .. }) => None,
        // Never: no version is u64::MAX. Had it been, it was applied.
        Ok(_) => None,
        Err(e) => Some(report(&e, Some(file), remote)),
    }
}

/// `charon config apply FILE`.
pub fn apply(file: &Path, remote: &RemoteArgs, confirm: ConfirmArgs) -> anyhow::Result<ExitCode> {
    let yaml =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let remote = remote.client()?;
    let rt = runtime()?;
    replace(&rt, &remote, &yaml, &file.display().to_string(), confirm)
}

/// Replaces the service's configuration with `yaml` (named `label` in
/// messages): the difference first (a dry run), then, confirmed, the
/// import with `If-Match` set to the version the difference was computed
/// against. `apply` and `rollback` both go this way.
fn replace(
    rt: &tokio::runtime::Runtime,
    remote: &Remote,
    yaml: &str,
    label: &str,
    confirm: ConfirmArgs,
) -> anyhow::Result<ExitCode> {
    let file = Path::new(label);
    let client = &remote.client;
    // A dry run only reads: its difference needs no write token.
    if !confirm.dry_run
        && let Some(code) = check_write_token(rt, remote, yaml, file)
    {
        return Ok(code);
    }
    let preview = match rt.block_on(client.import_yaml(yaml, true, None)) {
        Ok(p) => p,
        Err(e) => return Ok(report(&e, Some(file), remote)),
    };
    for a in &preview.adjustments {
        eprintln!("{label}: normalized: {}: {}", a.path, a.change);
    }
    if !preview.changed {
        eprintln!(
            "No changes: the service already has this configuration (version {}).",
            preview.base_version
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    write_diff(&mut out, &preview)?;
    out.flush()?;
    drop(out);
    if confirm.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    if !confirm.yes && !ask()? {
        eprintln!("Nothing was applied.");
        return Ok(ExitCode::from(crate::exit::CLIENT_ERROR));
    }
    match rt.block_on(client.import_yaml(yaml, false, Some(preview.base_version))) {
        Ok(done) => {
            eprintln!(
                "Applied as one commit: the configuration is now at version {}.",
                done.version
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(ConfigClientError::Api { status: 412, body }) => {
            eprintln!(
                "charon: the configuration changed on the service after the difference above was \
                 computed (it is now at version {}); nothing was applied. Run the command again \
                 to see the new difference.",
                body.current_version.unwrap_or_default()
            );
            Ok(ExitCode::from(crate::exit::CLIENT_ERROR))
        }
        Err(e) => Ok(report(&e, Some(file), remote)),
    }
}

/// `charon config log [--limit N]`: the audit trail, newest first: each
/// commit's version, time, token name and diff.
pub fn log(remote: &RemoteArgs, limit: u64) -> anyhow::Result<ExitCode> {
    let remote = remote.client()?;
    let page = match runtime()?.block_on(remote.client.audit(limit, None)) {
        Ok(page) => page,
        Err(e) => return Ok(report(&e, None, &remote)),
    };
    let mut out = std::io::stdout().lock();
    if page.entries.is_empty() {
        writeln!(out, "No commits in the audit trail.")?;
    }
    for e in &page.entries {
        writeln!(out, "version {}  {}  token {}", e.version, e.time, e.token)?;
        for line in e.change.lines() {
            writeln!(out, "    {line}")?;
        }
        writeln!(out)?;
    }
    if let Some(before) = page.next_before {
        writeln!(
            out,
            "(older commits: before version {before}; raise --limit to see them)"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `charon config rollback --to VERSION`: restores the configuration that
/// commit VERSION left, as a new commit (through the whole-configuration
/// import, so limiting servers follow it through their feed), showing the
/// difference first as `apply` does.
pub fn rollback(
    remote: &RemoteArgs,
    version: u64,
    confirm: ConfirmArgs,
) -> anyhow::Result<ExitCode> {
    let remote = remote.client()?;
    let rt = runtime()?;
    let entry = match rt.block_on(remote.client.audit_entry(version)) {
        Ok(entry) => entry,
        Err(ConfigClientError::Api { status: 404, body }) if body.error != "http" => {
            eprintln!(
                "charon: version {version} is not in the audit trail (never committed, \
                 committed before the service kept one, or older than the versions it keeps); \
                 see `charon config log`"
            );
            return Ok(ExitCode::from(crate::exit::CLIENT_ERROR));
        }
        Err(e) => return Ok(report(&e, None, &remote)),
    };
    let Some(yaml) = entry.config else {
        eprintln!("charon: the service sent version {version} without its configuration");
        return Ok(ExitCode::from(crate::exit::SERVER_UNAVAILABLE));
    };
    eprintln!(
        "Rolling back to version {version} (committed {} by token {}).",
        entry.time, entry.token
    );
    replace(&rt, &remote, &yaml, &format!("version {version}"), confirm)
}

fn ask() -> anyhow::Result<bool> {
    eprint!("Apply these changes as one commit? [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// `charon config export`.
pub fn export(remote: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = remote.client()?;
    match runtime()?.block_on(remote.client.export_yaml()) {
        Ok(yaml) => {
            print!("{yaml}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(report(&e, None, &remote)),
    }
}

fn yaml_lines(v: Option<&Value>) -> Vec<String> {
    match v {
        None => Vec::new(),
        Some(v) => serde_saphyr::to_string(v)
            .unwrap_or_else(|e| format!("# cannot render: {e}\n"))
            .lines()
            .map(str::to_owned)
            .collect(),
    }
}

/// The difference, entry by entry, each as a line diff of its YAML.
fn write_diff(out: &mut impl Write, outcome: &ImportOutcome) -> std::io::Result<()> {
    let count = |op: &str| outcome.diff.iter().filter(|e| e.op == op).count();
    writeln!(
        out,
        "{} change(s) against version {}: {} added, {} changed, {} removed",
        outcome.diff.len(),
        outcome.base_version,
        count("add"),
        count("change"),
        count("remove"),
    )?;
    for entry in &outcome.diff {
        write_entry(out, entry)?;
    }
    Ok(())
}

fn write_entry(out: &mut impl Write, entry: &DiffEntry) -> std::io::Result<()> {
    let sign = match entry.op.as_str() {
        "add" => '+',
        "remove" => '-',
        _ => '~',
    };
    writeln!(out, "\n{sign} {} {}", entry.kind, entry.name)?;
    let before = yaml_lines(entry.before.as_ref());
    let after = yaml_lines(entry.after.as_ref());
    for line in line_diff(&before, &after, 2) {
        writeln!(out, "    {line}")?;
    }
    Ok(())
}

/// A line diff with `context` unchanged lines around each change (longest
/// common subsequence; documents are small).
fn line_diff(a: &[String], b: &[String], context: usize) -> Vec<String> {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', &a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', &a[i]));
            i += 1;
        } else {
            ops.push(('+', &b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        let lo = k.saturating_sub(context);
        let hi = (k + context).min(ops.len() - 1);
        ops[lo..=hi].iter().any(|(s, _)| *s != ' ')
    };
    let mut lines = Vec::new();
    let mut skipped = false;
    for (k, (sign, text)) in ops.iter().enumerate() {
        if *sign == ' ' && !near_change(k) {
            if !skipped {
                lines.push("  ...".to_owned());
                skipped = true;
            }
            continue;
        }
        skipped = false;
        lines.push(format!("{sign} {text}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn diffs_show_changes_with_context() {
        let a = lines("a\nb\nc\nd\ne\nf\ng\nh");
        let b = lines("a\nb\nc\nd\nE\nf\ng\nh\ni");
        assert_eq!(
            line_diff(&a, &b, 1),
            ["  ...", "  d", "- e", "+ E", "  f", "  ...", "  h", "+ i"]
        );
        assert_eq!(line_diff(&[], &lines("x"), 2), ["+ x"]);
    }
}
