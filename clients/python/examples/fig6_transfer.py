"""Paper Figure 6: process #1 holds 15 copies, stages 10 for process #2
(connected to another Charon server sharing the same store), which seizes
them. The transfer id goes over a pipe, the paper's send()/recv().

    CHARON_TARGET=127.0.0.1:7070 CHARON_TARGET_2=127.0.0.1:7072 python fig6_transfer.py
"""

import multiprocessing
import os
from multiprocessing.connection import Connection

from charon_client import Client

r, d = "sandbox/vm", "tenant-9"


def process_1(conn: Connection) -> None:
    client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
    with client.hold_copy(r, d, copies=15) as res:
        if res.success:
            print("process 1 has", res.copies)  # has 15 copies
            tid = res.transfer(10, ttl=30)  # stage 10 copies
            conn.send(tid)  # (to process #2)
            print("process 1 has", res.copies)  # has 5 copies
            assert res.copies == 5
            conn.recv()  # until process #2 is done


def process_2(conn: Connection) -> None:
    target = os.environ.get("CHARON_TARGET_2", os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
    client = Client(target)
    tid = conn.recv()  # (from process #1)
    with client.seize_copy(tid) as res:
        if res.success:
            print("process 2 has", res.copies)  # has 10 copies
            assert res.copies == 10
            res.release(5)  # release 5 copies
            print("process 2 has", res.copies)  # has 5 copies
    conn.send("done")


if __name__ == "__main__":
    a, b = multiprocessing.Pipe()
    procs = [
        multiprocessing.Process(target=process_1, args=(a,)),
        multiprocessing.Process(target=process_2, args=(b,)),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
