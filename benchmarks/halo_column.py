"""A 2-D halo column (``MPI.DOUBLE.Create_vector(N, 1, N)``) against a contiguous buffer of
the same bytes, ping-pong between ranks 0 and 1 (issue 14: within 2x).

For each N, rank 0 sends column 1 of an N x N float64 array with the vector type (resized
to one element, the usual halo idiom) and rank 1 receives it into its column 0 (the halo),
then sends it back the same way; the same
round trip then moves N contiguous float64. Each figure is half a round trip in µs: the
best and the median of ``--blocks`` timed blocks of ``--iters`` round trips (fewer for
large N) after a warm-up block; ``ratio`` is column / contiguous of the best blocks.
Received columns are checked against the sent values once per N.

Run::

    python launch.py -n 2 --mpi4py benchmarks/halo_column.py        # pycomm.MPI
    python launch.py -n 2 --mpi4py --transport tcp benchmarks/halo_column.py
    mpiexec -n 2 python benchmarks/halo_column.py                   # mpi4py + an MPI
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from mpi4py import MPI


def _round_trips(comm, peer: int, first: bool, out, back, iters: int) -> float:
    """Seconds per half round trip of ``iters`` ping-pongs of the messages out/back."""
    comm.Barrier()
    t0 = MPI.Wtime()
    for _ in range(iters):
        if first:
            comm.Send(out, peer, 7)
            comm.Recv(back, peer, 7)
        else:
            comm.Recv(back, peer, 7)
            comm.Send(out, peer, 7)
    return (MPI.Wtime() - t0) / (2 * iters)


def main(argv: list[str] | None = None) -> int:
    """Parse options; print one row per N on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024,4096,8192,16384",
                        help="comma-separated N (the column has N float64)")
    parser.add_argument("--iters", type=int, default=2000, help="round trips per block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks per figure")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        sys.stderr.write("halo_column: run it on 2 ranks\n")
        return 2
    peer, first = 1 - rank, rank == 0
    if first:
        print(f"# {MPI.Get_library_version().splitlines()[0][:60]}")
        print(f"{'N':>6} {'bytes':>7} {'column us':>10} {'(median)':>9} "
              f"{'contig us':>10} {'(median)':>9} {'ratio':>6}")
    for n in (int(x) for x in args.sizes.split(",")):
        grid = np.arange(n * n, dtype=np.float64).reshape(n, n) + 1000.0 * rank
        # one column, resized to one element so that displacements count columns
        col = MPI.DOUBLE.Create_vector(n, 1, n).Create_resized(0, 8).Commit()
        col_out, col_in = [grid, (1, 1), col], [grid, (1, 0), col]   # (count, displ)
        flat_out, flat_in = np.ascontiguousarray(grid[:, 1]), np.empty(n)
        iters = max(20, min(args.iters, args.iters * 1024 // n))
        _round_trips(comm, peer, first, col_out, col_in, iters // 4 + 1)      # warm-up
        if not np.array_equal(grid[:, 0], np.arange(n * n).reshape(n, n)[:, 1] +
                              1000.0 * peer):
            sys.stderr.write(f"halo_column: rank {rank}: wrong halo for N={n}\n")
            return 1
        _round_trips(comm, peer, first, flat_out, flat_in, iters // 4 + 1)
        cols, flats = [], []
        for _ in range(args.blocks):            # interleaved, so drift hits both alike
            cols.append(_round_trips(comm, peer, first, col_out, col_in, iters))
            flats.append(_round_trips(comm, peer, first, flat_out, flat_in, iters))
        col.Free()
        comm.Barrier()
        if first:
            c, f = min(cols) * 1e6, min(flats) * 1e6
            print(f"{n:>6} {8 * n:>7} {c:>10.2f} {statistics.median(cols) * 1e6:>9.2f} "
                  f"{f:>10.2f} {statistics.median(flats) * 1e6:>9.2f} {c / f:>6.2f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
