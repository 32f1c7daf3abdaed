"""Latency of mpi4py's lowercase (object) collectives on small Python objects.

What mpi4py programs call every step for a loss, a count or a few settings:
``allreduce`` of a float and of an int, ``bcast`` of a small dict, ``gather``,
``allgather``, ``scatter`` and ``alltoall`` of ints, and ``barrier``. Each call is timed alone (``perf_counter``
around it, an untimed ``Barrier`` after it, as the OSU loops do), averaged over
``--iterations`` after ``--warmup``, and rank 0 prints one line per call (µs), each call
measured ``--passes`` times in turn. The same script runs on pycomm and on MPI::

    python launch.py --mpi4py -n 2 benchmarks/object_calls.py
    mpiexec -n 2 python benchmarks/object_calls.py
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--iterations", type=int, default=5000)
    parser.add_argument("-x", "--warmup", type=int, default=500)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    settings = {"step": 3, "lr": 0.1, "name": "resnet"}
    calls = [("allreduce float", lambda: comm.allreduce(1.5, op=MPI.SUM)),
             ("allreduce int", lambda: comm.allreduce(3)),
             ("bcast dict", lambda: comm.bcast(settings, root=0)),
             ("gather int", lambda: comm.gather(comm.rank, root=0)),
             ("allgather int", lambda: comm.allgather(comm.rank)),
             ("scatter int", lambda: comm.scatter(list(range(comm.size)) if comm.rank == 0
                                                  else None, root=0)),
             ("alltoall int", lambda: comm.alltoall(list(range(comm.size)))),
             ("barrier", comm.barrier)]

    def timed(call) -> float:
        for _ in range(args.warmup):
            call()
            comm.Barrier()
        total = 0.0
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            call()
            total += time.perf_counter() - t0
            comm.Barrier()
        return total / args.iterations * 1e6

    results: dict[str, list[float]] = {name: [] for name, _ in calls}
    for _ in range(args.passes):
        for name, call in calls:
            results[name].append(timed(call))
    if comm.rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()[:60]}, "
              f"{comm.size} ranks, µs per call, {args.passes} passes")
        for name, times in results.items():
            print(f"{name:16s}", " ".join(f"{t:7.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
