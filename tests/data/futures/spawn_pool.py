"""mpi4py.futures' MPIPoolExecutor outside ``python -m mpi4py.futures``: mpi4py spawns its
workers (MPI_Comm_spawn) from a pool thread; what each call returned, one line each."""
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor, as_completed


def where(x):
    world = MPI.COMM_WORLD
    return x * x, world.Get_rank(), world.Get_size(), MPI.Comm.Get_parent() != MPI.COMM_NULL


def add(a, b):
    return a + b


if __name__ == "__main__":
    print("parent world", MPI.COMM_WORLD.Get_size())
    with MPIPoolExecutor(max_workers=2) as ex:
        print("workers", ex.num_workers)
        out = list(ex.map(where, range(12)))
        print("map", [v for v, *_ in out], "ranks", sorted({r for _, r, _, _ in out}),
              "worlds", sorted({s for _, _, s, _ in out}), "spawned", all(p for *_, p in out))
        print("starmap", list(ex.starmap(add, [(1, 2), (3, 4)])))
        bad = ex.submit(divmod, 1, 0)
        print("exception", type(bad.exception()).__name__)
        futs = [ex.submit(add, i, i) for i in range(5)]
        print("as_completed", sorted(f.result() for f in as_completed(futs)))
    with MPIPoolExecutor(max_workers=1) as ex:
        print("second pool", list(ex.map(abs, [-1, -2, -3])))
    print("end")
