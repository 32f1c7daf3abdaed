"""Gatherv latency, after OSU's ``osu_gatherv``: ``Gather`` with per-rank counts.

``Gatherv(sendbuf, [recvbuf, counts, displs], root)`` with every count equal to
``size`` bytes (as OSU does), so it compares with ``osu_gather``. algbw counts
S = n x size; busbw uses gather's factor (n-1)/n.

Run::

    python launch.py -n 4 benchmarks/osu_gatherv.py
    mpiexec -n 4 python benchmarks/osu_gatherv.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block r of the root's buffer must be rank r's pattern."""
    n = ctx.n
    send = ctx.empty(count)
    recv = ctx.empty(n * count) if ctx.rank == ctx.root else None
    spec = [recv, [count] * n, [r * count for r in range(n)]] if recv is not None else None

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        if recv is not None:
            recv[...] = 0

    def check(it: int):
        if recv is None:
            return None
        want = np.concatenate([ctx.pattern.data(r, it, count) for r in range(n)])
        return mismatch(recv, want, "recvbuf")

    return Case((send, spec), {"root": ctx.root}, fill, check)


SPEC = Collective("gatherv", "Gatherv", "OSU MPI Gatherv Latency Test", setup,
                  registry="gatherv", per_rank=True,
                  size_note="size: bytes each rank sends (equal counts)", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
