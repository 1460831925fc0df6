//! Issue 12's acceptance suite through Envoy's own generated Python stubs
//! (PyPI `xds-protos`): `crates/cli/tests/envoy_python/run.sh` installs the
//! pinned `requirements.txt` into a virtualenv under the target directory
//! (once; reused while the pins are unchanged) and runs its pytest suite
//! against real `charon serve` processes (this package's binary), in the
//! in-memory store and on private `redis-server`s.
//!
//! Ignored by plain `cargo test`, which installs nothing and needs no
//! network: `scripts/test` runs it with `--ignored`:
//!
//! ```text
//! cargo test -p charon --test cli envoy_python:: -- --ignored
//! ```

use std::path::Path;

#[test]
#[ignore = "installs xds-protos, grpcio and pytest from PyPI; run with --ignored"]
fn envoys_python_stubs_get_the_decisions_of_spec_section_11() {
    crate::support::run_suite_script(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/envoy_python/run.sh"),
    );
}
