"""Alltoallv latency, after OSU's ``osu_alltoallv``: ``Alltoall`` with per-peer counts.

``Alltoallv([sendbuf, (counts, displs)], [recvbuf, (counts, displs)])`` (the spec mpi4py
reads too) with every count equal to ``size`` bytes (as OSU does). algbw counts S = n x
size; busbw uses alltoall's (n-1)/n.

Run::

    python launch.py -n 4 benchmarks/osu_alltoallv.py
    mpiexec -n 4 python benchmarks/osu_alltoallv.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block j from rank i is pattern i*n + j: rank j's block i must be that."""
    n, me = ctx.n, ctx.rank
    send, recv = ctx.empty(n * count), ctx.empty(n * count)
    counts, displs = [count] * n, [r * count for r in range(n)]

    def fill(it: int) -> None:
        send[...] = np.concatenate([ctx.pattern.data(me * n + j, it, count) for j in range(n)])
        recv[...] = 0

    def check(it: int):
        want = np.concatenate([ctx.pattern.data(i * n + me, it, count) for i in range(n)])
        return mismatch(recv, want, "recvbuf")

    return Case(([send, (counts, displs)], [recv, (counts, displs)]), {}, fill, check)


SPEC = Collective("alltoallv", "Alltoallv", "OSU MPI All-to-Allv Personalized Exchange "
                  "Latency Test", setup, registry="alltoallv", per_rank=True,
                  size_note="size: bytes each rank sends to each rank (equal counts)",
                  sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
