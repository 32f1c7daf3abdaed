"""Scatterv latency, after OSU's ``osu_scatterv``: ``Scatter`` with per-rank counts.

``Scatterv([sendbuf, counts, displs], recvbuf, root)`` with every count equal to ``size``
bytes (as OSU does). algbw counts S = n x size; busbw uses scatter's factor (n-1)/n.

Run::

    python launch.py -n 4 benchmarks/osu_scatterv.py
    mpiexec -n 4 python benchmarks/osu_scatterv.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Rank r must receive block r of the root's buffer."""
    n = ctx.n
    send = ctx.empty(n * count) if ctx.rank == ctx.root else None
    spec = [send, [count] * n, [r * count for r in range(n)]] if send is not None else None
    recv = ctx.empty(count)

    def fill(it: int) -> None:
        if send is not None:
            send[...] = np.concatenate([ctx.pattern.data(r, it, count) for r in range(n)])
        recv[...] = 0

    def check(it: int):
        return mismatch(recv, ctx.pattern.data(ctx.rank, it, count), "recvbuf")

    return Case((spec, recv), {"root": ctx.root}, fill, check)


SPEC = Collective("scatterv", "Scatterv", "OSU MPI Scatterv Latency Test", setup,
                  registry="scatterv", per_rank=True,
                  size_note="size: bytes each rank receives (equal counts)", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
