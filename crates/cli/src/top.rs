//! `charon top`: the busiest and the most limited (resource, domain) pairs
//! of a server's decision stream, redrawn in the terminal.
//!
//! Two sources: a server's live view (`--server URL`, `GET /v1/top`, the
//! server counting in its own window) or a file written by `charon serve
//! --events FILE`, followed like `tail -f` (rotation and truncation
//! included) and counted here in the same bounded summaries
//! ([`charon_server::events::Top`]); the window then ends at the newest
//! event read, so a file read after the fact shows its last window.
//! `--once` prints one table and exits (scripts, tests); otherwise `q`
//! (or Ctrl-C) quits, the terminal given back as it was.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use charon_server::events::{Event, PairCount, Top, TopReport, top::MAX_WINDOW};
use clap::Args;

/// How much of an existing file `charon top --events` reads when it
/// starts: its end, enough for a minute at the default cap.
const TAIL_BYTES: u64 = 32 * 1024 * 1024;

/// The widest a resource or domain column gets (longer names are cut).
const NAME_WIDTH: usize = 40;

/// Flags of `charon top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Follow this events file (`charon serve --events FILE`) instead of
    /// asking a server.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    events: Option<PathBuf>,
    /// The server's HTTP address (its `/v1/top`; the server needs
    /// `--events`).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:7071")]
    server: String,
    /// How often the screen is redrawn.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// The window counted: the last 1s to 60s.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_window)]
    window: Duration,
    /// Pairs shown in each list.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
    limit: u16,
    /// Print one table and exit.
    #[arg(long)]
    once: bool,
}

fn parse_window(text: &str) -> Result<Duration, String> {
    let w = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if w < Duration::from_secs(1) || w > MAX_WINDOW {
        return Err("from 1s to 60s".to_owned());
    }
    Ok(w)
}

/// Where the counts come from.
enum Source {
    Server {
        runtime: tokio::runtime::Runtime,
        client: reqwest::Client,
        url: String,
    },
    File(Follower),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Server { url, .. } => format!("server {url}"),
            Source::File(f) => format!("file {}", f.path.display()),
        }
    }

    fn report(&mut self, window: Duration, limit: usize) -> anyhow::Result<TopReport> {
        match self {
            Source::Server {
                runtime,
                client,
                url,
            } => {
                let url = format!(
                    "{}/v1/top?window={}s&limit={limit}",
                    url.trim_end_matches('/'),
                    window.as_secs()
                );
                runtime.block_on(async {
                    let response = client
                        .get(&url)
                        .send()
                        .await
                        .with_context(|| format!("GET {url}"))?;
                    let status = response.status();
                    if !status.is_success() {
                        let text = response.text().await.unwrap_or_default();
                        anyhow::bail!("GET {url}: {status}: {}", text.trim());
                    }
                    response
                        .json::<TopReport>()
                        .await
                        .with_context(|| format!("GET {url}: not a top report"))
                })
            }
            Source::File(f) => {
                f.poll()?;
                Ok(f.top.report(f.newest_ms, window, limit))
            }
        }
    }
}

/// Runs `charon top`.
pub fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    let limit = usize::from(args.limit);
    let mut source = match &args.events {
        Some(path) => Source::File(Follower::new(path.clone())),
        None => Source::Server {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
            url: args.server.clone(),
        },
    };
    let about = source.describe();
    if args.once {
        let report = source.report(args.window, limit)?;
        print!("{}", render(&about, &report, None));
        return Ok(ExitCode::SUCCESS);
    }
    let mut stdout = std::io::stdout();
    let keys = crate::keys::Keys::open();
    loop {
        let screen = match source.report(args.window, limit) {
            Ok(report) => render(&about, &report, None),
            Err(e) => render(&about, &empty(args.window), Some(&format!("{e:#}"))),
        };
        // Home, clear, draw: a full redraw each time.
        writeln!(stdout, "\x1b[H\x1b[2J{screen}(q quits)")?;
        stdout.flush()?;
        if keys.quit_within(args.interval) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

fn empty(window: Duration) -> TopReport {
    TopReport {
        window_s: window.as_secs(),
        until_ms: 0,
        decisions: 0,
        limited: 0,
        approximate: false,
        busiest: Vec::new(),
        most_limited: Vec::new(),
    }
}

/// A name from the stream as it may be shown in a terminal: control
/// characters (a client's escape sequences) become `?`, and it is cut to
/// [`NAME_WIDTH`] characters.
fn printable(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(NAME_WIDTH)
        .collect();
    if name.chars().count() > NAME_WIDTH {
        out.pop();
        out.push('…');
    }
    if out.is_empty() {
        out.push('-');
    }
    out
}

/// The screen: a header, the busiest pairs, the most limited pairs.
fn render(about: &str, r: &TopReport, problem: Option<&str>) -> String {
    let until = if r.until_ms == 0 {
        "-".to_owned()
    } else {
        humantime::format_rfc3339_seconds(charon_server::events::system_time(r.until_ms))
            .to_string()
    };
    let mut out = format!(
        "charon top | {about} | last {}s until {until} | {} decisions, {} limited{}\n",
        r.window_s,
        r.decisions,
        r.limited,
        if r.approximate { " (approximate)" } else { "" }
    );
    if let Some(problem) = problem {
        out.push_str(&format!("error: {problem}\n"));
    }
    let rows = |pairs: &[PairCount]| -> Vec<(String, String, u64, u64)> {
        pairs
            .iter()
            .map(|p| {
                (
                    printable(&p.resource),
                    printable(&p.domain),
                    p.decisions,
                    p.limited,
                )
            })
            .collect()
    };
    let busiest = rows(&r.busiest);
    let limited = rows(&r.most_limited);
    let width = |f: fn(&(String, String, u64, u64)) -> usize, min: usize| {
        busiest
            .iter()
            .chain(&limited)
            .map(f)
            .max()
            .unwrap_or(0)
            .max(min)
    };
    let rw = width(|r| r.0.chars().count(), "resource".len());
    let dw = width(|r| r.1.chars().count(), "domain".len());
    let table = |out: &mut String,
                 title: &str,
                 rows: &[(String, String, u64, u64)],
                 limited_first: bool| {
        out.push_str(&format!("\n{title}\n"));
        let (a, b) = if limited_first {
            ("limited", "decisions")
        } else {
            ("decisions", "limited")
        };
        out.push_str(&format!(
            "  {:<rw$}  {:<dw$}  {a:>10}  {b:>10}\n",
            "resource", "domain"
        ));
        if rows.is_empty() {
            out.push_str("  (none)\n");
        }
        for (resource, domain, decisions, limited) in rows {
            let (x, y) = if limited_first {
                (limited, decisions)
            } else {
                (decisions, limited)
            };
            out.push_str(&format!(
                "  {resource:<rw$}  {domain:<dw$}  {x:>10}  {y:>10}\n"
            ));
        }
    };
    table(&mut out, "BUSIEST", &busiest, false);
    table(&mut out, "MOST LIMITED", &limited, true);
    out
}

/// Follows an events file like `tail -f`: reads what is appended, and
/// when the file at the path is another one (rotated: moved away and a
/// new one made) or shorter than what was read (truncated), finishes the
/// old one and starts the new one from its beginning.
struct Follower {
    path: PathBuf,
    file: Option<File>,
    identity: Option<(u64, u64)>,
    pos: u64,
    /// The start of a line not yet ended.
    partial: Vec<u8>,
    /// Whether the next line read is the end of one cut by starting in the
    /// middle of the file.
    skip_first: bool,
    started: bool,
    top: Top,
    newest_ms: u64,
}

impl Follower {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            identity: None,
            pos: 0,
            partial: Vec::new(),
            skip_first: false,
            started: false,
            top: Top::new(),
            newest_ms: 0,
        }
    }

    /// Reads whatever is new.
    fn poll(&mut self) -> anyhow::Result<()> {
        if self.file.is_none() && !self.open()? {
            return Ok(());
        }
        self.read_to_end()?;
        // Rotated or truncated: what the old file had is read; the new one
        // is read from its start.
        let now = std::fs::metadata(&self.path).ok();
        let replaced = match &now {
            None => false,
            Some(m) => Some((m.dev(), m.ino())) != self.identity || m.len() < self.pos,
        };
        if replaced {
            self.file = None;
            self.partial.clear();
            if self.open()? {
                self.read_to_end()?;
            }
        }
        Ok(())
    }

    /// Opens the file at the path; `false` if there is none yet.
    fn open(&mut self) -> anyhow::Result<bool> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.started => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("{}", self.path.display())),
        };
        let meta = file.metadata()?;
        self.identity = Some((meta.dev(), meta.ino()));
        self.pos = 0;
        if !self.started && meta.is_file() && meta.len() > TAIL_BYTES {
            self.pos = meta.len() - TAIL_BYTES;
            file.seek(SeekFrom::Start(self.pos))?;
            self.skip_first = true;
        }
        self.started = true;
        self.file = Some(file);
        Ok(true)
    }

    fn read_to_end(&mut self) -> anyhow::Result<()> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            let n = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("reading the events file"),
            };
            self.pos += n as u64;
            self.partial.extend_from_slice(&chunk[..n]);
            let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let rest = self.partial.split_off(last + 1);
            let lines = std::mem::replace(&mut self.partial, rest);
            for line in lines.split(|&b| b == b'\n') {
                if std::mem::take(&mut self.skip_first) {
                    continue;
                }
                // Blank, torn or foreign lines are skipped.
                if let Ok(e) = serde_json::from_slice::<Event>(line) {
                    self.newest_ms = self.newest_ms.max(e.time_ms);
                    self.top.add(&e);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use charon_server::events::EventOutcome;

    fn line(time_ms: u64, domain: &str) -> String {
        let e = Event::new(time_ms, "request", "r", domain, EventOutcome::Granted);
        format!("{}\n", serde_json::to_string(&e).unwrap())
    }

    fn append(path: &std::path::Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn a_followed_file_is_read_across_rotation_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        append(&path, &line(1_000, "a"));
        let mut f = Follower::new(path.clone());
        f.poll().unwrap();
        // Half a line, then its end: counted once whole.
        let next = line(1_100, "a");
        let (head, tail) = next.split_at(20);
        append(&path, head);
        f.poll().unwrap();
        append(&path, tail);
        append(&path, "not json\n\n");
        // Rotated: the old file gets one more line before it is moved, and
        // the new one starts.
        append(&path, &line(1_200, "b"));
        std::fs::rename(&path, dir.path().join("events.jsonl.1")).unwrap();
        append(&path, &line(1_300, "c"));
        f.poll().unwrap();
        let r = f.top.report(f.newest_ms, Duration::from_secs(10), 10);
        let counts: Vec<(&str, u64)> = r
            .busiest
            .iter()
            .map(|p| (p.domain.as_str(), p.decisions))
            .collect();
        assert_eq!(counts, [("a", 2), ("b", 1), ("c", 1)]);
        // Truncated in place (copytruncate): read again from its start.
        std::fs::write(&path, "").unwrap();
        f.poll().unwrap();
        append(&path, &line(1_400, "d"));
        f.poll().unwrap();
        let r = f.top.report(f.newest_ms, Duration::from_secs(10), 10);
        assert_eq!(r.decisions, 5);
    }

    #[test]
    fn names_cannot_drive_the_terminal() {
        assert_eq!(printable("a\x1b[2Jb"), "a?[2Jb");
        assert_eq!(printable(""), "-");
        let long = "x".repeat(100);
        assert_eq!(printable(&long).chars().count(), NAME_WIDTH);
    }
}
