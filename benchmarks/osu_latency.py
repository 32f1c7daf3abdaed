"""Point-to-point latency between ranks 0 and 1, after OSU's ``osu_latency``.

Rank 0 sends a message of ``size`` bytes to rank 1 with ``Send``, rank 1 receives it with
``Recv`` and sends it back; the reported latency is half the average round trip, in µs.
Each size runs ``-x`` warm-up round trips then ``-i`` timed ones (``--warmup-large`` /
``--iter-large`` past 8 KiB), between two Barriers. Ranks above 1 only join the Barriers.

Run::

    python launch.py -n 2 benchmarks/osu_latency.py            # pycomm
    mpiexec -n 2 python benchmarks/osu_latency.py --mpi4py     # reference
"""

from __future__ import annotations

import sys

import numpy as np

from _common import Report, agree_iterations, loop_counts, make_parser, parse_sizes, select_comm

TAG = 1


def ping_pong(c, sbuf: np.ndarray, rbuf: np.ndarray, count: int) -> float:
    """Run ``count`` round trips between ranks 0 and 1; return the elapsed seconds."""
    comm, rank = c.comm, c.rank
    t0 = c.mod.Wtime()
    if rank == 0:
        for _ in range(count):
            comm.Send(sbuf, 1, tag=TAG)
            comm.Recv(rbuf, 1, tag=TAG)
    elif rank == 1:
        for _ in range(count):
            comm.Recv(rbuf, 0, tag=TAG)
            comm.Send(sbuf, 0, tag=TAG)
    return c.mod.Wtime() - t0


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    parser = make_parser(__doc__.splitlines()[0], iters=10000, warmup=1000, iters_large=1000,
                         warmup_large=100)
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.message_size, 0, 4 << 20)
    c = select_comm(args.mpi4py)
    if c.size < 2:
        if c.rank == 0:
            print("osu_latency needs at least 2 ranks", file=sys.stderr)
        return 2
    report = Report("OSU MPI Latency Test", c.label,
                    [("size", "Size", 10, "d"), ("latency_us", "Latency (us)", 18, ".2f")],
                    enabled=c.rank == 0)
    report.header()
    sbuf = np.full(max(sizes), 0x61, dtype=np.uint8)
    rbuf = np.zeros(max(sizes), dtype=np.uint8)
    for size in sizes:
        iters, warmup = loop_counts(args, size)
        s, r = sbuf[:size], rbuf[:size]
        c.comm.Barrier()
        warm = ping_pong(c, s, r, warmup)
        if args.max_time is not None:
            iters = agree_iterations(c, iters, warm, warmup, args.max_time)
        c.comm.Barrier()
        elapsed = ping_pong(c, s, r, iters)
        c.comm.Barrier()
        report.row(size, elapsed * 1e6 / (2 * iters))
    report.write_json(args.json, "osu_latency", ranks=c.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
