"""Reduce latency and bus bandwidth, after OSU's ``osu_reduce`` and nccl-tests.

``Reduce(sendbuf, recvbuf, op=SUM, root)`` of ``size`` bytes to ``--root`` (0). busbw =
algbw (factor 1, nccl-tests). ``-c`` checks the root's result against numpy's sum.

Run::

    python launch.py -n 4 benchmarks/osu_reduce.py [--algorithm binomial|all]
    mpiexec -n 4 python benchmarks/osu_reduce.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Only the root has a receive buffer; it must hold the sum over ranks."""
    send = ctx.empty(count)
    recv = ctx.empty(count) if ctx.rank == ctx.root else None

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        if recv is not None:
            recv[...] = 0

    def check(it: int):
        if recv is None:
            return None
        return mismatch(recv, ctx.pattern.total(range(ctx.n), it, count), "recvbuf")

    return Case((send, recv), {"op": ctx.c.mod.SUM, "root": ctx.root}, fill, check)


SPEC = Collective("reduce", "Reduce", "OSU MPI Reduce Latency Test", setup,
                  registry="reduce", sizes=(4, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
