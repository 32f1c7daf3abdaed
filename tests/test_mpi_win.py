"""``MPI.Win`` (one-sided windows over shared memory) on real worlds: results against numpy,
and nothing left in /dev/shm, after a window is freed or when its creation fails.

Sizes come from the shared ``world_small`` fixture (non-powers of two among them).
"""

from __future__ import annotations

import glob
import sys

import cloudpickle
import numpy as np

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _window_files() -> list[str]:
    import pycomm
    job = pycomm.init()._engine.job_id
    return sorted(glob.glob(f"/dev/shm/pycomm-{job}-win-*"))


def _rank_put_get_accumulate():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad = []
    win = MPI.Win.Allocate(8 * (size + 1), 8, comm=comm)   # size + 1 float64 per rank
    mem = np.frombuffer(win.tomemory(), np.float64)
    win.Fence()
    files_open = _window_files()        # every rank is past Allocate: each unlinked its own
    mem[:] = 0.0
    win.Fence()
    # every rank puts its rank + 1 at its own index on the next rank, and accumulates
    # (SUM) 10 * (rank + 1) into the last element of every rank (no element both put
    # and accumulated in one epoch: MPI leaves that undefined)
    right = (rank + 1) % size
    win.Put(np.array([rank + 1.0]), right, target=rank)
    for target in range(size):
        win.Accumulate(np.array([10.0 * (rank + 1)]), target, target=size, op=MPI.SUM)
    win.Fence()
    want = np.zeros(size + 1)
    left = (rank - 1) % size
    want[left] += left + 1.0
    want[size] = 10.0 * size * (size + 1) / 2
    if not np.array_equal(mem, want):
        bad.append(f"rank {rank}: window {mem.tolist()} want {want.tolist()}")
    got = np.zeros(size + 1)
    win.Get(got, right)                 # the right neighbour's whole window
    win.Fence()
    want_right = np.zeros(size + 1)
    want_right[rank] += rank + 1.0
    want_right[size] = 10.0 * size * (size + 1) / 2
    if not np.array_equal(got, want_right):
        bad.append(f"rank {rank}: Get {got.tolist()} want {want_right.tolist()}")
    win.Free()
    return bad, files_open


def test_put_get_accumulate_give_numpys_answer_and_leave_no_file(world_small):
    for bad, files_open in world_small.run(_rank_put_get_accumulate):
        assert bad == []
        assert files_open == []         # unlinked once every rank mapped them
    assert all(not f for f in world_small.run(_window_files))


def _rank_failed_creation(everyone: bool):
    comm = MPI.COMM_WORLD
    # an invalid size raises before any file is made; when only the last rank passes it,
    # the others' collective set-up of the window meets that rank's next call instead (a
    # mismatch, on every rank that sees it), and the world is in step again after
    bad_rank = everyone or comm.rank == comm.size - 1
    errors = []
    for step in (lambda: MPI.Win.Allocate(-1 if bad_rank else 64, 1, comm=comm),
                 comm.Barrier):
        try:
            step()
        except Exception as exc:    # noqa: BLE001 - which error is the layer's business
            errors.append(type(exc).__name__)
    # a mismatch abandons its call and the next on every rank: in step within two calls
    for _ in range(2):
        try:
            comm.Barrier()
            break
        except Exception:   # noqa: BLE001
            pass
    comm.Barrier()
    return errors, _window_files()


def test_a_failed_window_creation_leaves_no_file_and_the_world_works(world_small):
    for everyone in (True, False):
        results = world_small.run(_rank_failed_creation, everyone)
        for rank, (errors, files) in enumerate(results):
            assert errors and (errors[0] == "ArgumentError") == (everyone or rank ==
                                                                len(results) - 1), results
            assert files == [], results


def _rank_bad_arguments():
    win = MPI.Win.Allocate(64, 1, comm=MPI.COMM_WORLD)
    caught = []
    for call in (lambda: win.Get_attr(MPI.KEYVAL_INVALID),
                 lambda: win.Set_attr(MPI.KEYVAL_INVALID, 1),
                 lambda: win.Put(bytearray(4), 0, (0, 4, MPI.BYTE, None)),  # 4 items
                 lambda: win.Put(bytearray(4), 0, {0: 4})):                 # not a spec
        try:
            win.Fence()
            call()
        except MPI.Exception as exc:
            caught.append((isinstance(exc, ValueError), exc.Get_error_class()))
    win.Fence()
    win.Free()
    return caught


def test_bad_keyvals_and_target_specs_raise_as_mpi4py_expects(world_small):
    # (mpi4py's test_exceptions TestExcWin.testKeyvalInvalid, test_msgspec
    # TestMessageRMA.testMessageBad)
    for caught in world_small.run(_rank_bad_arguments):
        assert caught == [(True, MPI.ERR_KEYVAL)] * 2 + [(True, MPI.ERR_ARG)] * 2, caught
