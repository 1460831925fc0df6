//! A configuration service on its own, for trying the API by hand and for
//! the OpenAPI conformance run (`tests/schemathesis.sh`).
//!
//! ```text
//! cargo run -p charon-config-service --example dev_server -- \
//!     [--db PATH|URL] [--listen ADDR] [--token SECRET] [--seed FILE.yaml]
//! ```
//!
//! Prints `listening on http://ADDR` once it accepts connections; stops on
//! Ctrl-C.

use std::process::ExitCode;

use charon_config_service::{AppState, Tokens, router};

struct Args {
    db: String,
    listen: String,
    token: String,
    seed: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        db: "charon-config.db".to_owned(),
        listen: "127.0.0.1:7072".to_owned(),
        token: "dev-token".to_owned(),
        seed: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--db" => a.db = value,
            "--listen" => a.listen = value,
            "--token" => a.token = value,
            "--seed" => a.seed = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

async fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let state = AppState::open(&a.db, Tokens::new().writer(&a.token)).await?;
    let listener = tokio::net::TcpListener::bind(&a.listen).await?;
    let addr = listener.local_addr()?;
    if let Some(seed) = a.seed {
        // Through the API itself, as an operator would.
        let client = charon_config_service::client::ConfigClient::new(
            &format!("http://{addr}"),
            Some(a.token.clone()),
            std::time::Duration::from_secs(5),
        )?;
        let yaml = std::fs::read_to_string(&seed)?;
        let app = router(state.clone());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        client.import_yaml(&yaml, false, None).await?;
        println!("listening on http://{addr}");
        tokio::select! {
            r = server => { r??; }
            _ = tokio::signal::ctrl_c() => {}
        }
        return Ok(());
    }
    println!("listening on http://{addr}");
    charon_config_service::serve(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dev_server: {e}");
            return ExitCode::from(2);
        }
    };
    match run(a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dev_server: {e}");
            ExitCode::FAILURE
        }
    }
}
