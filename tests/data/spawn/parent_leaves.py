"""The parents end without disconnecting while a child waits for them
(tests/test_mpi_spawn.py): the child's receive fails naming its parent, and the root
reports the child's exit at its own."""
import sys

from mpi4py import MPI

MPI.COMM_WORLD.Spawn(sys.executable, ["-c", (
    "from mpi4py import MPI; p = MPI.Comm.Get_parent(); p.recv(source=0)")], maxprocs=1)
print("parents leave\n", end="", flush=True)
