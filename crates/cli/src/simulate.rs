//! `charon simulate --config FILE`: JSON lines in, JSON lines out.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use charon_simulate::{Reply, Simulation};

use crate::config_cmd;
use crate::lines::{Line, read_bounded};

/// The longest event line accepted; longer lines get a client error.
const MAX_LINE: usize = 1 << 20;

pub fn run(config: &Path) -> anyhow::Result<ExitCode> {
    let Some((config, settings)) = config_cmd::load_with_settings(config)? else {
        return Ok(ExitCode::FAILURE);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sim = Simulation::new(config).with_throttle(settings.throttle);
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut buf = Vec::new();
    while let Some(line) = read_bounded(&mut input, &mut buf, MAX_LINE)? {
        let replies = match line {
            Line::TooLong => vec![serde_json::to_value(Reply::client_error(format!(
                "line longer than {MAX_LINE} bytes"
            )))?],
            Line::Text => runtime.block_on(sim.lines(&buf)),
        };
        for reply in replies {
            serde_json::to_writer(&mut out, &reply)?;
            out.write_all(b"\n")?;
        }
        // Each reply is seen at once by whoever drives us interactively.
        out.flush()?;
    }
    // What the throttler does after the last event (SPEC §13).
    for reply in sim.end() {
        serde_json::to_writer(&mut out, &reply)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
