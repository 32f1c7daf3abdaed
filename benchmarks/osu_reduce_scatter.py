"""Reduce-scatter latency and bus bandwidth, after OSU's ``osu_reduce_scatter``.

``Reduce_scatter_block(sendbuf, recvbuf, op=SUM)``: every rank sends ``size`` bytes and
receives its size/n share of the sum (OSU calls ``MPI_Reduce_scatter`` with equal counts,
which is the same operation). algbw counts S = size; busbw = algbw (n-1)/n (nccl-tests).
Sizes below n elements are skipped.

Run::

    python launch.py -n 4 benchmarks/osu_reduce_scatter.py [--algorithm ring|all]
    mpiexec -n 4 python benchmarks/osu_reduce_scatter.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Rank r must get block r of the sum over ranks of the n x count patterns."""
    n, me = ctx.n, ctx.rank
    send, recv = ctx.empty(n * count), ctx.empty(count)

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(me, it, n * count)
        recv[...] = 0

    def check(it: int):
        want = ctx.pattern.total(range(n), it, n * count)[me * count:(me + 1) * count]
        return mismatch(recv, want, "recvbuf")

    return Case((send, recv), {"op": ctx.c.mod.SUM}, fill, check)


SPEC = Collective("reduce_scatter", "Reduce_scatter_block", "OSU MPI Reduce_scatter Latency "
                  "Test", setup, registry="reduce_scatter_block", divide=True,
                  size_note="size: bytes each rank sends (it receives size/n)",
                  sizes=(4, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
