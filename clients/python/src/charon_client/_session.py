"""One ``Session`` stream on the sync gRPC API, pipelined: any number of
threads send operations at once, each reply matched to its caller by id.

gRPC reads the request iterator on a thread of its own; a reader thread
takes replies off the stream and completes the waiting futures. When the
stream breaks, every waiting operation fails as a server error and the
client opens a new session on its next operation (the server released
this one's holds when it ended)."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import queue
import threading
from typing import Iterator, Optional

import grpc

from ._classify import from_rpc_error
from ._common import release_of_late_grant
from ._pb import limiter_pb2 as pb
from ._pb import limiter_pb2_grpc as pb_grpc
from ._transport import Transport
from .errors import CharonError, ServerError

log = logging.getLogger("charon_client")

# Abandoned operations remembered at most: a server that never answers
# again must not make the client grow without bound.
_MAX_ABANDONED = 4096

_Future = concurrent.futures.Future


class Session:
    def __init__(self, stub: pb_grpc.LimiterStub, generation: int, transport: Transport) -> None:
        self.generation = generation
        self._transport = transport
        # Why the stream ended, once it has: what a call made after that
        # raises (the server's refusal of the session, say).
        self._error: Optional[CharonError] = None
        self._queue: queue.SimpleQueue[Optional[pb.SessionRequest]] = queue.SimpleQueue()
        self._pending: dict[int, _Future[pb.SessionReply]] = {}
        # Operations whose caller gave up waiting: a late grant is released.
        self._abandoned: dict[int, pb.SessionRequest] = {}
        self._lock = threading.Lock()
        self._closed = False
        # next() on a count is atomic: ids are taken without the lock (see
        # send_detached).
        self._ids = itertools.count(1)
        self._call = stub.Session(self._requests(), metadata=transport.metadata())
        self._reader = threading.Thread(
            target=self._read, name=f"charon-session-{generation}", daemon=True
        )
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def _requests(self) -> Iterator[pb.SessionRequest]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        error: CharonError = ServerError(
            f"{self._transport.address} ended the session", address=self._transport.address
        )
        try:
            for reply in self._call:
                with self._lock:
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
        if release is None:
            return
        log.debug("releasing a late grant of %d %s", release.copies, release.resource)
        with self._lock:
            if self._closed:
                return  # the server released it with the session
            self._queue.put(pb.SessionRequest(id=next(self._ids), release=release))

    def _fail_all(self, error: CharonError) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            self._abandoned.clear()
        self._queue.put(None)
        for future in pending:
            if not future.done():
                future.set_exception(error)

    def call(self, request: pb.SessionRequest, timeout: float) -> pb.SessionReply:
        """Sends ``request`` (its id is set here) and waits for its reply."""
        future: _Future[pb.SessionReply] = _Future()
        with self._lock:
            if self._closed:
                raise self.error
            request.id = next(self._ids)
            self._pending[request.id] = future
            self._queue.put(request)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
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
        """Queues a release without waiting for its reply and without taking
        a lock: safe from ``__del__`` (``SimpleQueue.put`` is reentrant).
        Its reply, with an id no one waits for, is dropped."""
        if not self._closed:
            self._queue.put(pb.SessionRequest(id=next(self._ids), release=release))

    def close(self) -> None:
        """Ends the stream; the server releases every hold made on it."""
        self._fail_all(ServerError("the client was closed", kind="unavailable"))
        self._call.cancel()
