"""Bidirectional bandwidth between ranks 0 and 1, after OSU's ``osu_bibw``.

Per iteration both ranks post a window of ``-W`` (default 64) ``Irecv`` from the other and
as many ``Isend`` of ``size`` bytes to it, then ``Waitall`` on all of them; bandwidth is
the bytes moved both ways over the time of the timed iterations, in MB/s (10**6 B/s;
``-f``: also the slowest and fastest window). ``--pickle``: ``isend`` the array as an
object, ``recv`` the peer's window one by one, then wait for the sends. Ranks above 1 only
join the Barriers.

Run::

    python launch.py -n 2 benchmarks/osu_bibw.py
    mpiexec -n 2 python benchmarks/osu_bibw.py --mpi4py
"""

from __future__ import annotations

import sys

import numpy as np
from _common import waitall
from _p2p import Checker, setup, stats_cols, sweep

TAG_DATA = 100


def _window_arg(p) -> None:
    p.add_argument("-W", "--window-size", type=int, default=64, metavar="W",
                   help="messages in flight each way per iteration (default 64)")


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    run = setup("bibw", "OSU MPI Bi-Directional Bandwidth Test", iters=(100, 10, 20, 2),
                sizes=(1, 4 << 20), min_ranks=2, argv=argv, add_args=_window_arg,
                columns=[("size", "Size", 10, "d"),
                         ("bandwidth_mbps", "Bandwidth (MB/s)", 20, ".2f")])
    if isinstance(run, int):
        return run
    c, comm, rank, pat, checker = run.c, run.c.comm, run.c.rank, run.pattern, Checker()
    validate, pickle, window = run.args.validate, run.args.pickle, run.args.window_size
    run.notes.append(f"window {window} each way")
    run.report.meta["window"] = window
    big = max(run.sizes) // run.dtype.itemsize
    sbuf_all = np.full(big, 1, dtype=run.dtype)
    rbufs = [np.zeros(big, dtype=run.dtype) for _ in range(window if validate else 1)]

    def make_one(count: int):
        s = sbuf_all[:count]
        rs = [r[:count] for r in rbufs]
        peer = 1 - rank

        def one(it: int) -> None:
            if validate:
                s[...] = pat.data(rank, it, count)
            if pickle:
                sends = [comm.isend(s, peer, tag=TAG_DATA) for _ in range(window)]
                got = [comm.recv(source=peer, tag=TAG_DATA) for _ in range(window)]
                waitall(c, sends)
            else:
                recvs = [comm.Irecv(rs[k % len(rs)], peer, tag=TAG_DATA)
                         for k in range(window)]
                sends = [comm.Isend(s, peer, tag=TAG_DATA) for _ in range(window)]
                waitall(c, recvs + sends)
                got = rs
            if validate:
                want = pat.data(peer, it, count)
                for g in got:
                    checker.check(g, want, "received message")

        return one if rank < 2 else (lambda it: None)

    def row(size, total, times, iters):
        if rank != 0:
            return None
        return (size, 2 * size * window * iters / total / 1e6,
                *stats_cols(run.args.full, times or [],
                            lambda t: 2 * size * window / t / 1e6, iters))

    return sweep(run, make_one, row, checker)


if __name__ == "__main__":
    sys.exit(main())
