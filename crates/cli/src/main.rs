//! `charon`: the limiting server, its simulator and its tools.

mod bench;
mod bench_null;
mod client_cmd;
mod config_cmd;
mod config_remote;
mod exit;
mod extras;
mod import;
mod keys;
mod lines;
mod serve;
mod sidecar;
mod simulate;
mod telemetry;
mod tls_args;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc rather than the system allocator: a burst of large requests
/// (an oversized configuration write, a simulator replay) frees what it
/// used; glibc's per-thread arenas kept it for the life of the process
/// (+107 MiB after nine refused 3 MB writes), mimalloc keeps less and
/// gives pages back as its threads go on working (measured +17 to +110
/// MiB; see docs/operations-notes/bounded-input.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "charon",
    version,
    about = "Charon: a limiting service (rate limits with burst tiers, distributed counting semaphores).",
    after_help = exit::EXIT_STATUS_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start; the serve flags are the big one"
)]
enum Command {
    /// Run a limiting server (gRPC + HTTP).
    // Boxed: its many flags would make every other variant as large.
    Serve(Box<serve::ServeArgs>),
    /// Replay JSON-line events against a configuration on a virtual clock.
    ///
    /// Reads one event per line on stdin and writes one JSON reply per event
    /// on stdout. See the README for the event format.
    Simulate(simulate::SimulateArgs),
    /// Run the server throttler in front of a service, as a reverse proxy
    /// (HTTP/1.1, HTTP/2, WebSocket), set up by the `throttle:` section of
    /// the configuration file.
    Sidecar(Box<sidecar::SidecarArgs>),
    /// Load-test a running server's Request RPC; prints throughput and
    /// latency percentiles.
    Bench(bench::BenchArgs),
    /// The benchmarks' transport floor: a `Limiter` service on the server's
    /// gRPC stack answering every `Request` with a constant grant, deciding
    /// nothing (`scripts/bench-kinds` compares the server's CPU to it).
    BenchNull(bench_null::NullArgs),
    /// Show the busiest and most limited (resource, domain) pairs of a
    /// server's decision stream, refreshing in the terminal: from its live
    /// view (`--server`) or an events file it writes (`--events FILE`).
    Top(top::TopArgs),
    /// Talk to a running server: one request, or hold copies.
    Client {
        #[command(subcommand)]
        command: client_cmd::ClientCommand,
    },
    /// Work with configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a shell completion script on stdout (bash, zsh, fish, elvish,
    /// powershell); `scripts/install-extras` installs them.
    Completions(extras::CompletionsArgs),
    /// Write the man pages: `charon.1` on stdout, or with --out DIR that
    /// and one page per subcommand.
    Man(extras::ManArgs),
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Validate a configuration file and print it normalized, or every error.
    Check {
        /// The file to check.
        file: PathBuf,
    },
    /// Replace a configuration service's configuration with a file: shows
    /// the difference, then applies it as one commit.
    Apply {
        /// The configuration file (YAML).
        file: PathBuf,
        #[command(flatten)]
        remote: config_remote::RemoteArgs,
        #[command(flatten)]
        confirm: config_remote::ConfirmArgs,
    },
    /// Convert another rate-limit service's configuration files into a
    /// Charon configuration with an `envoy:` section, printed on
    /// stdout; what cannot be carried over is listed on stderr by file and
    /// path. Give the result to `charon config check`, `serve --config` or
    /// `config apply`.
    Import {
        /// The project the files come from.
        #[arg(long, value_enum, value_name = "FORMAT")]
        from: import::Format,
        /// The files: envoyproxy/ratelimit's one file per domain,
        /// Limitador's limits files, or Boulder's defaults file and then,
        /// optionally, its overrides file.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Print the configuration even when something cannot be carried
        /// over (each loss is listed on stderr); without it, the import
        /// fails then.
        #[arg(long)]
        lossy: bool,
        /// The response headers the peer added: `ratelimit`
        /// (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED) or
        /// `x-ratelimit` (Limitador's --rate-limit-headers DRAFT_VERSION_03).
        #[arg(long, value_enum, value_name = "STYLE")]
        headers: Option<import::HeaderStyle>,
        /// Another name for a header, FIELD=NAME with FIELD limit,
        /// remaining or reset (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER,
        /// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); with --headers.
        #[arg(long, value_name = "FIELD=NAME", value_parser = import::header_name, requires = "headers")]
        header_name: Vec<(String, String)>,
        /// The peer ran in global shadow mode (envoyproxy/ratelimit's
        /// SHADOW_MODE=true).
        #[arg(long)]
        shadow_mode: bool,
        /// Merge files that name the same domain (envoyproxy/ratelimit's
        /// MERGE_DOMAIN_CONFIG=true); without it they are refused, as there.
        #[arg(long)]
        merge_domains: bool,
    },
    /// Print a configuration service's configuration as a YAML configuration file.
    Export {
        #[command(flatten)]
        remote: config_remote::RemoteArgs,
    },
    /// Print a configuration service's audit trail, newest first: each
    /// commit's version, time, token name and diff.
    Log {
        #[command(flatten)]
        remote: config_remote::RemoteArgs,
        /// How many commits (1 to 1000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
    },
    /// Restore the configuration an earlier commit left, as a new commit:
    /// shows the difference, then applies it (limiting servers follow
    /// through their feed).
    Rollback {
        /// The version to restore (see `charon config log`).
        #[arg(long, value_name = "VERSION")]
        to: u64,
        #[command(flatten)]
        remote: config_remote::RemoteArgs,
        #[command(flatten)]
        confirm: config_remote::ConfirmArgs,
    },
}

fn main() -> ExitCode {
    // Before anything else: a SIGHUP while `charon serve` starts must not
    // end it (see `serve::catch_hangups`).
    if std::env::args_os().nth(1).is_some_and(|a| a == "serve")
        && let Err(e) = serve::catch_hangups()
    {
        eprintln!("charon: {e}");
        return ExitCode::from(exit::CLIENT_ERROR);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version go to stdout and exit 0; a usage error to
        // stderr, exit status 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                exit::USAGE
            } else {
                exit::ANSWERED
            });
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Sidecar(args) => sidecar::run(*args),
        Command::Bench(args) => bench::run(args),
        Command::BenchNull(args) => bench_null::run(&args),
        Command::Top(args) => top::run(args),
        Command::Client { command } => client_cmd::run(command),
        Command::Simulate(args) => simulate::run(&args),
        Command::Completions(args) => extras::completions(&args, Cli::command()),
        Command::Man(args) => extras::man(&args, Cli::command()),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => config_cmd::check(&file),
        Command::Config {
            command:
                ConfigCommand::Apply {
                    file,
                    remote,
                    confirm,
                },
        } => config_remote::apply(&file, &remote, confirm),
        Command::Config {
            command: ConfigCommand::Export { remote },
        } => config_remote::export(&remote),
        Command::Config {
            command:
                ConfigCommand::Import {
                    from,
                    files,
                    lossy,
                    headers,
                    header_name,
                    shadow_mode,
                    merge_domains,
                },
        } => config_cmd::import(
            from,
            &files,
            &import::PeerSettings {
                headers,
                header_names: header_name,
                shadow_mode,
                merge_domains,
            },
            lossy,
        ),
        Command::Config {
            command: ConfigCommand::Log { remote, limit },
        } => config_remote::log(&remote, limit),
        Command::Config {
            command:
                ConfigCommand::Rollback {
                    to,
                    remote,
                    confirm,
                },
        } => config_remote::rollback(&remote, to, confirm),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("charon: {e:#}");
            exit::of(&e)
        }
    }
}
