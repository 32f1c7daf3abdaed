"""An MPIPoolExecutor outside ``python -m mpi4py.futures``: mpi4py spawns its workers
(MPI_Comm_spawn), which pycomm does not offer: the first submit raises."""
from mpi4py.futures import MPIPoolExecutor

if __name__ == "__main__":
    try:
        with MPIPoolExecutor() as ex:
            print(list(ex.map(abs, [-1, -2])))
    except NotImplementedError as exc:
        print("NotImplementedError:", exc)
