//! The retry policy of paper §3.2: after the i-th rejection (i = 1, 2, …)
//! sleep `min(max_wait − elapsed, jitter(base · 2^i))`, and give up with
//! the last rejection once nothing of `max_wait` is left.

use std::time::Duration;

/// A value spread uniformly over `[v − v/4, v + v/4)`; `unit` is uniform
/// in `[0, 1)`.
pub fn jitter(v: Duration, unit: f64) -> Duration {
    let quarter = v / 4;
    (v - quarter) + quarter.mul_f64(2.0 * unit.clamp(0.0, 1.0))
}

/// How long to sleep after the `attempt`-th rejection (1-based), or `None`
/// when the wait has run out and the last rejection should be returned.
pub fn next_sleep(
    base: Duration,
    attempt: u32,
    max_wait: Duration,
    elapsed: Duration,
    unit: f64,
) -> Option<Duration> {
    let left = max_wait.checked_sub(elapsed).filter(|d| !d.is_zero())?;
    let factor = 2u32.saturating_pow(attempt.min(30));
    let step = base.checked_mul(factor).unwrap_or(Duration::MAX);
    Some(left.min(jitter(step, unit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn jitter_stays_within_a_quarter() {
        assert_eq!(jitter(S * 4, 0.0), S * 3);
        assert!(jitter(S * 4, 0.999_999) < S * 5);
        assert_eq!(jitter(S * 4, 0.5), S * 4);
    }

    #[test]
    fn sleeps_double_and_are_capped_by_what_is_left() {
        assert_eq!(next_sleep(S, 1, S * 100, Duration::ZERO, 0.5), Some(S * 2));
        assert_eq!(next_sleep(S, 2, S * 100, Duration::ZERO, 0.5), Some(S * 4));
        assert_eq!(
            next_sleep(S, 3, S * 100, S * 97, 0.5),
            Some(S * 3),
            "only 3 s left"
        );
        assert_eq!(next_sleep(S, 1, S * 5, S * 5, 0.5), None, "nothing left");
        assert_eq!(
            next_sleep(S, 1, Duration::ZERO, Duration::ZERO, 0.5),
            None,
            "max_wait 0: no retry"
        );
        assert!(
            next_sleep(S, 200, Duration::MAX, Duration::ZERO, 0.5).is_some(),
            "no overflow"
        );
    }
}
