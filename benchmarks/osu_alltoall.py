"""All-to-all latency and bus bandwidth, after OSU's ``osu_alltoall`` and nccl-tests.

``Alltoall(sendbuf, recvbuf)``: every rank sends ``size`` bytes to each rank (n x size in
all). algbw counts S = n x size; busbw = algbw (n-1)/n (nccl-tests' alltoall).

Run::

    python launch.py -n 4 benchmarks/osu_alltoall.py [--algorithm pairwise|all]
    mpiexec -n 4 python benchmarks/osu_alltoall.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block j from rank i is pattern i*n + j: rank j's block i must be that."""
    n, me = ctx.n, ctx.rank
    send, recv = ctx.empty(n * count), ctx.empty(n * count)

    def fill(it: int) -> None:
        send[...] = np.concatenate([ctx.pattern.data(me * n + j, it, count) for j in range(n)])
        recv[...] = 0

    def check(it: int):
        want = np.concatenate([ctx.pattern.data(i * n + me, it, count) for i in range(n)])
        return mismatch(recv, want, "recvbuf")

    return Case((send, recv), {}, fill, check)


SPEC = Collective("alltoall", "Alltoall", "OSU MPI All-to-All Personalized Exchange Latency "
                  "Test", setup, registry="alltoall", per_rank=True,
                  size_note="size: bytes each rank sends to each rank", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
