//! Replies as JSON objects, in the field names of SPEC §6. One encoding,
//! used by `charon simulate`, the HTTP simulator endpoint and logs, so the
//! same reply never looks different in two places.

use charon_core::UNBOUNDED;
use charon_core::copy::{CopyStatus, ReserveReply, Staged};
use charon_core::rate::RateReply;
use serde_json::{Map, Value, json};

/// A limit for display: `null` when absent or unbounded.
pub fn limit(l: Option<u64>) -> Value {
    match l {
        Some(v) if v != UNBOUNDED => v.into(),
        _ => Value::Null,
    }
}

/// The reply to `request` (SPEC §2 rule 6).
pub fn rate_reply(r: &RateReply, out: &mut Map<String, Value>) {
    out.insert("granted".into(), r.granted.into());
    out.insert("hard_limit".into(), limit(r.hard_limit));
    out.insert("global_limit".into(), limit(r.global_limit));
    out.insert("tier_limit".into(), limit(Some(r.tier_limit)));
    out.insert(
        "domain_hits_last_second".into(),
        r.domain_hits_last_second.into(),
    );
    out.insert(
        "global_hits_last_second".into(),
        r.global_hits_last_second.into(),
    );
    out.insert("tier_hits".into(), r.tier_hits.into());
    out.insert("tier".into(), r.tier.into());
    out.insert("burst".into(), r.burst.into());
    out.insert("hard_limited".into(), r.hard_limited.into());
    out.insert("global_limited".into(), r.global_limited.into());
    if r.ignored {
        out.insert("ignored".into(), true.into());
    }
}

/// The reply to `reserve` (SPEC §3).
pub fn reserve_reply(r: &ReserveReply, out: &mut Map<String, Value>) {
    out.insert("granted".into(), r.granted.into());
    out.insert("domain_limit".into(), limit(Some(r.domain_limit)));
    out.insert("global_limit".into(), limit(r.global_limit));
    out.insert("domain_holds".into(), r.domain_holds.into());
    out.insert("global_holds".into(), r.global_holds.into());
    let groups = r
        .groups
        .iter()
        .map(|g| json!({"name": g.name, "limit": g.limit, "holds": g.holds}))
        .collect();
    out.insert("groups".into(), Value::Array(groups));
    if r.ignored {
        out.insert("ignored".into(), true.into());
    }
}

/// Counts after a release.
pub fn copy_status(s: &CopyStatus, out: &mut Map<String, Value>) {
    out.insert("domain_holds".into(), s.domain_holds.into());
    out.insert("global_holds".into(), s.global_holds.into());
    let groups = s
        .groups
        .iter()
        .map(|(name, holds)| json!({"name": name, "holds": holds}))
        .collect();
    out.insert("groups".into(), Value::Array(groups));
}

/// The reply to `seize`.
pub fn staged(s: &Staged, out: &mut Map<String, Value>) {
    out.insert("resource".into(), s.hold.resource.clone().into());
    out.insert("domain".into(), s.hold.domain.clone().into());
    out.insert("groups".into(), s.hold.groups.clone().into());
    out.insert("copies".into(), s.copies.into());
}
