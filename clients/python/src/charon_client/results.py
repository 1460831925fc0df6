"""What calls return: grants (a rejection is one, with ``granted == 0``),
the state of a capacity lease and the client's counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from ._pb import limiter_pb2 as pb

__all__ = ["LeaseSource", "LeaseStatus", "RateGrant", "Source", "Stats"]


class Source(enum.Enum):
    """Who decided a grant: the server, or the client alone (paper §4.3)."""

    SERVER = "server"
    """The server decided."""
    DEGRADED = "degraded"
    """The server could not be reached or answered a server error; the client
    granted ``min_copies`` on its own so that Charon is never a single point
    of failure."""
    KILL_SWITCH = "kill_switch"
    """The server rejected and the kill switch turned the rejection into a
    grant of ``min_copies``."""


@dataclass(frozen=True)
class RateGrant:
    """The answer to ``request_rate``: ``granted`` hits (0: rejected)."""

    granted: int
    source: Source
    reply: Optional[pb.RateReply]
    """The server's last reply (its full context), if there was one."""
    waited: float
    """Seconds spent waiting for the grant, back-off included."""

    @property
    def success(self) -> bool:
        """Whether anything was granted (the paper's ``res.success``)."""
        return self.granted > 0

    @property
    def copies(self) -> int:
        """The paper's name for ``granted`` (Figure 7)."""
        return self.granted

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until a request for ``min_copies`` would be granted if
        nothing else arrived: 0 if now, None if never or not said."""
        if self.reply is None or not self.reply.HasField("retry_after_ms"):
            return None
        return self.reply.retry_after_ms / 1000.0

    @property
    def delay(self) -> float:
        """A queue's throttle: seconds to wait before proceeding
        with what was granted; 0 for other kinds."""
        if self.reply is None or not self.reply.HasField("delay_ms"):
            return 0.0
        return self.reply.delay_ms / 1000.0

    @property
    def degraded(self) -> bool:
        """Whether the client granted without the server."""
        return self.source is Source.DEGRADED


@dataclass(frozen=True)
class Stats:
    """What a client has seen, for the application's own metrics."""

    requests: int = 0
    """Rate requests made (each call, not each retry)."""
    reserves: int = 0
    """Reserves made (each call, not each retry)."""
    rejections: int = 0
    """Calls that ended rejected."""
    degraded_grants: int = 0
    """Grants made by the client alone because the server could not answer."""
    kill_switch_grants: int = 0
    """Rejections the kill switch turned into grants."""
    server_errors: int = 0
    """Server errors and unreachable servers seen."""


class LeaseSource(enum.Enum):
    """Where the capacity in force of a lease comes from."""

    SERVER = "server"
    """A lease from the server, not expired."""
    OPTIMISTIC = "optimistic"
    """No lease in force and no server: mode ``optimistic`` (what it wants)."""
    PESSIMISTIC = "pessimistic"
    """No lease in force and no server: mode ``pessimistic`` (nothing)."""
    SAFE = "safe"
    """No lease in force and no server: mode ``safe`` (the safe capacity the
    server last gave; nothing if it never answered)."""
    RELEASED = "released"
    """The lease was given back (``release()`` or the end of its block):
    nothing."""


@dataclass(frozen=True)
class LeaseStatus:
    """A capacity lease as it stands, for the application's display or
    metrics (the fields of ``charon client lease``)."""

    capacity: float
    """The capacity in force (units per second)."""
    source: LeaseSource
    """Where it comes from."""
    wants: float
    """What the last refresh asked for."""
    safe_capacity: float
    """The server's safe capacity, as last given (0 before any answer)."""
    expires_in_ms: int
    """How long the server's lease still holds (0 if none or expired)."""
    refreshes: int
    """Refreshes the server answered (the first ask included)."""
    failures: int
    """Refreshes that failed (server errors, no answer, unreachable server)."""
