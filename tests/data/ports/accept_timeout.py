"""Accept with no client gives up after PYCOMM_TIMEOUT (2 s here: ERR_PORT), and the port still
serves the next client (tests/test_mpi_ports.py): rank 0 accepts on COMM_SELF, rank 1
connects on COMM_SELF once the first Accept has failed."""
import os

from mpi4py import MPI

world = MPI.COMM_WORLD
port = world.bcast(MPI.Open_port() if world.rank == 0 else None, root=0)
if world.rank == 0:
    os.environ["PYCOMM_TIMEOUT"] = "2"      # this Accept's (read at the call)
    try:
        MPI.COMM_SELF.Accept(port)
        got = "no error"
    except MPI.Exception as exc:
        got = MPI.Get_error_string(exc.Get_error_class()).split(":")[0] + ": " + str(exc)
    del os.environ["PYCOMM_TIMEOUT"]
    world.send(got, dest=1)
    link = MPI.COMM_SELF.Accept(port)
    link.send("second accept", dest=0)
else:
    got = world.recv(source=0)
    link = MPI.COMM_SELF.Connect(port)
    got = link.recv(source=0)
link.Disconnect()
print(f"rank {world.rank}: {got}\n", end="", flush=True)    # one write
