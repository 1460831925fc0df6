//! The Python client's own checks (`clients/python/run-tests.sh`: the
//! package installed with its pinned test requirements into a virtualenv in
//! Charon's per-machine cache, `mypy --strict`, `ruff`, then pytest against
//! real `charon serve` processes of this package's binary, in memory and on
//! private `redis-server`s).
//!
//! Ignored by plain `cargo test`, which installs nothing and needs no
//! network; `scripts/test` runs it with the other ignored suites, beside
//! the rest of the tests:
//!
//! ```text
//! cargo test -p charon --test cli python_client:: -- --ignored
//! ```

use std::path::Path;

#[test]
#[ignore = "installs the Python client's test requirements from PyPI; run with --ignored"]
fn the_python_clients_checks_and_tests_pass() {
    crate::support::run_suite_script(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/run-tests.sh"),
    );
}
