"""The client job of tests/test_mpi_ports.py: looks the service up, connects, checks what
crosses; also the errors of a bad, closed or unknown port or name."""
import sys
import time

import numpy as np
from mpi4py import MPI

service = sys.argv[1]
comm = MPI.COMM_WORLD
bad = []
for attempt in range(200):              # the server publishes once it is up
    try:
        port = MPI.Lookup_name(service)
        break
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_NAME:
            raise
        time.sleep(0.05)
server = comm.Connect(port if comm.rank == 1 else None, root=1)
if (server.Get_size(), server.Get_remote_size()) != (2, 3):
    bad.append(f"sizes {server.Get_size()} {server.Get_remote_size()}")
mine = np.array([50.0, 50.0]) if comm.rank == 0 else np.array([50.0, 52.0])
out = np.empty(2)
server.Allreduce(mine, out, op=MPI.SUM)     # the server's three: 0+1+2 and 3 more
if not np.array_equal(out, [3.0, 6.0]):
    bad.append(f"inter Allreduce {out}")
if comm.rank == 1:
    y = np.empty(100)
    server.Recv(y, source=0, tag=3)
    if not np.array_equal(y, np.arange(100.0)):
        bad.append("Recv from server 0")
if comm.rank == 0:
    server.send("got it", dest=0, tag=4)
server.Disconnect()
# errors: each must be an MPI.Exception of the right class, on this process only
checks = [
    ("ERR_PORT", lambda: MPI.COMM_SELF.Connect("not-a-port")),
    ("ERR_PORT", lambda: MPI.COMM_SELF.Connect(port)),      # closed by the server
    ("ERR_NAME", lambda: MPI.Lookup_name(service)),           # unpublished
    ("ERR_SERVICE", lambda: MPI.Unpublish_name(service, port)),
    ("ERR_PORT", lambda: MPI.Close_port(port)),                # not this process's
]
for code, call in checks:
    try:
        call()
        bad.append(f"no {code}")
    except MPI.Exception as exc:
        if exc.Get_error_class() != getattr(MPI, code):
            bad.append(f"{code}: got {exc}")
print(f"client rank {comm.rank} {'ok' if not bad else bad}\n", end="", flush=True)     # one write
