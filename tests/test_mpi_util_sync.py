"""``mpi4py.util.sync`` on pycomm (pycomm/MPI/_alias/mpi4py/util/sync.py) under
``launch.py --mpi4py``.

One job per world size (2 and 3 ranks) runs the program below on every rank: the order
:class:`Sequential` gives, :class:`Counter` values (start, step, type codes, root, reading
with 0), :class:`Mutex` exclusion measured with a non-atomic read-modify-write of a
shared window that loses updates without it, recursion counts, the one winner of a
non-blocking race, a bounded wait, :class:`Condition` notify counts and wake-ups,
:class:`Semaphore` permits, and the errors of bad input and of freed objects. Each rank
prints one JSON line: the checks it ran and the failed ones with their traceback.
"""

from __future__ import annotations

import pytest

from mpi_checks import HARNESS, REPORT, run_checks

pytestmark = pytest.mark.usefixtures("no_shared_world")

PROGRAM = r'''
import json, time, traceback
import numpy as np
from mpi4py import MPI
from mpi4py.util import sync
''' + HARNESS + r'''

def unsafe_increments(lock, times):
    """Read rank 0's int, wait, write it + 1: updates are lost unless ``lock`` excludes."""
    win = MPI.Win.Allocate_shared(4 if rank == 0 else 0, 4, comm=world)
    cell = np.frombuffer(win.Shared_query(0)[0], "i")
    if rank == 0:
        cell[0] = 0
    world.Barrier()
    for _ in range(times):
        with lock:
            value = int(cell[0])
            time.sleep(0.002)
            cell[0] = value + 1
    world.Barrier()
    total = int(cell[0])
    world.Barrier()
    win.Free()
    return total


@check("Sequential order")
def _():
    order = MPI.Win.Allocate_shared(4 * size if rank == 0 else 0, 4, comm=world)
    slots = np.frombuffer(order.Shared_query(0)[0], "i")
    counter = sync.Counter(comm=world)
    with sync.Sequential(world, tag=5):
        turn = next(counter)
        time.sleep(0.01 * (size - rank))       # a later rank must still wait its turn
        slots[turn] = rank
    counter.free()
    world.Barrier()
    assert turn == rank and slots.tolist() == list(range(size)), (turn, slots)
    world.Barrier()
    order.Free()
    raises(ValueError, lambda: sync.Sequential(world, tag=-1))
    raises(TypeError, lambda: sync.Sequential("world"))


@check("Counter values")
def _():
    for kwargs, want in (({}, range(4 * size)), ({"start": 7}, range(7, 7 + 4 * size)),
                         ({"step": 3}, range(0, 12 * size, 3)),
                         ({"typecode": "d", "start": 0.5}, np.arange(4 * size) + 0.5),
                         ({"typecode": "h", "root": size - 1}, range(4 * size)),
                         # fixed-size codes: the array's item is the type's size
                         ({"typecode": "i8", "start": 1 << 40},
                          range(1 << 40, (1 << 40) + 4 * size)),
                         ({"typecode": "u2", "start": 60000}, range(60000, 60000 + 4 * size))):
        counter = sync.Counter(comm=world, **kwargs)
        mine = [next(counter) for _ in range(4)]
        got = sorted(sum(world.allgather(mine), []))
        world.Barrier()
        assert counter.next(0) == kwargs.get("start", 0) + 4 * size * kwargs.get("step", 1)
        counter.free()
        assert got == list(want), (kwargs, got)
    counter = sync.Counter(comm=world)
    counter.free()
    counter.free()                                    # freeing twice is fine
    raises(RuntimeError, counter.next)
    raises(ValueError, lambda: sync.Counter(comm=world, root=size))   # before Allocate
    raises(ValueError, lambda: sync.Counter(comm=world, typecode="G"))  # no array code
    raises(TypeError, lambda: sync.Counter(comm=None))


@check("Mutex exclusion")
def _():
    mutex = sync.Mutex(comm=world)
    assert unsafe_increments(mutex, 10) == 10 * size
    mutex.free()


@check("Mutex states and errors")
def _():
    mutex = sync.Mutex(comm=world)
    assert not mutex.locked() and mutex.count() == 0
    raises(RuntimeError, mutex.release)
    with mutex:
        assert mutex.locked() and mutex.count() == 1
        raises(RuntimeError, mutex.acquire)
    world.Barrier()
    won = mutex.acquire(blocking=False)
    world.Barrier()
    assert sum(world.allgather(won)) == 1
    if won:
        mutex.release()
    world.Barrier()
    while not mutex.acquire(blocking=False):
        pass
    mutex.release()
    world.Barrier()
    mutex.acquire()
    mutex.free()                                      # releases it, then frees
    mutex.free()
    for call in (mutex.acquire, mutex.release, mutex.locked, mutex.count):
        raises(RuntimeError, call)
    raises(ValueError, lambda: sync.Mutex(comm=world, timeout=0))


@check("Mutex recursive")
def _():
    mutex = sync.Mutex(recursive=True, comm=world)
    with mutex:
        with mutex:
            assert mutex.acquire(blocking=False) and mutex.count() == 3
            mutex.release()
            assert mutex.count() == 2
        assert mutex.count() == 1 and mutex.locked()
    assert mutex.count() == 0 and not mutex.locked()
    assert unsafe_increments(mutex, 5) == 5 * size
    mutex.free()


@check("Mutex wait is bounded")
def _():
    mutex = sync.Mutex(comm=world, timeout=0.3)
    if rank == 0:
        mutex.acquire()
    world.Barrier()
    if rank == 1:
        start = time.monotonic()
        exc = raises(TimeoutError, mutex.acquire)
        took = time.monotonic() - start
        assert 0.25 < took < 3.0, took
        assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_PENDING
    world.Barrier()
    if rank == 0:
        mutex.release()
    world.Barrier()
    mutex.free()


@check("Condition notify and wait")
def _():
    for make in (lambda: (sync.Condition(comm=world), None),
                 lambda: (lambda m: (sync.Condition(m), m))(sync.Mutex(comm=world))):
        cv, mutex = make()
        raises(RuntimeError, cv.wait)
        raises(RuntimeError, cv.notify)
        notifier = size - 1             # rank 0 (the queue's host) waits as well
        if rank == notifier:
            with cv:
                assert cv.notify() == 0 and cv.notify_all() == 0    # nobody waits yet
        world.Barrier()
        if rank == notifier:
            woken = 0
            deadline = time.monotonic() + 20
            while woken < size - 1 and time.monotonic() < deadline:
                with cv:
                    woken += cv.notify()
            assert woken == size - 1, woken
        else:
            with cv:
                assert cv.wait() is True and cv.locked()
        world.Barrier()
        if rank == notifier:
            with cv:
                assert cv.notify_all() == 0
        world.Barrier()
        cv.free()
        cv.free()
        for call in (cv.acquire, cv.release, cv.wait, cv.notify, cv.notify_all):
            raises(RuntimeError, call)
        if mutex is not None:
            assert not mutex.locked()
            mutex.free()
    raises(TypeError, lambda: sync.Condition("mutex"))


@check("Condition wait_for")
def _():
    cv = sync.Condition(comm=world)
    flag, done = sync.Counter(comm=world), sync.Counter(comm=world)
    world.Barrier()
    if rank == 0:
        time.sleep(0.05)                              # let the others start waiting
        with cv:
            flag.next(1)                              # the predicate becomes true
        deadline = time.monotonic() + 20
        while done.next(0) < size - 1 and time.monotonic() < deadline:
            with cv:
                cv.notify_all()
        assert done.next(0) == size - 1
    else:
        with cv:
            assert cv.wait_for(lambda: flag.next(0) == 1) is True
        done.next(1)
    world.Barrier()
    done.free()
    flag.free()
    cv.free()


@check("Semaphore permits")
def _():
    value = max(1, size - 1)
    sem = sync.Semaphore(value, comm=world)
    world.Barrier()
    got = sem.acquire(blocking=False)
    world.Barrier()
    assert sum(world.allgather(got)) == value
    if got:
        sem.release()
    world.Barrier()
    raises(ValueError, sem.release)                   # bounded: over the initial value
    raises(ValueError, lambda: sem.release(0))
    world.Barrier()                                   # (before anyone takes a permit)
    with sem:
        pass
    sem.free()
    sem.free()
    raises(RuntimeError, sem.acquire)
    raises(RuntimeError, sem.release)
    raises(ValueError, lambda: sync.Semaphore(-1, comm=world))
    one = sync.Semaphore(1, comm=world)
    assert unsafe_increments(one, 5) == 5 * size
    one.free()
''' + REPORT

CHECKS = ["Sequential order", "Counter values", "Mutex exclusion", "Mutex states and errors",
          "Mutex recursive", "Mutex wait is bounded", "Condition notify and wait",
          "Condition wait_for", "Semaphore permits"]


@pytest.mark.parametrize("n", [2, 3])
def test_util_sync(n, tmp_path):
    run_checks(tmp_path, PROGRAM, n, CHECKS)