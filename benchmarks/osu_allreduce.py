"""Allreduce latency and bus bandwidth, after OSU's ``osu_allreduce`` and nccl-tests.

Every rank calls ``Allreduce(sendbuf, recvbuf, op=SUM)`` on ``size`` bytes of ``--dtype``
(float32) values. busbw = algbw * 2(n-1)/n (nccl-tests). ``-c`` checks every iteration's
result against numpy's sum of every rank's pattern.

Run::

    python launch.py -n 4 benchmarks/osu_allreduce.py [--algorithm ring|all] [-c] [-f]
    mpiexec -n 4 python benchmarks/osu_allreduce.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Send this rank's pattern; every rank must end with the sum over ranks."""
    send, recv = ctx.empty(count), ctx.empty(count)

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        recv[...] = 0

    def check(it: int):
        return mismatch(recv, ctx.pattern.total(range(ctx.n), it, count), "recvbuf")

    return Case((send, recv), {"op": ctx.c.mod.SUM}, fill, check)


SPEC = Collective("allreduce", "Allreduce", "OSU MPI Allreduce Latency Test", setup,
                  registry="allreduce", sizes=(4, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
