"""Latency of the small point-to-point patterns of a halo exchange, through mpi4py's API.

Two ranks (the others, if any, idle): a ``Send``/``Recv`` ping-pong (the round trip), a
``Sendrecv`` that both ranks make at once, ``Irecv`` + ``Isend`` + ``Waitall`` that both
make at once, and a halo exchange's two of each (left and right neighbour, which on two
ranks are the same, on two tags) in one ``Waitall``, of ``--size`` bytes (float64). Each pattern runs ``--iterations`` times
after ``--warmup``, ``--passes`` times in turn; rank 0 prints µs per iteration. The same
script runs on pycomm and on MPI::

    python launch.py --mpi4py -n 2 benchmarks/p2p_exchange.py
    mpiexec -n 2 python benchmarks/p2p_exchange.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--iterations", type=int, default=3000)
    parser.add_argument("-x", "--warmup", type=int, default=300)
    parser.add_argument("--size", type=int, default=8, help="bytes per message (default 8)")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        parser.error("needs 2 ranks or more")
    me = comm.rank
    other = 1 - me if me < 2 else None
    out = np.ones(max(1, args.size // 8))
    into = np.empty_like(out)

    def pingpong():
        if me == 0:
            comm.Send(out, 1, 5)
            comm.Recv(into, 1, 5)
        else:
            comm.Recv(into, 0, 5)
            comm.Send(out, 0, 5)

    def sendrecv():
        comm.Sendrecv(out, other, 7, into, other, 7)

    def nonblocking():
        MPI.Request.Waitall([comm.Irecv(into, other, 6), comm.Isend(out, other, 6)])

    into2 = np.empty_like(out)

    def halo():
        MPI.Request.Waitall([comm.Irecv(into, other, 1), comm.Irecv(into2, other, 2),
                             comm.Isend(out, other, 1), comm.Isend(out, other, 2)])

    patterns = [("ping-pong round trip", pingpong), ("Sendrecv", sendrecv),
                ("Irecv+Isend+Waitall", nonblocking), ("halo 2 Irecv+2 Isend", halo)]
    for p in range(args.passes):
        for name, fn in patterns:
            comm.Barrier()
            if other is not None:
                for _ in range(args.warmup):
                    fn()
                t0 = time.perf_counter()
                for _ in range(args.iterations):
                    fn()
                us = (time.perf_counter() - t0) / args.iterations * 1e6
            comm.Barrier()
            if me == 0:
                print(f"pass {p + 1}  {name:22s} {us:9.2f} us", flush=True)


if __name__ == "__main__":
    main()
