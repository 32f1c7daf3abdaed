"""Point-to-point bandwidth from rank 0 to rank 1, after OSU's ``osu_bw``.

Per iteration rank 0 posts a window of ``-W`` (default 64) ``Isend`` of ``size`` bytes and
rank 1 a window of as many ``Irecv``; both complete them with ``Waitall``, then rank 1 sends
a 4-byte acknowledgement that rank 0 receives. Bandwidth is bytes moved over the time of the
timed iterations, in MB/s (10**6 bytes per second, as OSU reports). All receives of a window
land in the same buffer, as in OSU. Ranks above 1 only join the Barriers.

Run::

    python launch.py -n 2 benchmarks/osu_bw.py            # pycomm
    mpiexec -n 2 python benchmarks/osu_bw.py --mpi4py     # reference
"""

from __future__ import annotations

import sys

import numpy as np

from _common import (Report, agree_iterations, loop_counts, make_parser, parse_sizes,
                     select_comm, waitall)

TAG_DATA = 100
TAG_ACK = 101


def windows(c, sbuf: np.ndarray, rbuf: np.ndarray, ack: np.ndarray, window: int,
            count: int) -> float:
    """Run ``count`` windows of ``window`` messages 0 → 1; return the elapsed seconds."""
    comm, rank = c.comm, c.rank
    t0 = c.mod.Wtime()
    if rank == 0:
        for _ in range(count):
            reqs = [comm.Isend(sbuf, 1, tag=TAG_DATA) for _ in range(window)]
            waitall(c, reqs)
            comm.Recv(ack, 1, tag=TAG_ACK)
    elif rank == 1:
        for _ in range(count):
            reqs = [comm.Irecv(rbuf, 0, tag=TAG_DATA) for _ in range(window)]
            waitall(c, reqs)
            comm.Send(ack, 0, tag=TAG_ACK)
    return c.mod.Wtime() - t0


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    parser = make_parser(__doc__.splitlines()[0], iters=100, warmup=10, iters_large=20,
                         warmup_large=2)
    parser.add_argument("-W", "--window-size", type=int, default=64, metavar="W",
                        help="messages in flight per iteration (default 64)")
    args = parser.parse_args(argv)
    sizes = [s for s in parse_sizes(args.message_size, 1, 4 << 20) if s > 0]
    c = select_comm(args.mpi4py)
    if c.size < 2:
        if c.rank == 0:
            print("osu_bw needs at least 2 ranks", file=sys.stderr)
        return 2
    report = Report("OSU MPI Bandwidth Test", c.label,
                    [("size", "Size", 10, "d"), ("bandwidth_mbps", "Bandwidth (MB/s)", 20, ".2f")],
                    enabled=c.rank == 0)
    report.header(f"window {args.window_size}")
    sbuf = np.full(max(sizes), 0x61, dtype=np.uint8)
    rbuf = np.zeros(max(sizes), dtype=np.uint8)
    ack = np.zeros(4, dtype=np.uint8)
    for size in sizes:
        iters, warmup = loop_counts(args, size)
        s, r = sbuf[:size], rbuf[:size]
        c.comm.Barrier()
        warm = windows(c, s, r, ack, args.window_size, warmup)
        if args.max_time is not None:
            iters = agree_iterations(c, iters, warm, warmup, args.max_time)
        c.comm.Barrier()
        elapsed = windows(c, s, r, ack, args.window_size, iters)
        c.comm.Barrier()
        report.row(size, size * args.window_size * iters / elapsed / 1e6)
    report.write_json(args.json, "osu_bw", ranks=c.size, window=args.window_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
