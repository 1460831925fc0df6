"""One ``Session`` stream on ``grpc.aio``, pipelined: any number of tasks
send operations at once, each reply matched to its caller by id. The
asyncio twin of ``_session``: a reader task completes the waiting futures,
and a broken stream fails them all as server errors."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, AsyncIterator, Optional

import grpc

from ._common import from_rpc_error
from ._pb import limiter_pb2 as pb
from .errors import CharonError, ServerError

if TYPE_CHECKING:
    from ._pb.limiter_pb2_grpc import LimiterAsyncStub

log = logging.getLogger("charon_client")


class AioSession:
    def __init__(self, stub: LimiterAsyncStub, generation: int) -> None:
        self.generation = generation
        self._queue: asyncio.Queue[Optional[pb.SessionRequest]] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[pb.SessionReply]] = {}
        self._closed = False
        self._next_id = 0
        self._call = stub.Session(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def closed(self) -> bool:
        return self._closed

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def _read(self) -> None:
        error: CharonError = ServerError("the session ended")
        try:
            async for reply in self._call:
                future = self._pending.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if not isinstance(error, ServerError):
                error = ServerError(f"the session ended: {error}")
        except asyncio.CancelledError:
            error = ServerError("the client was closed")
        except Exception as e:  # noqa: BLE001 - any failure ends the session, never silently
            error = ServerError(f"the session ended: {e!r}")
        log.debug("session %d ended: %s", self.generation, error)
        self._fail_all(error)

    def _fail_all(self, error: CharonError) -> None:
        self._closed = True
        pending = list(self._pending.values())
        self._pending.clear()
        self._queue.put_nowait(None)
        for future in pending:
            if not future.done():
                future.set_exception(error)

    async def call(self, request: pb.SessionRequest, timeout: float) -> pb.SessionReply:
        """Sends ``request`` (its id is set here) and waits for its reply."""
        if self._closed:
            raise ServerError("the session ended")
        self._next_id += 1
        request.id = self._next_id
        future: asyncio.Future[pb.SessionReply] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        self._queue.put_nowait(request)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            self._pending.pop(request.id, None)
            raise ServerError(f"no answer within {timeout} s") from None

    async def close(self) -> None:
        """Ends the stream; the server releases every hold made on it."""
        self._fail_all(ServerError("the client was closed"))
        self._call.cancel()
        self._reader.cancel()
        try:
            await self._reader
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
            pass
