//! The bucket, window and queue operation of the Redis store: one
//! `drain.lua` (buckets, queues) or `window.lua` call per decision (see
//! `docs/redis.md`), and the encoding of the state it keeps, read back here
//! only to let core word a refusal.

use charon_core::drain::Mark;
use charon_core::meter::{self, Level, Meter, MeterState, Op, Reply};
use charon_core::window::{Algorithm, Counts};
use charon_core::{Millis, bucket};

use super::args::op_args;
use super::reply::{self as script_reply, bad};
use crate::{Batch, Limit, MeterOp, OpReply, StoreError};

/// The script arguments after the clock and the expiry slack: kind,
/// parameters, policy, operation.
pub(crate) fn args(meter: &Meter, op: Op) -> Vec<String> {
    let mut args = Vec::with_capacity(10);
    match meter {
        Meter::Bucket(p) => drain_args(&mut args, "b", p.ticks()),
        Meter::Queue(p) => drain_args(&mut args, "q", p.ticks()),
        Meter::Window(p) => {
            args.push("w".to_owned());
            args.push(Level::limit(p).to_string());
            args.push(p.window().to_string());
            args.push(p.max_count().to_string());
            args.push(
                match p.algorithm() {
                    Algorithm::Fixed => "0",
                    Algorithm::SlidingCounter => "1",
                    Algorithm::FirstHit => "2",
                }
                .to_owned(),
            );
        }
    }
    let policy = meter.policy();
    args.push(
        policy
            .soft_limit
            .map_or(0, meter::SoftLimit::as_percent)
            .to_string(),
    );
    args.push(policy.ban.map_or(0, meter::Ban::duration).to_string());
    let (code, copies, min) = op_args(op);
    args.push(code.to_owned());
    args.push(copies.to_string());
    args.push(min.to_string());
    args
}

fn drain_args(args: &mut Vec<String>, kind: &str, t: charon_core::drain::Ticks) {
    args.push(kind.to_owned());
    args.push(t.per_unit.to_string());
    args.push(t.per_ms.to_string());
    args.push(t.capacity.to_string());
    args.push(t.max_ahead.to_string());
}

/// Reads the script's reply; a refusal is worded by core on the state the
/// script saw, at the time it decided.
pub(crate) fn reply(
    script: &'static str,
    meter: &Meter,
    op: Op,
    v: redis::Value,
) -> Result<Reply, StoreError> {
    let mut r = script_reply::Reply::new(script, v)?;
    if r.status_is("refused") {
        let raw = r.text()?;
        let now = r.count()?;
        return Err(refusal(script, meter, op, &raw, now));
    }
    fields(&mut r)
}

/// Core's error for an operation the script refused, on the state it saw
/// (`raw`) at the time it decided.
fn refusal(script: &'static str, meter: &Meter, op: Op, raw: &str, now: Millis) -> StoreError {
    let Some(mut state) = decode(meter, raw) else {
        return bad(script, raw);
    };
    match meter.decide(&mut state, now, op) {
        Err(e) => StoreError::Refused(e),
        Ok(_) => bad(script, "refused what core grants"),
    }
}

/// Reads the meters script's reply (see `lua/meters.lua`): per operation
/// the 8 values of a meter's reply or the 13 of the tiers'.
pub(crate) fn batch_reply(
    script: &'static str,
    ops: &[MeterOp<'_>],
    v: redis::Value,
) -> Result<Batch, StoreError> {
    let mut r = script_reply::Reply::new(script, v)?;
    let refused = r.status_is("refused");
    if refused || r.status_is("over") {
        let i = usize::try_from(r.count()?).unwrap_or(usize::MAX);
        let o = ops
            .get(i)
            .ok_or_else(|| bad(script, &format!("refused operation {i}")))?;
        return Err(match (refused, o.limit) {
            (true, Limit::Meter(m)) => {
                let raw = r.text()?;
                let now = r.count()?;
                refusal(script, m, o.op, &raw, now)
            }
            (false, Limit::Tiers { .. }) => super::over(&mut r)?,
            _ => bad(script, &format!("operation {i} refused as another kind")),
        });
    }
    let committed = r.flag()?;
    let replies = ops
        .iter()
        .map(|o| match o.limit {
            Limit::Meter(_) => fields(&mut r).map(OpReply::Meter),
            Limit::Tiers {
                limits,
                enforcement,
                ..
            } => super::tiers_fields(&mut r, limits, enforcement).map(OpReply::Tiers),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if r.remaining() != 0 {
        return Err(bad(script, "the reply is too long"));
    }
    Ok(Batch { committed, replies })
}

/// The 8 values of one decision's reply.
fn fields(r: &mut script_reply::Reply) -> Result<Reply, StoreError> {
    let granted = r.count()?;
    let limit = r.count()?;
    let remaining = r.count()?;
    let reset_after_ms = r.count()?;
    let retry = r.int()?;
    let warning = r.flag()?;
    let banned = r.flag()?;
    let delay = r.int()?;
    Ok(Reply {
        granted,
        limit,
        remaining,
        reset_after_ms,
        retry_after_ms: u64::try_from(retry).ok(),
        warning,
        banned,
        delay_ms: u64::try_from(delay).ok(),
    })
}

/// A stored value (`<kind>:<level>[;<ban end>]`) as core's state; a value
/// of another kind is the empty state, as the script reads it. `None` if
/// the value makes no sense.
pub(crate) fn decode(meter: &Meter, raw: &str) -> Option<MeterState> {
    if raw.is_empty() {
        return Some(meter.empty());
    }
    let (kind, rest) = raw.split_once(':')?;
    // The forget time a test clock's values carry: the script has checked it.
    let rest = rest.split_once('@').map_or(rest, |(body, _)| body);
    let (level, ban) = match rest.split_once(';') {
        Some((l, b)) => (l, Some(b.parse::<Millis>().ok()?)),
        None => (rest, None),
    };
    let nums = || -> Option<Vec<u64>> {
        level
            .split(',')
            .map(|n| n.parse().ok())
            .collect::<Option<Vec<u64>>>()
    };
    let mark = || -> Option<Option<Mark>> {
        if level.is_empty() {
            return Some(None);
        }
        match nums()?.as_slice() {
            &[ms, frac] => Some(Some(Mark { ms, frac })),
            _ => None,
        }
    };
    Some(match (meter, kind) {
        (Meter::Bucket(_), "b") => MeterState::Bucket(bucket::State {
            level: mark()?,
            banned_until: ban,
        }),
        (Meter::Queue(_), "q") => MeterState::Queue(meter::State {
            level: mark()?,
            banned_until: ban,
        }),
        (Meter::Window(_), "w") => {
            let level = if level.is_empty() {
                None
            } else {
                match nums()?.as_slice() {
                    &[index, curr, prev] => Some(Counts { index, curr, prev }),
                    _ => return None,
                }
            };
            MeterState::Window(meter::State {
                level,
                banned_until: ban,
            })
        }
        _ => meter.empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use charon_core::meter::Policy;

    #[test]
    fn stored_values_read_as_core_states() {
        let b = Meter::Bucket(bucket::Params::new(3, 3, 1_000, Policy::default()).expect("valid"));
        let MeterState::Bucket(s) = decode(&b, "b:1700000000123,2;1700000003600").expect("valid")
        else {
            panic!("a bucket");
        };
        assert_eq!(
            s.level,
            Some(Mark {
                ms: 1_700_000_000_123,
                frac: 2
            })
        );
        assert_eq!(s.banned_until, Some(1_700_000_003_600));
        let MeterState::Bucket(s) = decode(&b, "b:;5").expect("valid") else {
            panic!("a bucket");
        };
        assert_eq!((s.level, s.banned_until), (None, Some(5)));
        assert_eq!(decode(&b, "w:1,2,3"), Some(b.empty()), "another kind");
        assert_eq!(decode(&b, "b:1,x"), None);
    }
}
