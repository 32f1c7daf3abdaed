"""Small all-reduces on a communicator made after many others were created and freed.

A program that makes a communicator for a phase and frees it afterwards (a ``Dup`` per
solver call, a ``Split`` per epoch) creates hundreds over a run. ``--churn`` rounds of
``Dup`` + one ``Allreduce`` + ``Free`` run first; then a fresh ``Dup`` times
``--iterations`` 8-byte ``Allreduce`` calls (after ``--warmup``), and rank 0 prints µs
per call, for each of ``--passes``. The same script runs on pycomm and on MPI::

    python launch.py --mpi4py -n 2 benchmarks/comm_churn.py
    mpiexec -n 2 python benchmarks/comm_churn.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--churn", type=int, default=200,
                        help="communicators created and freed first (default 200)")
    parser.add_argument("-i", "--iterations", type=int, default=3000)
    parser.add_argument("-x", "--warmup", type=int, default=300)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    x, y = np.ones(1), np.empty(1)
    t0 = time.perf_counter()
    for _ in range(args.churn):
        d = world.Dup()
        d.Allreduce(x, y)
        d.Free()
    churn_s = time.perf_counter() - t0
    comm = world.Dup()
    for p in range(args.passes):
        for _ in range(args.warmup):
            comm.Allreduce(x, y)
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(args.iterations):
            comm.Allreduce(x, y)
        us = (time.perf_counter() - t) / args.iterations * 1e6
        if world.rank == 0:
            print(f"pass {p + 1}  after {args.churn} communicators  Allreduce 8 B "
                  f"{us:8.2f} us", flush=True)
    if world.rank == 0:
        print(f"churn: {churn_s / max(1, args.churn) * 1e6:.0f} us per Dup+Allreduce+Free",
              flush=True)
    comm.Free()


if __name__ == "__main__":
    main()
