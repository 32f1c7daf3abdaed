"""Comm.Join between the two ranks of one job over a socket pair they connect
(tests/test_mpi_ports.py)."""
import socket

from mpi4py import MPI

world = MPI.COMM_WORLD
if world.rank == 0:
    listener = socket.create_server(("127.0.0.1", 0))
    world.send(listener.getsockname(), dest=1)
    sock, _ = listener.accept()
    listener.close()
else:
    sock = socket.create_connection(world.recv(source=0))
link = MPI.Comm.Join(sock.fileno())
sock.close()
got = link.bcast("hello" if world.rank == 0 else None,
                 root=MPI.ROOT if world.rank == 0 else 0)
ok = (link.Get_size(), link.Get_remote_size()) == (1, 1) and \
    (got is None if world.rank == 0 else got == "hello")
link.Disconnect()
verdict = "ok" if ok else f"bad {got!r}"
print(f"join rank {world.rank} {verdict}\n", end="", flush=True)     # one write
