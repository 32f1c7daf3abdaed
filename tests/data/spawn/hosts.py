"""Spawn from a world across two hosts (tests/test_cluster.py): rank 0 spawns two
children on its host; the parent on the other host sends each one its hostname over
the link, and they answer with theirs."""
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
child = comm.Spawn(sys.executable, ["-c", (
    "import socket; from mpi4py import MPI; p = MPI.Comm.Get_parent(); "
    "got = p.recv(source=1); p.send((got, socket.gethostname()), dest=1); p.Disconnect()")],
    maxprocs=2, root=0)
if comm.rank == 1:
    for r in range(2):
        child.send(socket.gethostname(), dest=r)
    answers = [child.recv(source=r) for r in range(2)]
    print(f"spawn across hosts: {answers}\n", end="", flush=True)        # one write
child.Disconnect()
