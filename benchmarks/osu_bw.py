"""Point-to-point bandwidth from rank 0 to rank 1, after OSU's ``osu_bw``.

Per iteration rank 0 posts a window of ``-W`` (default 64) ``Isend`` of ``size`` bytes and
rank 1 a window of as many ``Irecv``; both complete them with ``Waitall``, then rank 1 sends
a 4-byte acknowledgement that rank 0 receives. Bandwidth is bytes moved over the time of the
timed iterations, in MB/s (10**6 bytes per second, as OSU reports; ``-f``: also the slowest
and fastest window). All receives of a window land in the same buffer, as in OSU (with
``-c``, rank 1 receives a window into distinct buffers and checks each). ``--pickle``:
rank 0 ``isend``s the array as an object, rank 1 ``recv``s the window one by one (OMB-Py's
pickle bandwidth). Ranks above 1 only join the Barriers.

Run::

    python launch.py -n 2 benchmarks/osu_bw.py            # pycomm
    mpiexec -n 2 python benchmarks/osu_bw.py --mpi4py     # reference
"""

from __future__ import annotations

import sys

import numpy as np
from _common import waitall
from _p2p import Checker, setup, stats_cols, sweep

TAG_DATA = 100
TAG_ACK = 101


def _window_arg(p) -> None:
    p.add_argument("-W", "--window-size", type=int, default=64, metavar="W",
                   help="messages in flight per iteration (default 64)")


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    run = setup("bw", "OSU MPI Bandwidth Test", iters=(100, 10, 20, 2), sizes=(1, 4 << 20),
                min_ranks=2, argv=argv, add_args=_window_arg,
                columns=[("size", "Size", 10, "d"),
                         ("bandwidth_mbps", "Bandwidth (MB/s)", 20, ".2f")])
    if isinstance(run, int):
        return run
    c, comm, rank, pat, checker = run.c, run.c.comm, run.c.rank, run.pattern, Checker()
    validate, pickle, window = run.args.validate, run.args.pickle, run.args.window_size
    run.notes.append(f"window {window}")
    run.report.meta["window"] = window
    big = max(run.sizes) // run.dtype.itemsize
    sbuf_all = np.full(big, 1, dtype=run.dtype)
    rbufs = [np.zeros(big, dtype=run.dtype) for _ in range(window if validate else 1)]
    ack = np.zeros(4, dtype=np.uint8)

    def make_one(count: int):
        s = sbuf_all[:count]
        rs = [r[:count] for r in rbufs]

        def sender(it: int) -> None:
            if validate:
                s[...] = pat.data(0, it, count)
            if pickle:
                reqs = [comm.isend(s, 1, tag=TAG_DATA) for _ in range(window)]
            else:
                reqs = [comm.Isend(s, 1, tag=TAG_DATA) for _ in range(window)]
            waitall(c, reqs)
            comm.Recv(ack, 1, tag=TAG_ACK)

        def receiver(it: int) -> None:
            if pickle:
                got = [comm.recv(source=0, tag=TAG_DATA) for _ in range(window)]
            else:
                reqs = [comm.Irecv(rs[k % len(rs)], 0, tag=TAG_DATA) for k in range(window)]
                waitall(c, reqs)
                got = rs
            comm.Send(ack, 0, tag=TAG_ACK)
            if validate:
                want = pat.data(0, it, count)
                for g in got:
                    checker.check(g, want, "received message")

        return {0: sender, 1: receiver}.get(rank, lambda it: None)

    def row(size, total, times, iters):
        if rank != 0:
            return None
        return (size, size * window * iters / total / 1e6,
                *stats_cols(run.args.full, times or [], lambda t: size * window / t / 1e6,
                            iters))

    return sweep(run, make_one, row, checker)


if __name__ == "__main__":
    sys.exit(main())
