"""Allreduce latency and bus bandwidth, after OSU's ``osu_allreduce`` and nccl-tests.

Every rank calls ``Allreduce(sendbuf, recvbuf, op=SUM)`` on ``size / 4`` float32 values
(``--in-place`` uses ``IN_PLACE``). Each rank times its own calls; the row gives the
average, minimum and maximum over ranks of the per-rank mean time per call, in µs, plus
nccl-tests' bandwidths from the average time t:

- algbw = size / t (GB/s, 10**9 bytes per second);
- busbw = algbw * 2 (n - 1) / n, the rate each link would carry in a ring allreduce, so it
  compares across rank counts and with a point-to-point bandwidth.

``--algorithm NAME`` is passed as ``algorithm=NAME`` to pycomm's ``Allreduce`` (mpi4py has
no such keyword; use the MPI library's own knobs there). ``-c`` checks the result once per
size before timing.

Run::

    python launch.py -n 4 benchmarks/osu_allreduce.py [--algorithm ring]
    mpiexec -n 4 python benchmarks/osu_allreduce.py --mpi4py
"""

from __future__ import annotations

import sys

import numpy as np

from _common import Report, agree_iterations, loop_counts, make_parser, parse_sizes, select_comm


def timed_calls(c, sbuf, rbuf, count: int, kwargs: dict) -> float:
    """Call Allreduce ``count`` times; return the seconds spent inside the calls."""
    comm, wtime, op = c.comm, c.mod.Wtime, c.mod.SUM
    total = 0.0
    for _ in range(count):
        t0 = wtime()
        comm.Allreduce(sbuf, rbuf, op=op, **kwargs)
        total += wtime() - t0
    return total


def check(c, sbuf, rbuf, in_place: bool, kwargs: dict) -> str | None:
    """Allreduce rank + 1 everywhere once; return an error text, or None when right."""
    n = c.size
    src = rbuf if in_place else sbuf
    src[...] = c.rank + 1
    comm_sbuf = c.mod.IN_PLACE if in_place else sbuf
    c.comm.Allreduce(comm_sbuf, rbuf, op=c.mod.SUM, **kwargs)
    want = n * (n + 1) / 2
    bad = np.flatnonzero(rbuf != want)
    if bad.size:
        return (f"rank {c.rank}: {bad.size} of {rbuf.size} elements wrong, "
                f"first at {bad[0]}: {rbuf[bad[0]]} != {want}")
    return None


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every size, print one row per size on rank 0."""
    parser = make_parser(__doc__.splitlines()[0], iters=1000, warmup=200, iters_large=100,
                         warmup_large=10)
    parser.add_argument("--algorithm", default=None, metavar="NAME",
                        help="pycomm only: pass algorithm=NAME to Allreduce")
    parser.add_argument("--in-place", action="store_true",
                        help="use IN_PLACE as the send buffer")
    parser.add_argument("-c", "--validate", action="store_true",
                        help="check the result once per size before timing")
    args = parser.parse_args(argv)
    sizes = [s for s in parse_sizes(args.message_size, 8, 64 << 20) if s >= 4]
    if args.mpi4py and args.algorithm:
        parser.error("--algorithm is a pycomm keyword; mpi4py's Allreduce has none")
    c = select_comm(args.mpi4py)
    n = c.size
    kwargs = {"algorithm": args.algorithm} if args.algorithm else {}
    report = Report("OSU MPI Allreduce Latency Test", c.label,
                    [("size", "Size", 10, "d"), ("avg_us", "Avg Latency(us)", 17, ".2f"),
                     ("min_us", "Min Latency(us)", 17, ".2f"),
                     ("max_us", "Max Latency(us)", 17, ".2f"),
                     ("algbw_gbps", "algbw(GB/s)", 13, ".3f"),
                     ("busbw_gbps", "busbw(GB/s)", 13, ".3f")],
                    enabled=c.rank == 0)
    report.header(f"{n} ranks, float32, SUM, "
                  f"algorithm {args.algorithm or 'default'}{', in place' if args.in_place else ''}")
    count_max = max(sizes) // 4
    sbuf_all = np.ones(count_max, dtype=np.float32)
    rbuf_all = np.zeros(count_max, dtype=np.float32)
    failed = False
    for size in sizes:
        iters, warmup = loop_counts(args, size)
        sbuf, rbuf = sbuf_all[:size // 4], rbuf_all[:size // 4]
        if args.validate:
            error = check(c, sbuf, rbuf, args.in_place, kwargs)
            errors = c.comm.gather(error, root=0)
            if c.rank == 0 and any(errors):
                failed = True
                for e in filter(None, errors):
                    print(f"# VALIDATION FAILED at {size} B: {e}", file=sys.stderr)
        send = c.mod.IN_PLACE if args.in_place else sbuf
        c.comm.Barrier()
        warm = timed_calls(c, send, rbuf, warmup, kwargs)
        if args.max_time is not None:
            iters = agree_iterations(c, iters, warm, warmup, args.max_time)
        c.comm.Barrier()
        mean = timed_calls(c, send, rbuf, iters, kwargs) / iters
        c.comm.Barrier()
        means = c.comm.gather(mean, root=0)
        if c.rank == 0:
            avg = sum(means) / n
            algbw = size / avg / 1e9
            report.row(size, avg * 1e6, min(means) * 1e6, max(means) * 1e6, algbw,
                       algbw * 2 * (n - 1) / n)
    report.write_json(args.json, "osu_allreduce", ranks=n, dtype="float32", op="SUM",
                      algorithm=args.algorithm, in_place=args.in_place)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
