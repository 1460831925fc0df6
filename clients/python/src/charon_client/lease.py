"""Capacity leases on the sync client (paper §5.1, Doorman):
instead of asking before every access, the client holds a share of a
resource's capacity and limits itself locally::

    with client.lease("db/qps", wants=100) as lease:
        while True:
            lease.acquire()  # at the leased rate, one unit at a time
            query_the_database()

- The **top half** is what the application calls: ``acquire()`` blocks
  until the local rate allows one more unit (units leave evenly at the
  leased capacity per second; an idle lease saves up no burst),
  ``try_acquire()`` answers at once. Any number of threads may call them.
- The **bottom half** is a daemon thread that refreshes the lease every
  refresh interval the server gave, saying what it holds and asking for
  ``wants`` (with ``adaptive``, what was used, up to ``wants``).
- When no server answers, the lease in hand is used until it expires; then
  the mode applies: ``safe`` (the safe capacity the server last gave),
  ``optimistic`` (``wants``) or ``pessimistic`` (nothing).

Leaving the ``with`` block, ``release()`` or closing the client gives the
lease back; a ``Lease`` merely dropped is given back by its thread.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Optional

import grpc

from ._classify import from_rpc_error
from ._lease import LeaseCore, first_lease, released_of
from ._pb import capacity_pb2 as cpb
from ._pb import capacity_pb2_grpc as cpb_grpc
from .errors import CharonError, ServerError
from .results import LeaseStatus

__all__ = ["Lease"]

log = logging.getLogger("charon_client")


def refresh(
    core: LeaseCore, stub: cpb_grpc.CapacityStub, timeout: float, wants: float
) -> Optional[CharonError]:
    """One ``GetCapacity`` asking for ``wants``; the state is updated and
    the failure, if any, returned (never raised)."""
    outcome: cpb.Lease | CharonError
    try:
        outcome = first_lease(
            stub.GetCapacity(
                core.request(wants), timeout=timeout, metadata=core.transport.metadata()
            )
        )
    except grpc.RpcError as e:
        outcome = from_rpc_error(e, core.transport)
    except CharonError as e:
        outcome = e
    except Exception as e:  # noqa: BLE001 - a closed channel, anything: a failed refresh
        outcome = ServerError(f"the refresh failed: {e!r}")
    core.apply(wants, outcome)
    if isinstance(outcome, CharonError):
        log.debug("refresh of the lease on %s failed: %s", core.resource, outcome)
        return outcome
    return None


def give_back(core: LeaseCore, stub: cpb_grpc.CapacityStub, timeout: float) -> bool:
    """``ReleaseCapacity``: whether a lease (not lapsed) was held."""
    try:
        return released_of(
            stub.ReleaseCapacity(
                core.release_request(), timeout=timeout, metadata=core.transport.metadata()
            )
        )
    except grpc.RpcError as e:
        raise from_rpc_error(e, core.transport) from None
    except ValueError as e:  # the channel was closed
        raise ServerError(f"the release failed: {e}") from None


def _refresh_loop(
    core: LeaseCore, stub: cpb_grpc.CapacityStub, timeout: float, stop: threading.Event
) -> None:
    """The bottom half: refreshes every refresh interval until stopped.
    Holds no reference to the ``Lease``, so that a dropped one is
    collected; then it gives the lease back itself."""
    try:
        while not stop.wait(core.refresh_interval()):
            refresh(core, stub, timeout, core.next_wants())
        if core.release_on_stop and core.mark_released():
            give_back(core, stub, timeout)
    except Exception as e:  # noqa: BLE001 - the lease then lapses at its expiry
        log.debug("the refresher of the lease on %s ended: %r", core.resource, e)


class Lease:
    """A capacity lease held by this process (see the module's text). Made
    by ``Client.lease``; a context manager that gives the lease back on
    leaving the block, also on an exception."""

    def __init__(self, core: LeaseCore, stub: cpb_grpc.CapacityStub, timeout: float) -> None:
        self._core = core
        self._stub = stub
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_refresh_loop,
            args=(core, stub, timeout, self._stop),
            name=f"charon-lease-{core.resource}",
            daemon=True,
        )
        self._thread.start()

    @property
    def resource(self) -> str:
        return self._core.resource

    @property
    def client_id(self) -> str:
        """Who holds the lease, as the server knows it."""
        return self._core.client_id

    @property
    def wants(self) -> float:
        """The configured wants (with ``adaptive``, the most asked for)."""
        return self._core.wants

    @property
    def mode(self) -> str:
        """``safe``, ``optimistic`` or ``pessimistic``."""
        return self._core.mode

    @property
    def adaptive(self) -> bool:
        return self._core.adaptive

    @property
    def capacity(self) -> float:
        """The capacity in force now (units per second)."""
        return self._core.capacity()

    @property
    def last_error(self) -> Optional[CharonError]:
        """Why the last refresh failed, if it did."""
        return self._core.last_error()

    def status(self) -> LeaseStatus:
        """The lease as it stands: capacity, source, wants, safe capacity,
        expiry, refreshes and failures."""
        return self._core.status()

    def acquire(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the local rate allows one more unit and takes it
        (True); False if ``timeout`` seconds passed first (a capacity of 0
        waits for a refresh, or for the lease's expiry to bring the mode's
        capacity). Raises ``ClientError`` once the lease is released."""
        core = self._core
        deadline = None if timeout is None else time.monotonic() + timeout
        with core.cond:
            core.count_demand_locked()
            while True:
                now = time.monotonic()
                wait = core.take_locked(now)
                if wait is None:
                    return True
                if deadline is not None:
                    if deadline <= now:
                        return False
                    wait = min(wait, deadline - now)
                core.cond.wait(None if wait == float("inf") else wait)

    def try_acquire(self) -> bool:
        """Takes one unit if the local rate allows it now."""
        return self._core.try_take()

    def changed(self, timeout: Optional[float] = None) -> bool:
        """Blocks until a refresh answers or fails, or the lease is
        released (True), or ``timeout`` seconds pass (False)."""
        core = self._core
        with core.cond:
            seen = core.version
            return core.cond.wait_for(lambda: core.version != seen, timeout)

    def release(self) -> bool:
        """Stops refreshing and gives the lease back now; whether the server
        held one (not lapsed). Raises ``ServerError`` if the server could
        not be told (the lease then lapses at its expiry); a second call
        does nothing (False)."""
        if not self._core.mark_released():
            return False
        self._stop.set()
        if threading.current_thread() is not self._thread:
            # A refresh in flight must not reach the server after the release.
            self._thread.join(self._timeout + 1.0)
        return give_back(self._core, self._stub, self._timeout)

    @property
    def released(self) -> bool:
        return self._core.released

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except Exception as e:  # noqa: BLE001 - never mask the block's own exception
            log.warning(
                "release of the lease on %s on leaving the block failed (%s); "
                "it lapses at its expiry",
                self.resource,
                e,
            )

    def __del__(self) -> None:
        # Dropped without a release: the refresher gives the lease back as
        # it stops (no call here; this may run in the middle of any code).
        try:
            if not self._core.released:
                self._core.release_on_stop = True
                self._stop.set()
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __repr__(self) -> str:
        s = self.status()
        return (
            f"Lease({self.resource!r}, client_id={self.client_id!r}, capacity={s.capacity}, "
            f"source={s.source.value}, wants={s.wants})"
        )
