"""Capacity leases (SPEC §12, paper §5.1): a share of a resource's capacity
held for a block and spent locally, one unit at a time at the leased rate;
given back on leaving the block. The resource is `kind: lease`, in
``examples/limits.yaml``:

    - { name: db/qps, kind: lease, capacity: 60, algorithm: fair_share,
        lease_length: 2s, refresh_interval: 200ms, learning_mode: 0s,
        safe_capacity: 10 }

    charon serve --config examples/limits.yaml &
    CHARON_TARGET=127.0.0.1:7070 python lease.py
"""

import os
import time

from charon_client import Client

client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))


def query_the_database(i: int) -> None:
    print(f"query {i}")


with client.lease("db/qps", wants=20, mode="safe") as lease:
    print(lease.status())  # capacity=20.0, source=server, ...
    started = time.monotonic()
    for i in range(10):
        lease.acquire()  # at most 20 a second: one unit every 50 ms
        query_the_database(i)
    elapsed = time.monotonic() - started
    print(f"10 queries in {elapsed:.2f} s at {lease.capacity:g} a second")
# the lease is given back here

assert elapsed >= 9 / 20, elapsed
client.close()
