"""A distributed FFT's transpose: ``Alltoallw`` of subarray datatypes, as mpi4py-fft's
``Pencil.transfer`` runs it between every pair of its 1-D FFTs.

An N x N x N complex128 array split over the ranks along axis 0 is redistributed to be
split along axis 1 and back: each send block is the subarray of the local rows that goes
to one rank, each receive block the subarray of the local columns that comes from one.
Each figure is one transpose there and back, in ms: the best and the median of
``--blocks`` timed blocks of ``--iters`` after a warm-up, the slowest rank's. The result
is checked against numpy once per N.

Run::

    python launch.py -n 2 --mpi4py benchmarks/pencil_transpose.py      # pycomm.MPI
    mpiexec -n 2 python benchmarks/pencil_transpose.py                 # mpi4py + an MPI
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI


def _cut(n: int, i: int, size: int) -> tuple[int, int]:
    return n * i // size, n * (i + 1) // size


def _types(shape, size: int, axis: int, base):
    """Per-rank subarrays of a local array of ``shape`` cutting ``axis`` ``size`` ways."""
    out = []
    for j in range(size):
        lo, hi = _cut(shape[axis], j, size)
        sub, start = list(shape), [0] * len(shape)
        sub[axis], start[axis] = hi - lo, lo
        out.append(base.Create_subarray(list(shape), sub, start).Commit())
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse options; print one row per N on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,64,128", help="comma-separated N")
    parser.add_argument("--iters", type=int, default=10, help="transposes per block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks per figure")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0][:60]}, {size} ranks")
        print(f"{'N':>5} {'MiB':>7} {'best ms':>9} {'median ms':>10}")
    for n in (int(x) for x in args.sizes.split(",")):
        full = (np.arange(n ** 3, dtype=np.float64) * (1 + 1j)).reshape(n, n, n)
        a0, b0 = _cut(n, rank, size)
        a1, b1 = _cut(n, rank, size)
        rows = np.ascontiguousarray(full[a0:b0])
        cols = np.zeros((n, b1 - a1, n), np.complex128)
        # rows -> cols: send the column slice of my rows to each rank, receive each
        # rank's rows of my columns
        stypes = _types(rows.shape, size, 1, MPI.DOUBLE_COMPLEX)
        rtypes = _types(cols.shape, size, 0, MPI.DOUBLE_COMPLEX)
        one, zero = [1] * size, [0] * size
        forward = ([rows, (one, zero), stypes], [cols, (one, zero), rtypes])
        backward = ([cols, (one, zero), rtypes], [rows, (one, zero), stypes])
        comm.Alltoallw(*forward)
        if not np.array_equal(cols, full[:, a1:b1]):
            raise SystemExit(f"rank {rank}: wrong transpose at N={n}")
        times = []
        for block in range(args.blocks + 1):
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(args.iters):
                comm.Alltoallw(*forward)
                comm.Alltoallw(*backward)
            took = comm.allreduce((MPI.Wtime() - t0) / args.iters, op=MPI.MAX)
            if block:
                times.append(took)
        for t in stypes + rtypes:
            t.Free()
        if rank == 0:
            print(f"{n:>5} {full.nbytes / 2**20:>7.1f} {1e3 * min(times):>9.3f} "
                  f"{1e3 * statistics.median(times):>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
