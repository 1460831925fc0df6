"""Paper Figure 4: a rate-limited request that blocks for at most 5 s.

A login attempt on ``api/login`` of ``examples/limits.yaml``: five a
second; a burst lands in a prison tier that allows one login in 15 s, so a
user who hammers it waits, then gives up.

    charon serve --config examples/limits.yaml &
    CHARON_TARGET=127.0.0.1:7070 python fig4_max_wait.py
"""

import os

from charon_client import Client


class OverLimitError(Exception):
    pass


def handle_api_call() -> None:
    print("api call")


client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
r, d = "api/login", "user-42"

# (blocks for at most 5 seconds)
res = client.request_rate(r, d, max_wait=5)
if res.success:
    handle_api_call()
else:
    raise OverLimitError()
