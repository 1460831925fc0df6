"""Both shells of the client through one interface, so that one test
exercises the sync ``Client`` and ``aio.Client`` alike (their rules are
one source, ``charon_client._core``; this checks each shell carries them
out the same way).

``AioAsSync`` runs an ``aio.Client`` on an event loop of its own thread
and shows it as a sync client: each coroutine method is awaited there
(``run_coroutine_threadsafe``, so any thread may call it), ``with`` on a
hold, a multi-grant or a lease is ``async with`` there, and the results
that are asyncio objects are wrapped in turn."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Callable, Coroutine, Iterator, TypeVar

from charon_client import Client, aio

_T = TypeVar("_T")


class Loop:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def _wrap(value: Any, loop: Loop) -> Any:
    if isinstance(value, (aio.Client, aio.Hold, aio.MultiGrant, aio.Lease)):
        return AioAsSync(value, loop)
    if isinstance(value, list):
        return [_wrap(v, loop) for v in value]
    return value


class AioAsSync:
    """An asyncio object shown as its sync twin."""

    def __init__(self, target: Any, loop: Loop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):

            def call(*args: Any, **kw: Any) -> Any:
                return _wrap(self._loop.run(value(*args, **kw)), self._loop)

            return call
        return _wrap(value, self._loop)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __enter__(self) -> AioAsSync:
        self._loop.run(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(self._target.__aexit__(*exc))

    def __repr__(self) -> str:
        return repr(self._target)


MakeClient = Callable[..., Client]


def shell(name: str) -> Iterator[MakeClient]:
    """A maker of clients of one shell (``Client(target, **options)``);
    the asyncio clients are closed and their loop stopped at the end."""
    if name == "sync":
        yield Client
        return
    loop = Loop()
    made: list[aio.Client] = []

    async def new(target: str, **kw: Any) -> aio.Client:
        client = aio.Client(target, **kw)
        made.append(client)
        return client

    def make(target: str, **kw: Any) -> Any:
        return AioAsSync(loop.run(new(target, **kw)), loop)

    try:
        yield make
    finally:
        for client in made:
            try:
                loop.run(client.close())
            except Exception:  # noqa: BLE001, S110 - a test may have killed its server
                pass
        loop.stop()
