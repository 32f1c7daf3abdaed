"""Allgather latency and bus bandwidth, after OSU's ``osu_allgather`` and nccl-tests.

``Allgather(sendbuf, recvbuf)``: every rank contributes ``size`` bytes and receives
n x size. algbw counts S = n x size; busbw = algbw (n-1)/n (nccl-tests).

Run::

    python launch.py -n 4 benchmarks/osu_allgather.py [--algorithm ring|all]
    mpiexec -n 4 python benchmarks/osu_allgather.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block r of every rank's buffer must be rank r's pattern."""
    send, recv = ctx.empty(count), ctx.empty(ctx.n * count)

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        recv[...] = 0

    def check(it: int):
        want = np.concatenate([ctx.pattern.data(r, it, count) for r in range(ctx.n)])
        return mismatch(recv, want, "recvbuf")

    return Case((send, recv), {}, fill, check)


SPEC = Collective("allgather", "Allgather", "OSU MPI Allgather Latency Test", setup,
                  registry="allgather", per_rank=True,
                  size_note="size: bytes each rank contributes", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
