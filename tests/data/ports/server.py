"""The server job of tests/test_mpi_ports.py: opens a port, publishes it, accepts one
client job, exchanges data with it over the link, prints "server rank R ok" or what
differed."""
import sys

import numpy as np
from mpi4py import MPI

service = sys.argv[1]
comm = MPI.COMM_WORLD
bad = []
port = MPI.Open_port() if comm.rank == 0 else None
if comm.rank == 0:
    MPI.Publish_name(service, port)
    try:
        MPI.Publish_name(service, port)
        bad.append("a second Publish_name did not fail")
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_SERVICE:
            bad.append(f"second Publish_name: {exc}")
    print("published\n", end="", flush=True)
client = comm.Accept(port, root=0)
if comm.rank == 0:
    MPI.Unpublish_name(service, port)
    MPI.Close_port(port)
if (client.Get_size(), client.Get_remote_size()) != (comm.size, 2):
    bad.append(f"sizes {client.Get_size()} {client.Get_remote_size()}")
x = np.arange(100, dtype=np.float64) + comm.rank
sums = np.empty(2)
client.Allreduce(x[:2].copy(), sums, op=MPI.SUM)     # the client's two contributions
if not np.array_equal(sums, [100.0, 102.0]):          # clients send [50, 51] each
    bad.append(f"inter Allreduce {sums}")
if comm.rank == 0:
    client.Send(x, dest=1, tag=3)
    if client.recv(source=0, tag=4) != "got it":
        bad.append("no answer from client 0")
client.Disconnect()
print(f"server rank {comm.rank} {'ok' if not bad else bad}\n", end="", flush=True)     # one write
