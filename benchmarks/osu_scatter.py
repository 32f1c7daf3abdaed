"""Scatter latency and bus bandwidth, after OSU's ``osu_scatter`` and nccl-tests.

``Scatter(sendbuf, recvbuf, root)``: the root sends ``size`` bytes to each rank (n x size
in all). algbw counts S = n x size; busbw = algbw (n-1)/n (nccl-tests' scatter).

Run::

    python launch.py -n 4 benchmarks/osu_scatter.py [--algorithm binomial|linear|all]
    mpiexec -n 4 python benchmarks/osu_scatter.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Rank r must receive block r of the root's buffer (rank r's pattern)."""
    send = ctx.empty(ctx.n * count) if ctx.rank == ctx.root else None
    recv = ctx.empty(count)

    def fill(it: int) -> None:
        if send is not None:
            send[...] = np.concatenate([ctx.pattern.data(r, it, count) for r in range(ctx.n)])
        recv[...] = 0

    def check(it: int):
        return mismatch(recv, ctx.pattern.data(ctx.rank, it, count), "recvbuf")

    return Case((send, recv), {"root": ctx.root}, fill, check)


SPEC = Collective("scatter", "Scatter", "OSU MPI Scatter Latency Test", setup,
                  registry="scatter", per_rank=True,
                  size_note="size: bytes each rank receives", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
