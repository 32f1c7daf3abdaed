"""Broadcast latency and bus bandwidth, after OSU's ``osu_bcast`` and nccl-tests.

``Bcast(buf, root)`` of ``size`` bytes from ``--root`` (0). busbw = algbw (factor 1,
nccl-tests). ``-c``: the root writes its pattern, the others zero their buffer, and every
rank checks that it holds the root's pattern.

Run::

    python launch.py -n 4 benchmarks/osu_bcast.py [--algorithm binomial|all]
    mpiexec -n 4 python benchmarks/osu_bcast.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """The root's pattern must reach every rank."""
    buf = ctx.empty(count)

    def fill(it: int) -> None:
        buf[...] = ctx.pattern.data(ctx.root, it, count) if ctx.rank == ctx.root else 0

    def check(it: int):
        return mismatch(buf, ctx.pattern.data(ctx.root, it, count), "buf")

    return Case((buf,), {"root": ctx.root}, fill, check)


SPEC = Collective("bcast", "Bcast", "OSU MPI Broadcast Latency Test", setup,
                  registry="bcast", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
