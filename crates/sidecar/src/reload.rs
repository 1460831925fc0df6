//! Reloads the configuration file like `charon serve` does (SIGHUP, or
//! the file changed and settled): a valid file with a `throttle:` section
//! is put in force (queue, bucket and estimates kept); anything else is
//! refused with every problem in the log, and the one in force stays.

use std::sync::Arc;

use charon_server::config_file;
use charon_server::file_reload::FileWatch;
use metrics::counter;
use tracing::{error, info};

use crate::SidecarState;

pub(crate) fn spawn(state: Arc<SidecarState>) {
    let mut watch = match FileWatch::new(&state.config, "configuration") {
        Ok(w) => w,
        Err(e) => {
            error!("configuration reload is off: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            let next = match watch.next(&state.shutdown).await {
                Ok(Some(next)) => next,
                Ok(None) => return,
                Err(e) => {
                    error!("configuration reload stopped: {e}");
                    return;
                }
            };
            let result = next.and_then(|bytes| apply(&state, &bytes));
            let mut problem = state
                .problem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match result {
                Ok(()) => {
                    counter!("charon_config_reloads_total", "result" => "applied").increment(1);
                    info!(file = %state.config.display(), "configuration reloaded");
                    *problem = None;
                }
                Err(e) => {
                    counter!("charon_config_reloads_total", "result" => "refused").increment(1);
                    error!(file = %state.config.display(), "configuration refused; the previous one stays in force:\n{e}");
                    *problem = Some("the file changed and is invalid; see the log".to_owned());
                }
            }
        }
    });
}

fn apply(state: &SidecarState, bytes: &[u8]) -> Result<(), String> {
    let path = state.config.display();
    let text = std::str::from_utf8(bytes).map_err(|e| format!("{path}: not UTF-8 text: {e}"))?;
    let (limits, _, settings) = config_file::parse_text(text).map_err(|problems| {
        problems
            .iter()
            .map(|p| format!("{path}: {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let throttle = settings
        .throttle
        .ok_or_else(|| format!("{path}: no `throttle:` section"))?;
    state
        .layer
        .reconfigure(throttle, Some(limits))
        .map_err(|e| format!("{path}: {e}"))
}
