"""charon_client: the Python client of Charon, the limiting service.

The paper's reference client (§3.2, §3.3, §4.3) for today's Python, sync
(``Client``) and asyncio (``charon_client.aio.Client``)::

    from charon_client import Client

    client = Client("127.0.0.1:7070")
    res = client.request_rate("api/search", "tenant-42", max_wait=5)
    if res.success:
        ...
    with client.hold_copy("sandbox/vm", "tenant-7", copies=15) as vms:
        if vms.success:
            tid = vms.transfer(10, ttl=30)  # another process seizes it
    with client.lease("db/qps", wants=100) as lease:  # a capacity lease
        lease.acquire()  # at the leased rate, one unit at a time

A rejection is a result (``success`` is False), never an exception; the
two exception classes are ``ClientError`` (the request or the client's
settings are wrong: never degraded) and ``ServerError`` (the server failed
and degraded mode could not help), each with a ``kind`` (``KINDS``), the
gRPC ``code`` and the ``address``. A secured server takes
``Client(target, token=..., ca=..., cert=..., key=..., server_name=...)``.
"""

from ._version import __version__
from .client import Client, Hold, MultiGrant
from .errors import KINDS, CharonError, ClientError, ServerError
from .lease import Lease
from .results import LeaseSource, LeaseStatus, RateGrant, Source, Stats

__all__ = [
    "KINDS",
    "CharonError",
    "Client",
    "ClientError",
    "Hold",
    "Lease",
    "LeaseSource",
    "LeaseStatus",
    "MultiGrant",
    "RateGrant",
    "ServerError",
    "Source",
    "Stats",
    "__version__",
]
