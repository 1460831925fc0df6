"""What the sync and asyncio capacity leases share (paper §5.1,
Doorman's client): argument checks, the wire messages, and the lease's
state behind one lock — the capacity in force, the local pacing of units
(the top half) and what each refresh (the bottom half) asks and learns.

The same rules as the Rust client's ``crates/client/src/lease.rs``:

- units leave evenly, one every ``1 / capacity`` seconds, and an idle lease
  does not save up a burst;
- a refresh asks for ``wants`` (adaptive: what was used since the last
  refresh, per second, plus a fifth, at most ``wants``) saying what it
  ``has`` (the lease in force, else 0);
- the lease in hand is used until it expires; then, with no server
  answering, the mode applies: optimistic (``wants``), pessimistic (0) or
  safe (the safe capacity the server last gave; 0 if it never answered).
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
import unicodedata
from typing import Literal, Optional, Tuple

from ._pb import capacity_pb2 as cpb
from ._transport import Transport
from .errors import CharonError, ClientError, ServerError
from .results import LeaseSource, LeaseStatus

LeaseMode = Literal["safe", "optimistic", "pessimistic"]
"""What a lease does once it has expired and no server answers."""

MODES: Tuple[str, ...] = ("safe", "optimistic", "pessimistic")

# Before the server said how often to refresh: as the Rust client (and a
# leaf server asking its parent), every second.
FIRST_REFRESH_INTERVAL = 1.0
# A server's expiry is not trusted to fit this clock: far is a year.
_FAR = 365 * 86_400.0

_ids = itertools.count(1)


def default_client_id() -> str:
    """``<host>-<pid>-<n>``: one per lease made in this process, so that two
    leases on one resource in one process are two clients to the server
    (sharing an id, they would be one lease that both believe they hold)."""
    return f"{socket.gethostname()}-{os.getpid()}-{next(_ids)}"


def _check_name(field: str, name: str) -> None:
    """The server's rule for names (``check_name``), checked before anything
    is sent so that an unreachable server never starts a lease it would
    refuse."""
    if not isinstance(name, str) or not name:
        raise ClientError(f"{field} must be a non-empty string (got {name!r})")
    if len(name.encode()) > 1024:
        raise ClientError(f"{field} is {len(name.encode())} bytes long; at most 1024 are allowed")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise ClientError(f"{field} must not contain control characters")


def check_args(
    resource: str, wants: float, client_id: Optional[str], mode: str
) -> Tuple[float, str]:
    """``wants`` as a float and the client id to use; a ``ClientError`` for
    what the server would refuse (NaN, infinite or negative wants, bad
    names) or an unknown mode."""
    _check_name("resource", resource)
    try:
        value = float(wants)
    except (TypeError, ValueError):
        raise ClientError(f"wants must be a number (got {wants!r})") from None
    if not math.isfinite(value) or value < 0:
        raise ClientError(f"wants must be a finite number at least 0 (got {wants!r})")
    if mode not in MODES:
        raise ClientError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    cid = default_client_id() if client_id is None else client_id
    _check_name("client_id", cid)
    return value, cid


def first_lease(reply: cpb.GetCapacityReply) -> cpb.Lease:
    if not reply.leases:
        raise ServerError("a GetCapacity reply without a lease", kind="internal")
    return reply.leases[0]


def _number(value: float) -> float:
    """A server's number as a capacity: NaN or below zero is nothing."""
    return 0.0 if math.isnan(value) else max(value, 0.0)


class LeaseCore:
    """One lease's state. Every field is read and written under ``lock``;
    ``cond`` (on that lock) is notified whenever the capacity in force may
    have changed (a refresh answered or failed, the lease released)."""

    def __init__(
        self,
        resource: str,
        client_id: str,
        wants: float,
        mode: str,
        adaptive: bool,
        transport: Transport,
    ) -> None:
        self.resource = resource
        self.transport = transport
        """The client's server, token and TLS: for the calls and their errors."""
        self.client_id = client_id
        self.wants = wants
        self.mode = mode
        self.adaptive = adaptive
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        # The server's lease: its capacity and when it lapses (monotonic).
        self._lease: Optional[Tuple[float, float]] = None
        self._safe_capacity = 0.0
        self._refresh_interval = FIRST_REFRESH_INTERVAL
        self._asked = wants
        # When the last unit left (GCRA with no burst: the next one may go
        # 1 / capacity seconds later, at the capacity in force then).
        self._last_unit: Optional[float] = None
        self._demand = 0
        self._last_ask = time.monotonic()
        self._refreshes = 0
        self._failures = 0
        self._last_error: Optional[CharonError] = None
        self.version = 0
        self.released = False
        # Set when the lease was dropped without a release: the refresher
        # gives it back as it stops.
        self.release_on_stop = False

    # -- under the lock ------------------------------------------------------

    def _in_force(self, now: float) -> Tuple[float, LeaseSource]:
        if self.released:
            return 0.0, LeaseSource.RELEASED
        if self._lease is not None and now < self._lease[1]:
            return self._lease[0], LeaseSource.SERVER
        if self.mode == "optimistic":
            return self.wants, LeaseSource.OPTIMISTIC
        if self.mode == "pessimistic":
            return 0.0, LeaseSource.PESSIMISTIC
        return self._safe_capacity, LeaseSource.SAFE

    def take_locked(self, now: float) -> Optional[float]:
        """Takes one unit if the local rate allows it now (None); else the
        seconds to wait before looking again (``math.inf``: until a change).
        The caller holds the lock and counted the demand."""
        if self.released:
            raise ClientError(f"the lease on {self.resource} was released")
        capacity, source = self._in_force(now)
        # The capacity changes when the server's lease expires (the mode
        # applies then): look again at that moment at the latest.
        expiry = math.inf
        if source is LeaseSource.SERVER and self._lease is not None:
            expiry = self._lease[1] - now
        if not capacity > 0:
            return expiry
        if self._last_unit is not None:
            next_unit = self._last_unit + 1.0 / capacity
            if next_unit > now:
                return min(next_unit - now, expiry)
        self._last_unit = now
        return None

    def count_demand_locked(self) -> None:
        self._demand += 1

    def _changed_locked(self) -> None:
        self.version += 1
        self.cond.notify_all()

    # -- taking the lock -----------------------------------------------------

    def try_take(self) -> bool:
        with self.lock:
            self._demand += 1
            return self.take_locked(time.monotonic()) is None

    def capacity(self) -> float:
        with self.lock:
            return self._in_force(time.monotonic())[0]

    def refresh_interval(self) -> float:
        with self.lock:
            return self._refresh_interval

    def last_error(self) -> Optional[CharonError]:
        with self.lock:
            return self._last_error

    def status(self) -> LeaseStatus:
        now = time.monotonic()
        with self.lock:
            capacity, source = self._in_force(now)
            left = 0.0
            if self._lease is not None and not self.released:
                left = max(self._lease[1] - now, 0.0)
            return LeaseStatus(
                capacity=capacity,
                source=source,
                wants=self._asked,
                safe_capacity=self._safe_capacity,
                expires_in_ms=int(left * 1000),
                refreshes=self._refreshes,
                failures=self._failures,
            )

    def next_wants(self) -> float:
        """What the next refresh asks for: ``wants``, or with ``adaptive``
        what was used since the last refresh (units acquired or waited for,
        per second, plus a fifth for growth), at most ``wants``."""
        now = time.monotonic()
        with self.lock:
            if not self.adaptive:
                return self.wants
            used, self._demand = self._demand, 0
            seconds = max(now - self._last_ask, 0.001)
            self._last_ask = now
            return min(used / seconds * 1.2, self.wants)

    def request(self, wants: float) -> cpb.GetCapacityRequest:
        """The refresh asking for ``wants``, saying what is held now."""
        with self.lock:
            has = 0.0
            if self._lease is not None and time.monotonic() < self._lease[1]:
                has = self._lease[0]
        return cpb.GetCapacityRequest(
            client_id=self.client_id,
            resources=[cpb.ResourceWant(resource=self.resource, wants=wants, has=has)],
        )

    def release_request(self) -> cpb.ReleaseCapacityRequest:
        return cpb.ReleaseCapacityRequest(client_id=self.client_id, resources=[self.resource])

    def apply(self, wants: float, outcome: cpb.Lease | CharonError) -> None:
        """What a refresh asking for ``wants`` got: a lease, or an error
        (kept; the lease in hand, then the mode, apply meanwhile)."""
        with self.lock:
            self._asked = wants
            if isinstance(outcome, CharonError):
                self._failures += 1
                self._last_error = outcome
            else:
                # The server's expiry is Unix time on its store's clock; the
                # wall clock is the only time the two share (skew shortens
                # or lengthens the lease by as much).
                left = outcome.expires_at_ms / 1000.0 - time.time()
                until = time.monotonic() + min(max(left, 0.0), _FAR)
                self._lease = (_number(outcome.capacity), until)
                self._safe_capacity = _number(outcome.safe_capacity)
                self._refresh_interval = max(outcome.refresh_interval_ms, 1) / 1000.0
                self._refreshes += 1
                self._last_error = None
            self._changed_locked()

    def mark_released(self) -> bool:
        """Marks the lease given back (waiters wake and raise); False if it
        already was."""
        with self.lock:
            if self.released:
                return False
            self.released = True
            self._changed_locked()
            return True


def released_of(reply: cpb.ReleaseCapacityReply) -> bool:
    return bool(reply.released[0]) if reply.released else False
