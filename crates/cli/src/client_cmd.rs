//! `charon client …`: one operation against a running server, for operators
//! poking at a deployment (and for tests that need a client process).
//! Degraded mode is off here: an unreachable server is reported, not
//! papered over.

use std::process::ExitCode;
use std::time::Duration;

use charon_client::{Client, ClientOptions, Error};
use clap::{Args, Subcommand};
use serde_json::json;

/// Flags common to every client command.
#[derive(Args, Debug)]
pub struct Target {
    /// The server's gRPC address.
    #[arg(
        long,
        value_name = "URL",
        default_value = "http://127.0.0.1:7070",
        env = "CHARON_SERVER"
    )]
    server: String,
    /// The resource.
    resource: String,
    /// The domain on whose behalf to ask.
    domain: String,
    /// How many hits or copies to ask for.
    #[arg(long, default_value_t = 1)]
    copies: u64,
    /// The fewest worth having.
    #[arg(long, default_value_t = 1)]
    min_copies: u64,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// A rate-limited request; prints the reply as JSON.
    Request {
        #[command(flatten)]
        target: Target,
        /// Retry rejections with back-off for up to this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        max_wait: Duration,
    },
    /// Reserve copies, print the reply as JSON, and hold them until this
    /// process is stopped (SIGTERM or SIGINT release them; SIGKILL leaves
    /// that to the server).
    Hold {
        #[command(flatten)]
        target: Target,
    },
}

pub fn run(command: ClientCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            ClientCommand::Request { target, max_wait } => {
                let client = connect(&target)?;
                let grant = client
                    .request(&target.resource, &target.domain)
                    .copies(target.copies)
                    .min_copies(target.min_copies)
                    .max_wait(max_wait)
                    .send()
                    .await;
                Ok(match grant {
                    Ok(g) => {
                        let r = g.reply.unwrap_or_default();
                        println!(
                            "{}",
                            json!({
                                "granted": g.granted, "source": format!("{:?}", g.source).to_lowercase(),
                                "hard_limit": r.hard_limit, "global_limit": r.global_limit, "tier_limit": r.tier_limit,
                                "domain_hits_last_second": r.domain_hits_last_second,
                                "global_hits_last_second": r.global_hits_last_second,
                                "tier_hits": r.tier_hits, "tier": r.tier, "burst": r.burst,
                                "hard_limited": r.hard_limited, "global_limited": r.global_limited,
                                "waited_ms": g.waited.as_millis() as u64,
                            })
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => report(&e),
                })
            }
            ClientCommand::Hold { target } => {
                let client = connect(&target)?;
                let hold = client
                    .reserve(&target.resource, &target.domain)
                    .copies(target.copies)
                    .min_copies(target.min_copies)
                    .send()
                    .await;
                let mut hold = match hold {
                    Ok(h) => h,
                    Err(e) => return Ok(report(&e)),
                };
                println!(
                    "{}",
                    json!({"granted": hold.copies(), "groups": hold.groups(), "resource": hold.resource(), "domain": hold.domain()})
                );
                if !hold.is_granted() {
                    return Ok(ExitCode::from(1));
                }
                wait_for_stop().await;
                hold.release_all().await?;
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

fn connect(target: &Target) -> anyhow::Result<Client> {
    let mut options = ClientOptions::new(target.server.clone());
    options.fail_open = false;
    Ok(Client::connect(options)?)
}

fn report(e: &Error) -> ExitCode {
    let class = if e.is_server() { "server" } else { "client" };
    println!("{}", json!({"error": class, "message": e.to_string()}));
    ExitCode::from(2)
}

async fn wait_for_stop() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
