"""The retry policy of paper §3.2: after the i-th rejection sleep
``min(max_wait - elapsed, jitter(base * 2**i))``, and give up with the last
rejection once nothing of ``max_wait`` is left. When the server says when
a retry would succeed (``retry_after_ms``), that wait replaces the guess,
spread upwards by up to a quarter so that waiting clients do not all come
back at the same instant."""

from __future__ import annotations

from typing import Optional

# A server that says "now" (retry_after 0) lost a race to another client:
# come back after a short pause rather than spin.
_MIN_STEP = 0.005


def jitter(v: float, unit: float) -> float:
    """``v`` spread uniformly over ``[v - v/4, v + v/4)``; ``unit`` is
    uniform in ``[0, 1)``."""
    unit = min(max(unit, 0.0), 1.0)
    return v - v / 4 + (v / 2) * unit


def next_sleep(
    base: float,
    attempt: int,
    max_wait: float,
    elapsed: float,
    unit: float,
    retry_after: Optional[float] = None,
) -> Optional[float]:
    """Seconds to sleep after the ``attempt``-th rejection (1-based), or None
    when the wait has run out and the last rejection should be returned."""
    left = max_wait - elapsed
    if left <= 0:
        return None
    if retry_after is not None:
        step = max(retry_after, _MIN_STEP) * (1.0 + min(max(unit, 0.0), 1.0) / 4)
    else:
        step = jitter(base * 2.0 ** min(attempt, 60), unit)
    return min(left, step)
