"""Spawn's failures, one after another on the same world (tests/test_mpi_spawn.py):
each case prints "rank R case: ExceptionType: message", then the world must still work."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
py = sys.executable
cases = {
    "no such command": lambda: comm.Spawn("/nonexistent/pycomm-child", maxprocs=2),
    "exits before joining": lambda: comm.Spawn(py, ["-c", "import sys; sys.exit(3)"],
                                               maxprocs=2),
    "root's bad maxprocs": lambda: comm.Spawn(py, ["-c", "pass"],
                                              maxprocs=0 if comm.rank == 0 else 5),
    "root's bad args": lambda: comm.Spawn_multiple([py], [["-c"], ["-c"]], root=1),
    "a child dies": lambda: comm.Spawn(py, ["-c", (
        "from mpi4py import MPI; import os; MPI.Comm.Get_parent(); os._exit(7)")],
        maxprocs=1).recv(source=0),
}


def unbindable():
    # the root's store cannot bind (an address of no interface here): a zmq error at
    # the root, which the others must hear of rather than wait
    import os
    os.environ["PYCOMM_HOST"] = "192.0.2.1"         # TEST-NET-1 (RFC 5737)
    try:
        comm.Spawn(py, ["-c", "pass"], maxprocs=1)
    finally:
        del os.environ["PYCOMM_HOST"]


def never_joins():
    # a child that never imports mpi4py: the root gives up after PYCOMM_TIMEOUT (2 s
    # here), stops it, and every parent hears of it
    import os
    os.environ["PYCOMM_TIMEOUT"] = "2"
    try:
        comm.Spawn(py, ["-c", "import time; time.sleep(60)"], maxprocs=1)
    finally:
        del os.environ["PYCOMM_TIMEOUT"]


cases["the root's store cannot bind"] = unbindable
cases["a child never joins"] = never_joins
for name, case in cases.items():
    try:
        case()
        print(f"rank {comm.rank} {name}: no error\n", end="", flush=True)
    except Exception as exc:            # noqa: BLE001 (the type is what is checked)
        kind = type(exc).__name__
        if isinstance(exc, MPI.Exception):
            kind += f"[{MPI.Get_error_string(exc.Get_error_class())}]"
        print(f"rank {comm.rank} {name}: {kind}: {exc}\n", end="", flush=True)
    assert comm.allreduce(1) == comm.size
print(f"rank {comm.rank} done\n", end="", flush=True)
