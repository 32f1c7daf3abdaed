"""The one-sided algorithms under :mod:`mpi4py.util.sync` (pycomm's): windows of C ints,
a bounded poll of this rank's memory, the queue lock of ``Mutex`` and the wait queue of
``Condition``.

Queue lock (Mellor-Crummey and Scott, "Algorithms for scalable synchronization on
shared-memory multiprocessors", ACM TOCS 9(1), 1991): rank 0 holds the queue's *tail*,
every rank a *grant* and a *next* item. Acquiring resets this rank's items, swaps this
rank into the tail (``Fetch_and_op`` ``REPLACE``; ``Compare_and_swap`` against
``PROC_NULL`` when not blocking) and, if a predecessor was there, writes this rank into
the predecessor's *next* and polls its own *grant*. Releasing swaps ``PROC_NULL`` into
the tail if it still names this rank; otherwise a successor swapped itself in after this
rank, so it polls its own *next* until the successor has linked, and sets the
successor's *grant*. Ranks get the lock in the order their swaps reached the tail.

Wait queue: rank 0's window holds a length and up to ``size`` ranks in arrival order,
changed only by ranks that hold the condition's mutex; each rank's window holds a flag
that ``notify`` sets and the waiting rank consumes (read and cleared in one atomic
``REPLACE``). All epochs are shared locks (``Lock_all`` or ``LOCK_SHARED``): a rank
polling its own memory must never block another rank's access to it.
"""

from __future__ import annotations

import array as _array
import time as _time

from pycomm import config as _config
from pycomm.errors import CommTimeoutError as _CommTimeoutError
from pycomm.MPI.exceptions import mpi_error as _mpi_error

from .. import MPI

__all__ = ["HOST", "NULL", "ints", "lock_enter", "lock_leave", "lock_window", "poll",
           "queue_push", "queue_take", "queue_window", "sleep", "wake", "window_of"]

NULL = MPI.PROC_NULL
HOST = 0                        # the rank whose window holds a queue's shared part
GRANT, NEXT, TAIL = 0, 1, 2     # queue lock items (TAIL on HOST only)
FLAG, LEN, QUEUE = 0, 1, 2      # wait queue items (LEN and QUEUE on HOST only)


def ints(*values: int) -> _array.array:
    """An ``array('i')`` of ``values`` (a C-int message)."""
    return _array.array("i", values)


def window_of(comm, values: list[int], info) -> MPI.Win:
    """A window of C ints holding ``values`` on this rank (collective: ends in a
    barrier, so that every rank's items are set before anyone uses the window)."""
    unit = MPI.INT.Get_size()
    window = MPI.Win.Allocate(len(values) * unit, unit, info, comm)
    me = window.group_rank
    window.Lock(me, MPI.LOCK_EXCLUSIVE)
    window.Put(_array.array("i", values), me, 0)
    window.Unlock(me)
    comm.Barrier()
    return window


def lock_window(comm, info) -> MPI.Win:
    """The window of a queue lock (collective): free, nobody queued."""
    return window_of(comm, [0, NULL, NULL][:3 if comm.Get_rank() == HOST else 2], info)


def queue_window(comm, info) -> MPI.Win:
    """The window of a wait queue (collective): empty, no flag set."""
    host = comm.Get_rank() == HOST
    return window_of(comm, [0, 0] + [NULL] * comm.Get_size() if host else [0], info)


def poll(window, index: int, until, timeout, what: str, clear=None) -> int:
    """Read int item ``index`` of this rank's window until ``until(value)``; return it.

    Runs inside an access epoch on this rank, sleeping 10 us doubling to 1 ms between
    reads. ``clear``: swap this value in as the item is read (``REPLACE``).

    Raises:
        MPI.Exception: ``ERR_PENDING`` (a ``TimeoutError``) past ``timeout`` seconds
            (None: ``PYCOMM_TIMEOUT``).
    """
    me, out = window.group_rank, ints(0)
    source, op = (ints(0), MPI.NO_OP) if clear is None else (ints(clear), MPI.REPLACE)
    limit = _config.get("PYCOMM_TIMEOUT") if timeout is None else timeout
    deadline, delay = _time.monotonic() + limit, 0.0
    while True:
        window.Fetch_and_op(source, out, me, index, op)
        if until(out[0]):
            return out[0]
        if _time.monotonic() > deadline:
            raise _mpi_error(_CommTimeoutError, "ERR_PENDING", f"mpi4py.util.sync: rank "
                             f"{me} of {window.group_size}: {what}: waited over {limit} s "
                             "(timeout= or PYCOMM_TIMEOUT); the object's state is now "
                             "undefined")
        _time.sleep(delay)
        delay = min(1e-3, max(1e-5, delay * 2))


def lock_enter(window, blocking: bool, timeout) -> bool:
    """Join the lock's queue; with ``blocking``, wait for the grant. Whether it is held."""
    me = window.group_rank
    window.Lock_all()
    try:
        # this rank's items first: a successor may link here once the swap is done
        window.Accumulate(ints(NULL), me, NEXT, MPI.REPLACE)
        window.Accumulate(ints(0), me, GRANT, MPI.REPLACE)
        prev = ints(NULL)
        if blocking:
            window.Fetch_and_op(ints(me), prev, HOST, TAIL, MPI.REPLACE)
        else:
            window.Compare_and_swap(ints(me), ints(NULL), prev, HOST, TAIL)
        window.Flush(HOST)
        if prev[0] == NULL or not blocking:
            return prev[0] == NULL
        window.Accumulate(ints(me), prev[0], NEXT, MPI.REPLACE)
        window.Flush(prev[0])
        poll(window, GRANT, lambda v: v != 0, timeout,
             f"Mutex.acquire waiting for rank {prev[0]} to pass it on")
        return True
    finally:
        window.Unlock_all()


def lock_leave(window, timeout) -> None:
    """Hand the lock to the next rank of the queue, or leave it free."""
    me = window.group_rank
    window.Lock_all()
    try:
        prev = ints(NULL)
        window.Compare_and_swap(ints(NULL), ints(me), prev, HOST, TAIL)
        window.Flush(HOST)
        if prev[0] != me:               # a rank queued behind this one: wait for its link
            successor = poll(window, NEXT, lambda v: v != NULL, timeout,
                             "Mutex.release waiting for the next rank to link")
            window.Accumulate(ints(1), successor, GRANT, MPI.REPLACE)
    finally:
        window.Unlock_all()


def queue_push(window, rank: int) -> None:
    """Append ``rank`` to the wait queue (the caller holds the mutex)."""
    length = ints(0)
    window.Lock(HOST, MPI.LOCK_SHARED)
    window.Get(length, HOST, LEN)
    window.Flush(HOST)
    window.Put(ints(rank), HOST, QUEUE + length[0])
    window.Put(ints(length[0] + 1), HOST, LEN)
    window.Unlock(HOST)


def queue_take(window, n: int) -> list[int]:
    """Remove and return the first ``n`` ranks of the wait queue (the caller holds the
    mutex)."""
    length = ints(0)
    window.Lock(HOST, MPI.LOCK_SHARED)
    try:
        window.Get(length, HOST, LEN)
        window.Flush(HOST)
        if not length[0] or n <= 0:
            return []
        queue = _array.array("i", [0] * length[0])
        window.Get(queue, HOST, QUEUE)
        window.Flush(HOST)
        taken, rest = list(queue[:n]), queue[n:]
        if rest:
            window.Put(rest, HOST, QUEUE)
        window.Put(ints(len(rest)), HOST, LEN)
        return taken
    finally:
        window.Unlock(HOST)


def wake(window, ranks: list[int]) -> None:
    """Set the flag of each of ``ranks``."""
    if ranks:
        window.Lock_all()
        for rank in ranks:
            window.Accumulate(ints(1), rank, FLAG, MPI.REPLACE)
        window.Unlock_all()


def sleep(window, timeout) -> None:
    """Wait until this rank's flag is set, and clear it."""
    me = window.group_rank
    window.Lock(me, MPI.LOCK_SHARED)
    try:
        poll(window, FLAG, lambda v: v != 0, timeout, "Condition.wait waiting for a "
             "notify", clear=0)
    finally:
        window.Unlock(me)
