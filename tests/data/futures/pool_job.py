"""mpi4py.futures' MPIPoolExecutor in static mode (python -m mpi4py.futures), and
mpi4py.util.pool on it: what each call returned, one line each."""
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor, as_completed
from mpi4py.util import pool


def where(x):
    return x * x, MPI.COMM_WORLD.Get_rank()


def add(a, b):
    return a + b


if __name__ == "__main__":
    with MPIPoolExecutor() as ex:
        print("workers", ex.num_workers)
        out = list(ex.map(where, range(12)))
        print("map", [v for v, _ in out], "ranks", sorted({r for _, r in out}))
        print("starmap", list(ex.starmap(add, [(1, 2), (3, 4)])))
        print("unordered", sorted(v for v, _ in ex.map(where, range(6), unordered=True)))
        print("chunks", [v for v, _ in ex.map(where, range(7), chunksize=3)])
        bad = ex.submit(divmod, 1, 0)
        print("exception", type(bad.exception()).__name__)
        futs = [ex.submit(add, i, i) for i in range(5)]
        print("as_completed", sorted(f.result() for f in as_completed(futs)))
    with pool.Pool() as p:
        print("pool.starmap", p.starmap(add, [(1, 1), (2, 2)]))
        print("pool.apply", p.apply(add, (5, 6)))
    print("end")
