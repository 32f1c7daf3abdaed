"""Latency of many pairs at once, after OSU's ``osu_multi_lat``.

With n ranks (n even), rank r < n/2 ping-pongs with rank r + n/2, all pairs at the same
time (``Send``/``Recv``; ``--pickle``: ``send``/``recv`` of the array as an object). The row
gives the average over pairs of each pair's half round trip in µs (``-f``: also the
fastest and slowest pair). On 2 cores, more than one pair oversubscribes the machine.

Run::

    python launch.py -n 4 benchmarks/osu_multi_lat.py
    mpiexec -n 4 python benchmarks/osu_multi_lat.py --mpi4py
"""

from __future__ import annotations

import sys

import numpy as np
from _p2p import Checker, setup, sweep

TAG = 1


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    run = setup("multi_lat", "OSU MPI Multi Latency Test", iters=(10000, 1000, 1000, 100),
                sizes=(0, 4 << 20), min_ranks=2, even=True, argv=argv,
                columns=[("size", "Size", 10, "d"), ("avg_us", "Avg Latency(us)", 18, ".2f")])
    if isinstance(run, int):
        return run
    c, comm, rank, pat, checker = run.c, run.c.comm, run.c.rank, run.pattern, Checker()
    validate, pickle = run.args.validate, run.args.pickle
    half = c.size // 2
    peer = rank + half if rank < half else rank - half
    run.notes.append(f"{half} pair(s): r <-> r + {half}")
    big = max(run.sizes) // run.dtype.itemsize
    sbuf_all = np.full(big, 1, dtype=run.dtype)
    rbuf_all = np.zeros(big, dtype=run.dtype)

    def make_one(count: int):
        s, r = sbuf_all[:count], rbuf_all[:count]

        def one(it: int) -> None:
            if validate:
                s[...] = pat.data(rank, it, count)
            got = r
            if rank < half:
                if pickle:
                    comm.send(s, peer, tag=TAG)
                    got = comm.recv(source=peer, tag=TAG)
                else:
                    comm.Send(s, peer, tag=TAG)
                    comm.Recv(r, peer, tag=TAG)
            else:
                if pickle:
                    got = comm.recv(source=peer, tag=TAG)
                    comm.send(s, peer, tag=TAG)
                else:
                    comm.Recv(r, peer, tag=TAG)
                    comm.Send(s, peer, tag=TAG)
            if validate:
                checker.check(got, pat.data(peer, it, count), "received message")

        return one

    def row(size, total, times, iters):
        lat = total * 1e6 / (2 * iters)
        pairs = comm.gather(lat if rank < half else None, root=0)
        if rank != 0:
            return None
        lats = [p for p in pairs if p is not None]
        extra = [min(lats), max(lats), iters] if run.args.full else []
        return (size, sum(lats) / len(lats), *extra)

    return sweep(run, make_one, row, checker)


if __name__ == "__main__":
    sys.exit(main())
