"""Paper Figure 6: process #1 holds copies, stages some for process #2
(connected to another Charon server sharing the same store), which seizes
them. The transfer id goes over a pipe, the paper's send()/recv(). With
``examples/limits.yaml``, tenant-7 may hold 10 sandbox VMs: process #1
holds 10 and hands 6 over (the paper's 15 and 10).

    charon serve --config examples/limits.yaml --store redis://127.0.0.1:6379 &
    charon serve --config examples/limits.yaml --store redis://127.0.0.1:6379 \
        --listen 127.0.0.1:7072 --http-listen 127.0.0.1:7073 &
    CHARON_TARGET=127.0.0.1:7070 CHARON_TARGET_2=127.0.0.1:7072 python fig6_transfer.py
"""

import multiprocessing
import os
from multiprocessing.connection import Connection

from charon_client import Client

r, d = "sandbox/vm", "tenant-7"


def process_1(conn: Connection) -> None:
    client = Client(os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
    with client.hold_copy(r, d, copies=10) as res:
        if res.success:
            print("process 1 has", res.copies)  # has 10 copies
            tid = res.transfer(6, ttl=30)  # stage 6 copies
            conn.send(tid)  # (to process #2)
            print("process 1 has", res.copies)  # has 4 copies
            assert res.copies == 4
            conn.recv()  # until process #2 is done


def process_2(conn: Connection) -> None:
    target = os.environ.get("CHARON_TARGET_2", os.environ.get("CHARON_TARGET", "127.0.0.1:7070"))
    client = Client(target)
    tid = conn.recv()  # (from process #1)
    with client.seize_copy(tid) as res:
        if res.success:
            print("process 2 has", res.copies)  # has 6 copies
            assert res.copies == 6
            res.release(3)  # release 3 copies
            print("process 2 has", res.copies)  # has 3 copies
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
