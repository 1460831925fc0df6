"""Paper Figure 5: copies held for a block, released implicitly on leaving
it (also when the block raises). Sandbox VMs of ``examples/limits.yaml``:
tenant-7 may hold 10 at once.

    charon serve --config examples/limits.yaml &
    CHARON_TARGET=127.0.0.1:7070 python fig5_hold.py
"""

import os

from charon_client import Client

client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
r, d = "sandbox/vm", "tenant-7"


def step1() -> None:
    print("step1")


def step2() -> None:
    print("step2")


with client.hold_copy(r, d, copies=3) as res:  # holds 3 copies
    if res.success:
        step1()
        res.release(1)  # release 1 copy; 2 left
        step2()
# the 2 copies still held are released here

# Everything is back: the whole domain limit can be held again.
with client.hold_copy(r, d, copies=10) as res:
    assert res.copies == 10, res
    print("released on leaving the block")
