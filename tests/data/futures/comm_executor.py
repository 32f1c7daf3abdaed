"""mpi4py.futures' MPICommExecutor over COMM_WORLD (no python -m mpi4py.futures): the
root's executor runs tasks on the other ranks (on the root itself in a world of one)."""
import sys

from mpi4py import MPI
from mpi4py.futures import MPICommExecutor


def where(x):
    return x + 1, MPI.COMM_WORLD.Get_rank()


with MPICommExecutor(MPI.COMM_WORLD, root=0) as ex:
    if ex is not None:
        out = list(ex.map(where, range(8)))
        ranks = sorted({r for _, r in out})
        print("map", [v for v, _ in out], "ranks", ranks if MPI.COMM_WORLD.Get_size() > 1
              else "root")
        print("exception", type(ex.submit(divmod, 1, 0).exception()).__name__)
sys.stdout.flush()
MPI.COMM_WORLD.Barrier()
print("rank", MPI.COMM_WORLD.Get_rank(), "left")
