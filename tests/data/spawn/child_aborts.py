"""A spawned child calls Comm.Abort(3) while its sibling and both parents wait on each
other (tests/test_mpi_spawn.py): as under mpiexec, the whole job ends with code 3."""
import sys

from mpi4py import MPI

CHILD = ("from mpi4py import MPI; p = MPI.Comm.Get_parent(); w = MPI.COMM_WORLD; "
         "w.Abort(3) if w.rank == 0 else p.recv(source=0)  # CHILD_ABORTS_MARKER")
inter = MPI.COMM_WORLD.Spawn(sys.executable, ["-c", CHILD], maxprocs=2)
print(f"rank {MPI.COMM_WORLD.rank} spawned\n", end="", flush=True)
inter.recv(source=1)
print(f"rank {MPI.COMM_WORLD.rank} was not stopped\n", end="", flush=True)
