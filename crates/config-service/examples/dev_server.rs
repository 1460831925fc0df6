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
    if let Some(seed) = a.seed {
        import(&state, &a.token, std::fs::read_to_string(&seed)?).await?;
    }
    let listener = tokio::net::TcpListener::bind(&a.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    charon_config_service::serve(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// `PUT /v1/config` through the API's own router, as an operator's
/// `charon config apply` would send it (its client is the crate above this
/// one, so it is not used here).
async fn import(
    state: &AppState,
    token: &str,
    yaml: String,
) -> Result<(), Box<dyn std::error::Error>> {
    use axum::http::{Request, header};
    use tower::ServiceExt;
    let request = Request::put("/v1/config")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/yaml")
        .body(axum::body::Body::from(yaml))?;
    let response = router(state.clone()).oneshot(request).await?;
    let status = response.status();
    if !status.is_success() {
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
        return Err(format!(
            "seed refused ({status}): {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
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
