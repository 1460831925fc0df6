//! The normalization of SPEC §2 (paper §4.1), applied to every
//! configuration before it is used or stored. Each change is reported so
//! that `charon config check` and the config API can show the operator what
//! the limiter will really enforce.

use std::fmt;

use super::{Resource, ResourceKind, Tier};
use crate::time::format_span;

/// One change normalization made, with the place it made it. The
/// configuration service answers these as they are; its clients read them
/// back (`Deserialize`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Adjustment {
    pub path: String,
    pub change: String,
}

impl fmt::Display for Adjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.change)
    }
}

pub(super) fn normalize(resources: &mut [Resource]) -> Vec<Adjustment> {
    let mut out = Vec::new();
    for (i, r) in resources.iter_mut().enumerate() {
        let path = format!("resources[{i}]");
        match &mut r.kind {
            ResourceKind::Rate(rate) => {
                normalize_tiers(&format!("{path}.tiers"), &mut rate.tiers, &mut out);
                for (domain, o) in &mut rate.domains {
                    if let Some(tiers) = &mut o.tiers {
                        normalize_tiers(
                            &format!("{path}.domains[{domain:?}].tiers"),
                            tiers,
                            &mut out,
                        );
                    }
                }
            }
            ResourceKind::Copy(copy) => {
                let Some(global) = copy.global_limit else {
                    continue;
                };
                let mut lower = |field: String, limit: &mut u64| {
                    if *limit > global {
                        out.push(Adjustment {
                            path: field,
                            change: format!("{limit} lowered to the global limit {global}"),
                        });
                        *limit = global;
                    }
                };
                lower(format!("{path}.domain_limit"), &mut copy.domain_limit);
                for (domain, limit) in &mut copy.domains {
                    lower(format!("{path}.domains[{domain:?}].domain_limit"), limit);
                }
                for (g, group) in copy.groups.iter_mut().enumerate() {
                    lower(format!("{path}.groups[{g}].limit"), &mut group.limit);
                }
            }
            // Buckets, windows and queues have nothing to normalize: every
            // value is used exactly as written (their bounds are checked,
            // not adjusted), so what the operator wrote is what applies.
            ResourceKind::Bucket(_)
            | ResourceKind::Window(_)
            | ResourceKind::Queue(_)
            | ResourceKind::Lease(_) => {}
        }
    }
    out
}

/// Normalizes one tier list in place: drops tiers that are never active,
/// shortens windows longer than the active period, and trims the active
/// period to whole windows (a partial window at the tail would let a domain
/// go over its limit when it re-enters a tier with no cooldown).
pub fn normalize_tiers(path: &str, tiers: &mut Vec<Tier>, out: &mut Vec<Adjustment>) {
    let mut kept = Vec::with_capacity(tiers.len());
    for (j, t) in tiers.iter().enumerate() {
        let at = format!("{path}[{j}]");
        let mut t = *t;
        match t.active {
            Some(0) => {
                out.push(Adjustment {
                    path: at,
                    change: "removed: its active period is 0s".to_owned(),
                });
                continue;
            }
            Some(active) => {
                if active < t.window {
                    out.push(Adjustment {
                        path: format!("{at}.window"),
                        change: format!(
                            "{} shortened to the active period {}",
                            format_span(t.window),
                            format_span(active)
                        ),
                    });
                    t.window = active;
                }
                if active % t.window != 0 {
                    let trimmed = active / t.window * t.window;
                    out.push(Adjustment {
                        path: format!("{at}.active"),
                        change: format!(
                            "{} trimmed to {}, a whole number of {} windows",
                            format_span(active),
                            format_span(trimmed),
                            format_span(t.window)
                        ),
                    });
                    t.active = Some(trimmed);
                }
            }
            None => {}
        }
        kept.push(t);
    }
    *tiers = kept;
}
