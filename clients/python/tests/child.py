"""A second process for the tests, speaking on stdout, one line per step.

child.py hold TARGET RESOURCE DOMAIN COPIES   # holds, prints "held N", waits to be killed
child.py seize TARGET TRANSFER_ID             # seizes, prints "seized N", releases 5,
                                              # prints "has N", leaves the block on a stdin line
"""

from __future__ import annotations

import sys

from charon_client import Client


def main() -> None:
    mode, target = sys.argv[1], sys.argv[2]
    client = Client(target)
    if mode == "hold":
        resource, domain, copies = sys.argv[3], sys.argv[4], int(sys.argv[5])
        hold = client.hold_copy(resource, domain, copies=copies)
        print(f"held {hold.copies}", flush=True)
        sys.stdin.readline()  # killed (SIGKILL) before this returns
    elif mode == "seize":
        with client.seize_copy(sys.argv[3]) as res:
            print(f"seized {res.copies}", flush=True)
            res.release(5)
            print(f"has {res.copies}", flush=True)
            sys.stdin.readline()
        print("released", flush=True)
    client.close()


if __name__ == "__main__":
    main()
