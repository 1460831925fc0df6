//! Issue 6's end-to-end test: the burst-tier simulator page, loaded from a
//! running `charon serve`, driven in headless Chromium by
//! `crates/simulator-web/e2e/run.sh`. Screenshots: `target/e2e/`.
//!
//! Ignored by plain `cargo test`, which installs nothing: `scripts/test`
//! runs `crates/simulator-web/e2e/install.sh` (Chromium, playwright-core)
//! and then this test with `--ignored`.

use std::path::Path;
use std::process::Command;

use charon_testkit::CharonProcess;

#[test]
#[ignore = "needs chromium and playwright-core: scripts/test installs them and runs it"]
fn the_simulator_page_served_by_charon_serve_works_in_chromium() {
    let server = CharonProcess::start(
        Path::new(env!("CARGO_BIN_EXE_charon")),
        "resources: [ { name: api, kind: rate, tiers: [ { limit: 1, window: 1s } ] } ]",
        &[],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../simulator-web/e2e/run.sh");
    let status = Command::new("bash")
        .arg(&script)
        .env(
            "CHARON_URL",
            format!("http://127.0.0.1:{}", server.http_port),
        )
        .status()
        .expect("run the e2e script");
    assert!(
        status.success(),
        "the browser test failed; see target/e2e/ for screenshots\n{}",
        server.log()
    );
}
