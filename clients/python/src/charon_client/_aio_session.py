"""One ``Session`` stream on ``grpc.aio``, pipelined: any number of tasks
send operations at once, each reply matched to its caller by id. The
asyncio twin of ``_session``: a reader task completes the waiting futures,
and a broken stream fails them all as server errors."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, AsyncIterator, Optional

import grpc

from ._classify import from_rpc_error
from ._common import release_of_late_grant
from ._pb import limiter_pb2 as pb
from ._transport import Transport
from .errors import CharonError, ServerError

if TYPE_CHECKING:
    from ._pb.limiter_pb2_grpc import LimiterAsyncStub

log = logging.getLogger("charon_client")

# Abandoned operations remembered at most: a server that never answers
# again must not make the client grow without bound.
_MAX_ABANDONED = 4096


class AioSession:
    def __init__(self, stub: LimiterAsyncStub, generation: int, transport: Transport) -> None:
        self.generation = generation
        self._transport = transport
        # Why the stream ended, once it has: what a call made after that
        # raises (the server's refusal of the session, say).
        self._error: Optional[CharonError] = None
        self._queue: asyncio.Queue[Optional[pb.SessionRequest]] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[pb.SessionReply]] = {}
        # Operations whose caller gave up waiting: a late grant is released.
        self._abandoned: dict[int, pb.SessionRequest] = {}
        self._closed = False
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        self._call = stub.Session(self._requests(), metadata=transport.metadata())
        self._reader = self._loop.create_task(self._read())

    @property
    def closed(self) -> bool:
        return self._closed

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        # Nothing is written before the server has answered the stream's
        # headers. A server that refuses the session (no token, a token
        # it does not know) ends the stream at once, and grpc.aio turns a
        # write that races that end into INTERNAL "Internal error from
        # Core", hiding the server's status: a client error would read as
        # a server error, and a lenient client would grant.
        try:
            await self._call.initial_metadata()
        except (grpc.RpcError, asyncio.CancelledError):
            return
        if self._call.done():
            return
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def _read(self) -> None:
        error: CharonError = ServerError(
            f"{self._transport.address} ended the session", address=self._transport.address
        )
        try:
            async for reply in self._call:
                future = self._pending.pop(reply.id, None)
                abandoned = self._abandoned.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)
                elif abandoned is not None:
                    self._release_late(abandoned, reply)
        except grpc.RpcError as e:
            # Of class client only when the server refused a message of
            # this client (never to be turned into a degraded grant).
            error = from_rpc_error(e, self._transport)
        except asyncio.CancelledError:
            error = ServerError("the client was closed")
        except Exception as e:  # noqa: BLE001 - any failure ends the session, never silently
            error = ServerError(f"the session ended: {e!r}", address=self._transport.address)
        log.debug("session %d ended: %s", self.generation, error)
        self._fail_all(error)

    def _abandon(self, request: pb.SessionRequest) -> None:
        """Remembers a reserve or seize given up on (a stalled server may
        answer any of them later), at most ``_MAX_ABANDONED`` of them."""
        if request.WhichOneof("op") not in ("reserve", "seize"):
            return
        if len(self._abandoned) >= _MAX_ABANDONED:
            self._abandoned.pop(next(iter(self._abandoned)))
        self._abandoned[request.id] = request

    def _release_late(self, request: pb.SessionRequest, reply: pb.SessionReply) -> None:
        release = release_of_late_grant(request, reply)
        if release is None or self._closed:
            return
        log.debug("releasing a late grant of %d %s", release.copies, release.resource)
        self._queue.put_nowait(pb.SessionRequest(id=next(self._ids), release=release))

    def _fail_all(self, error: CharonError) -> None:
        if self._error is None:
            self._error = error
        self._closed = True
        pending = list(self._pending.values())
        self._pending.clear()
        self._abandoned.clear()
        self._queue.put_nowait(None)
        for future in pending:
            if not future.done():
                future.set_exception(error)

    async def call(self, request: pb.SessionRequest, timeout: float) -> pb.SessionReply:
        """Sends ``request`` (its id is set here) and waits for its reply."""
        if self._closed:
            raise self.error
        request.id = next(self._ids)
        future: asyncio.Future[pb.SessionReply] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        self._queue.put_nowait(request)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            if self._pending.pop(request.id, None) is not None:
                self._abandon(request)
            raise ServerError(
                f"no answer from {self._transport.address} within {timeout} s",
                kind="timeout",
                address=self._transport.address,
            ) from None

    @property
    def error(self) -> CharonError:
        """Why the session ended (a generic server error while it has not)."""
        return self._error or ServerError(
            f"the session with {self._transport.address} ended", address=self._transport.address
        )

    def send_detached(self, release: pb.ReleaseRequest) -> None:
        """Queues a release without waiting for its reply, from any thread
        (``__del__`` of a hold may run anywhere): handed to the loop."""
        if self._closed:
            return
        request = pb.SessionRequest(id=next(self._ids), release=release)
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, request)
        except RuntimeError:
            pass  # the loop is closed: the session ended with it

    async def close(self) -> None:
        """Ends the stream; the server releases every hold made on it."""
        self._fail_all(ServerError("the client was closed"))
        self._call.cancel()
        self._reader.cancel()
        try:
            await self._reader
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
            pass
