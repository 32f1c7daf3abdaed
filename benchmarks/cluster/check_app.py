"""A rank's check of a multi-host job: Allreduce, Bcast and Allgather against numpy.

Prints one line ``OK rank R/S host H local L`` when every result matches, and exits 1 with
the mismatch otherwise (:func:`check` does the checks on any communicator and returns the
line). ``CHECK_FAIL_RANK=R`` makes rank R raise after the first check
(the cross-node abort case); with ``CHECK_FAIL_EARLY=1`` it raises before it joins the
world, so the others wait at start-up and only the launcher can stop them in time.
``CHECK_LOOP_S=T`` repeats the Allreduce for T seconds after the checks (printing
``LOOPING rank R`` first). ``CHECK_GIL_HOG_RANKS=R,.. CHECK_GIL_HOG_S=S``: those ranks run a
thread that keeps calling a C function holding the GIL for S seconds at a time (as a C
extension that does not release it). ``CHECK_SLEEP_RANK=R CHECK_SLEEP_S=S`` adds, after the checks,
one Allreduce that rank R enters S seconds late, spent in user code: half asleep
(``time.sleep``), half on its CPU in C calls that hold the GIL (``sum`` over a range): a
slow peer, which the others must wait for rather than call lost (it prints ``SLEEPING rank
R`` first).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading
import time

import numpy as np

import pycomm


def main() -> int:
    if os.environ.get("CHECK_FAIL_EARLY") and os.environ.get("CHECK_FAIL_RANK") == \
            os.environ.get("PYCOMM_RANK"):
        raise RuntimeError(f"rank {os.environ['PYCOMM_RANK']} fails on purpose on "
                           f"{socket.gethostname()} before joining the world")
    rc, line = check(pycomm.COMM_WORLD)
    print(line, flush=True)
    return rc


def _hog_the_gil(seconds: float) -> None:
    """A daemon thread that keeps sleeping in libc's usleep through ctypes.PyDLL, which
    holds the GIL for the call: ``seconds`` at a time, 50 ms apart."""
    libc = ctypes.PyDLL(None)

    def hog():
        while True:
            libc.usleep(int(seconds * 1e6))
            time.sleep(0.05)
    threading.Thread(target=hog, daemon=True).start()


def check(comm) -> tuple[int, str]:
    """The checks on ``comm`` (a world however made: pycomm.ray runs them on actors);
    (0, the OK line) or (1, the first mismatch)."""
    rank, size = comm.rank, comm.size
    if str(rank) in os.environ.get("CHECK_GIL_HOG_RANKS", "").split(","):
        _hog_the_gil(float(os.environ.get("CHECK_GIL_HOG_S", "1")))
    n = 1000
    mine = np.arange(n, dtype=np.float64) * (rank + 1)
    total = np.empty_like(mine)
    comm.Allreduce(mine, total, op=pycomm.SUM)
    want = np.arange(n, dtype=np.float64) * (size * (size + 1) // 2)
    if not np.array_equal(total, want):
        return 1, f"BAD Allreduce rank {rank}"
    if os.environ.get("CHECK_FAIL_RANK") == str(rank):
        raise RuntimeError(f"rank {rank} fails on purpose on {socket.gethostname()}")
    for root in range(size):
        buf = np.arange(n, dtype=np.int32) + root if rank == root else np.zeros(n, np.int32)
        comm.Bcast(buf, root=root)
        if not np.array_equal(buf, np.arange(n, dtype=np.int32) + root):
            return 1, f"BAD Bcast root {root} rank {rank}"
    got = np.empty(size * 3, dtype=np.int64)
    comm.Allgather(np.full(3, rank, dtype=np.int64), got)
    if not np.array_equal(got, np.repeat(np.arange(size, dtype=np.int64), 3)):
        return 1, f"BAD Allgather rank {rank}: {got}"
    sleeper = os.environ.get("CHECK_SLEEP_RANK")
    if sleeper is not None:
        if sleeper == str(rank):
            print(f"SLEEPING rank {rank}", flush=True)
            late_s = float(os.environ.get("CHECK_SLEEP_S", "0"))
            time.sleep(late_s / 2)
            busy_until = time.monotonic() + late_s / 2
            while time.monotonic() < busy_until:
                sum(range(10**6))
        comm.Allreduce(mine, total, op=pycomm.SUM)
        if not np.array_equal(total, want):
            return 1, f"BAD Allreduce after the sleep, rank {rank}"
    loop_s = float(os.environ.get("CHECK_LOOP_S", "0"))
    if loop_s:              # keep the link busy (the link-failure case pulls it meanwhile)
        print(f"LOOPING rank {rank}", flush=True)
        end = time.monotonic() + loop_s
        going = np.ones(1, dtype=np.int64)
        while going[0]:                 # rank 0's clock decides, so all stop together
            comm.Allreduce(mine, total, op=pycomm.SUM)
            time.sleep(0.01)
            if rank == 0:
                going[0] = time.monotonic() < end
            comm.Bcast(going, root=0)
    hosts = comm.allgather(socket.gethostname())
    comm.Barrier()
    lay = comm.host_layout
    groups = "|".join(",".join(map(str, g)) for g in lay.hosts)
    return 0, (f"OK rank {rank}/{size} host {socket.gethostname()} hosts {','.join(hosts)} "
               f"transport {getattr(comm, 'transport_name', '?')} layout {groups} "
               f"names {','.join(lay.names)} local {lay.local_rank}/{lay.local_size}")


if __name__ == "__main__":
    sys.exit(main())
