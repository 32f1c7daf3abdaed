"""``MPI.Win`` as mpi4py 4.1.2 + MPICH behave in test_rma.py and test_win.py: the one-item
checks of ``Fetch_and_op`` and ``Compare_and_swap``, ``Shared_query`` of every flavor and
of ``PROC_NULL``, and ``Lock`` of ``PROC_NULL``, of a rank outside the group, and bounded
by ``PYCOMM_TIMEOUT``.

One job per world size (2 and 3 ranks) runs the program below through ``launch.py``; each
rank prints one JSON line: the checks it ran and the failed ones with their traceback.
"""

from __future__ import annotations

import pytest

from mpi_checks import HARNESS, REPORT, run_checks

pytestmark = pytest.mark.usefixtures("no_shared_world")

PROGRAM = r'''
import json, os, time, traceback
import numpy as np
from pycomm import MPI
''' + HARNESS + r'''

@check("Fetch_and_op one item")
def _():
    win = MPI.Win.Allocate(4 * 8, 4, comm=world)
    one, two = np.array([5], "i"), np.array([1, 2], "i")
    prev = np.array([-1], "i")
    target = (rank + 1) % size
    win.Lock(target)
    win.Fetch_and_op(one, prev, target, 1, MPI.SUM)
    win.Unlock(target)
    assert prev[0] == 0
    for origin, result in ((two, prev), (one, np.zeros(2, "i")), (one, np.zeros(1, "q")),
                           (bytearray(4), prev), (one, [bytearray(4), MPI.FLOAT])):
        win.Lock(target)
        exc = raises(ValueError, lambda: win.Fetch_and_op(origin, result, target, 1))
        win.Unlock(target)
        assert isinstance(exc, MPI.Exception), exc
    win.Fetch_and_op(two, prev, MPI.PROC_NULL)      # nothing to check for PROC_NULL
    world.Barrier()
    mine = np.zeros(8, "i")
    win.Lock(rank)
    win.Get(mine, rank)
    win.Unlock(rank)
    assert mine.tolist() == [0, 5, 0, 0, 0, 0, 0, 0], mine   # the bad calls moved nothing
    world.Barrier()
    win.Free()


@check("Compare_and_swap one item")
def _():
    win = MPI.Win.Allocate(8 * 4, 8, comm=world)
    target = (rank + 1) % size
    new, old, res = np.array([7], "q"), np.array([0], "q"), np.array([-1], "q")
    win.Lock(target)
    win.Compare_and_swap(new, old, res, target, 2)          # 0 == 0: swapped
    win.Flush(target)
    win.Compare_and_swap(np.array([9], "q"), old, res, target, 2)   # 7 != 0: kept
    win.Unlock(target)
    assert res[0] == 7, res
    for args in ((np.array([1, 2], "q"), old, res), (new, np.array([0], "i"), res),
                 (new, old, np.zeros(2, "q")), (new, old, np.zeros(1, "d"))):
        win.Lock(target)
        raises(ValueError, lambda: win.Compare_and_swap(*args, target, 2))
        win.Unlock(target)
    world.Barrier()
    mine = np.zeros(4, "q")
    win.Lock(rank)
    win.Get(mine, rank)
    win.Unlock(rank)
    assert mine.tolist() == [0, 0, 7, 0], mine
    world.Barrier()
    win.Free()


@check("Shared_query of every flavor")
def _():
    nbytes = 0 if rank == 0 else 8 + rank          # rank 0 exposes nothing
    win = MPI.Win.Allocate_shared(nbytes, 1, comm=world)
    mem = np.frombuffer(win.tomemory(), np.uint8)
    mem[:] = rank + 1
    world.Barrier()
    for r in range(size):
        got, unit = win.Shared_query(r)
        assert len(got) == (0 if r == 0 else 8 + r) and unit == 1
        assert bytes(got) == bytes([r + 1]) * len(got)
    got, unit = win.Shared_query(MPI.PROC_NULL)    # the lowest rank with memory: 1
    assert bytes(got) == bytes([2]) * 9, bytes(got)
    exc = raises(MPI.Exception, lambda: win.Shared_query(size))
    assert exc.Get_error_class() == MPI.ERR_RANK
    world.Barrier()
    win.Free()
    for make in (lambda: MPI.Win.Allocate(16, 4, comm=world),
                 lambda: MPI.Win.Create(bytearray(16), 4, comm=world)):
        win = make()
        for r in (*range(size), MPI.PROC_NULL):
            got, unit = win.Shared_query(r)        # each process's own memory: none
            assert len(got) == 0 and unit == 4
        win.Free()


@check("Lock PROC_NULL, bad rank, timeout")
def _():
    win = MPI.Win.Allocate(8, comm=world)
    win.Lock(MPI.PROC_NULL)
    win.Put(np.zeros(1), MPI.PROC_NULL)
    win.Unlock(MPI.PROC_NULL)
    for bad in (size, -5):
        exc = raises(MPI.Exception, lambda: win.Lock(bad))
        assert exc.Get_error_class() == MPI.ERR_RANK, exc
    if rank == 0:
        win.Lock(0, MPI.LOCK_EXCLUSIVE)
    world.Barrier()
    if rank == 1:
        os.environ["PYCOMM_TIMEOUT"] = "0.3"
        start = time.monotonic()
        try:
            exc = raises(TimeoutError, lambda: win.Lock(0, MPI.LOCK_SHARED))
        finally:
            del os.environ["PYCOMM_TIMEOUT"]
        took = time.monotonic() - start
        assert 0.25 < took < 3.0, took
        assert isinstance(exc, MPI.Exception) and "PYCOMM_TIMEOUT" in str(exc), exc
        assert 0 not in win._s["locks"]                   # nothing was half taken
    world.Barrier()
    if rank == 0:
        win.Unlock(0)
    world.Barrier()
    win.Lock(0, MPI.LOCK_SHARED)                           # free again for everyone
    win.Unlock(0)
    win.Free()
''' + REPORT

CHECKS = ["Fetch_and_op one item", "Compare_and_swap one item", "Shared_query of every flavor",
          "Lock PROC_NULL, bad rank, timeout"]


@pytest.mark.parametrize("n", [2, 3])
def test_window_behaviours_of_mpi4py_and_mpich(n, tmp_path):
    run_checks(tmp_path, PROGRAM, n, CHECKS, mpi4py=False, timeout=60)