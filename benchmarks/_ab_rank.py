"""One side of :mod:`benchmarks.ab`: blocks of small blocking collectives, timed on rank 0.

Run by ``launch.py`` with ``PYTHONPATH`` set to the checkout under test, so ``import
pycomm`` is that checkout's. Prints ``AB <pycomm file> <block mean in us> ...`` on rank 0.

Argument: a JSON object with ``coll`` (Allreduce, Bcast, Barrier, Allgather, or Latency:
a Send/Recv ping-pong between ranks 0 and 1, half a round trip per call), ``bytes``,
``warmup``, ``iters`` (calls per block) and ``blocks``.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    import pycomm
    comm = pycomm.COMM_WORLD
    count = max(1, spec["bytes"] // 4)
    send = np.ones(count, np.float32)
    recv = np.empty(count * (comm.size if spec["coll"] == "Allgather" else 1), np.float32)
    peer = 1 - comm.rank if comm.rank < 2 else None

    def pingpong():
        if comm.rank == 0:
            comm.Send(send, 1, tag=7)
            comm.Recv(recv, 1, tag=7)
        elif peer is not None:
            comm.Recv(recv, 0, tag=7)
            comm.Send(send, 0, tag=7)

    calls = {
        "Latency": pingpong,
        "Allreduce": lambda: comm.Allreduce(send, recv),
        "Bcast": lambda: comm.Bcast(send, root=0),
        "Barrier": comm.Barrier,
        "Allgather": lambda: comm.Allgather(send, recv),
    }
    call = calls[spec["coll"]]
    for _ in range(spec["warmup"]):
        call()
    blocks = []
    for _ in range(spec["blocks"]):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(spec["iters"]):
            call()
        per_call = (time.perf_counter() - t) / spec["iters"] * 1e6
        blocks.append(per_call / 2 if call is pingpong else per_call)
    if comm.rank == 0:
        print("AB", pycomm.__file__, " ".join(f"{b:.3f}" for b in blocks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
