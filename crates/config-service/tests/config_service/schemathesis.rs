//! OpenAPI conformance: schemathesis (installed from PyPI by
//! `tests/schemathesis.sh` into a virtualenv under the target directory)
//! against this service on a free port. Ignored by default because it
//! needs the network the first time and takes about half a minute:
//!
//! ```text
//! cargo test -p charon-config-service --test config_service schemathesis:: -- --ignored
//! ```
//!
//! or run the script itself, which builds and starts the `dev_server`
//! example.

use crate::support;

use std::process::Command;

use support::{Served, TestDb};

async fn conforms(db: TestDb) {
    let token = "schemathesis-token";
    let app = db
        .app_with(
            charon_config_service::Tokens::new().writer(token),
            Default::default(),
        )
        .await;
    let served = Served::start(app.state.clone(), 0).await;
    app.put("/v1/config")
        .token(token)
        .body("application/yaml", include_str!("../seed.yaml"))
        .send()
        .await
        .expect(200);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis.sh");
    let url = served.url.clone();
    let status = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script)
            .env("CHARON_CONFIG_URL", url)
            .env("CHARON_CONFIG_TOKEN", token)
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    served.stop().await;
    assert!(status.success(), "schemathesis found problems (see above)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs schemathesis from PyPI; run with --ignored (or tests/schemathesis.sh)"]
async fn the_api_on_sqlite_conforms_to_its_openapi_document() {
    conforms(TestDb::sqlite()).await;
}

#[test]
#[ignore = "installs schemathesis from PyPI; run with --ignored"]
fn the_api_on_postgres_conforms_to_its_openapi_document() {
    let pg = charon_testkit::Postgres::start();
    let db = TestDb::postgres(pg.create_database("schemathesis"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(conforms(db));
}
