"""Point-to-point latency between ranks 0 and 1, after OSU's ``osu_latency``.

Rank 0 sends a message of ``size`` bytes to rank 1 with ``Send``, rank 1 receives it with
``Recv`` and sends it back; the reported latency is half the average round trip, in µs
(``-f``: also the fastest and slowest round trip, halved). ``--pickle`` sends the numpy
array as an object (``send``/``recv``). Each size runs ``-x`` warm-up round trips then
``-i`` timed ones (``--warmup-large`` / ``--iter-large`` past 8 KiB), between Barriers.
Ranks above 1 only join the Barriers.

Run::

    python launch.py -n 2 benchmarks/osu_latency.py            # pycomm
    python launch.py -n 2 --transport tcp benchmarks/osu_latency.py
    mpiexec -n 2 python benchmarks/osu_latency.py --mpi4py     # reference
"""

from __future__ import annotations

import sys

import numpy as np
from _p2p import Checker, setup, stats_cols, sweep

TAG = 1


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    run = setup("latency", "OSU MPI Latency Test", iters=(10000, 1000, 1000, 100),
                sizes=(0, 4 << 20), min_ranks=2, argv=argv,
                columns=[("size", "Size", 10, "d"), ("avg_us", "Avg Latency(us)", 18, ".2f")])
    if isinstance(run, int):
        return run
    comm, rank, pat, checker = run.c.comm, run.c.rank, run.pattern, Checker()
    validate, pickle = run.args.validate, run.args.pickle
    big = max(run.sizes) // run.dtype.itemsize
    sbuf_all = np.full(big, 1, dtype=run.dtype)
    rbuf_all = np.zeros(big, dtype=run.dtype)

    def make_one(count: int):
        s, r = sbuf_all[:count], rbuf_all[:count]
        peer = 1 - rank

        def one(it: int) -> None:
            if validate:
                s[...] = pat.data(rank, it, count)
            if rank == 0:
                if pickle:
                    comm.send(s, 1, tag=TAG)
                    got = comm.recv(source=1, tag=TAG)
                else:
                    comm.Send(s, 1, tag=TAG)
                    comm.Recv(r, 1, tag=TAG)
                    got = r
            else:
                if pickle:
                    got = comm.recv(source=0, tag=TAG)
                    comm.send(s, 0, tag=TAG)
                else:
                    comm.Recv(r, 0, tag=TAG)
                    comm.Send(s, 0, tag=TAG)
                    got = r
            if validate:
                checker.check(got, pat.data(peer, it, count), "received message")

        def idle(it: int) -> None:
            return None

        return one if rank < 2 else idle

    def row(size, total, times, iters):
        if rank != 0:
            return None
        return (size, total * 1e6 / (2 * iters),
                *stats_cols(run.args.full, times or [], lambda t: t * 1e6 / 2, iters))

    return sweep(run, make_one, row, checker)


if __name__ == "__main__":
    sys.exit(main())
