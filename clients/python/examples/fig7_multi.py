"""Paper Figure 7: copies of a copy-limited resource and hits of a
rate-limited one, pseudo-atomically (by hand, as in the paper, then with
the client's helper ``Client.multi``). ``db/conn`` (8 per tenant), ``gpu``
(3) and ``api/render`` (2 a minute) of ``examples/limits.yaml``.

    charon serve --config examples/limits.yaml &
    CHARON_TARGET=127.0.0.1:7070 python fig7_multi.py
"""

import os

from charon_client import Client

client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
r_c, r_r, d = "db/conn", "api/render", "tenant-3"
n, max_wait = 8, 1.0


def process(copies: int) -> None:
    print("processing", copies)


with client.hold_copy(r_c, d, copies=n, max_wait=max_wait) as res_c:
    if res_c.success:
        n = res_c.copies  # Only request as many copies as we've been given
        max_wait = max_wait - res_c.waited  # Only count time we already waited once in total
        res_r = client.request_rate(r_r, d, copies=n, max_wait=max_wait)
        if res_r.success:
            extra = res_c.copies - res_r.copies
            if extra > 0:
                res_c.release(extra)  # release extra copies
            process(res_r.copies)  # process remaining copies
            assert res_c.copies == res_r.copies == 2

# The helper does the same for any number of copy resources and one rate
# resource (requested last: hits cannot be given back).
with client.multi(d, ["db/conn", "gpu"], "api/render", min_copies=1, max_copies=8) as grant:
    # api/render's 2 hits in its minute are spent: nothing is granted, and
    # the connections and GPUs reserved on the way were given back.
    assert not grant.success and grant.holds == []
with client.multi("tenant-4", ["db/conn", "gpu"], "api/render", max_copies=8) as grant:
    assert grant.copies == 2, grant.copies  # 8 connections, then 3 GPUs, then 2 renders
    process(grant.copies)
