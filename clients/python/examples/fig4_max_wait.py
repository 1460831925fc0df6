"""Paper Figure 4: a rate-limited request that blocks for at most 5 s.

CHARON_TARGET=127.0.0.1:7070 python fig4_max_wait.py
"""

import os

from charon_client import Client


class OverLimitError(Exception):
    pass


def handle_api_call() -> None:
    print("api call")


client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
r, d = "api/search", "tenant-42"

# (blocks for at most 5 seconds)
res = client.request_rate(r, d, max_wait=5)
if res.success:
    handle_api_call()
else:
    raise OverLimitError()
