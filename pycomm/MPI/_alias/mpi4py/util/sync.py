"""``mpi4py.util.sync`` for pycomm: synchronization of the ranks of a communicator.

The names, signatures and semantics of mpi4py 4.1.2's module, built on
:class:`pycomm.MPI.Win` (one-sided operations; pycomm's windows are shared memory, so
every rank of ``comm`` is on one host):

* :class:`Sequential` -- a block the ranks run one after another, in rank order
  (a zero-byte message from each rank to the next);
* :class:`Counter` -- a shared counter, one item on the rank ``root``, advanced
  with ``Fetch_and_op`` (``SUM``; ``NO_OP`` to read it);
* :class:`Mutex` -- a FIFO queue lock (Mellor-Crummey and Scott's; see
  :mod:`._syncrma`); ``recursive=True`` counts re-entries on this rank;
* :class:`Condition` -- a condition variable over a :class:`Mutex`: waiting ranks
  queue in arrival order on rank 0 and sleep on a flag that ``notify`` sets;
* :class:`Semaphore` -- a :class:`Counter` guarded by a :class:`Condition`.

Creating and freeing an object is collective over ``comm``; the other calls are not.
Every wait polls its own window memory with a backoff (10 us doubling to 1 ms) and
is bounded: a wait longer than ``timeout`` (keyword-only, default ``PYCOMM_TIMEOUT``)
raises ``MPI.Exception`` of class ``ERR_PENDING`` (also a :class:`TimeoutError`),
after which the object's queue is undefined: free it.
"""

from __future__ import annotations

import array as _array

from .. import MPI
from . import _syncrma as _rma

__all__ = ["Sequential", "Counter", "Mutex", "Condition", "Semaphore"]


def _comm_rank(comm, where: str) -> tuple[int, int]:
    """``(rank, size)`` of an intracommunicator, checked before anything moves."""
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{where}: comm must be an intracommunicator, got {comm!r}")
    return comm.Get_rank(), comm.Get_size()


def _timeout(timeout, where: str) -> float | None:
    if timeout is not None and not float(timeout) > 0:
        raise ValueError(f"{where}: timeout must be > 0 seconds, got {timeout!r}")
    return None if timeout is None else float(timeout)


class _Held:
    """``with obj:`` acquires and releases."""

    def __enter__(self):
        """Acquire (``acquire()``)."""
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        """Release (``release()``)."""
        self.release()


class Sequential:
    """A block that the ranks of ``comm`` execute one at a time, in rank order."""

    def __init__(self, comm, tag: int = 0):
        """Initialize sequential execution.

        Args:
            comm: Intracommunicator context.
            tag: Tag of the zero-byte messages that pass the turn (>= 0).

        Raises:
            TypeError: ``comm`` is not an intracommunicator, ``tag`` not an integer.
            ValueError: ``tag`` is negative.
        """
        _comm_rank(comm, "Sequential")
        self.comm = comm
        self.tag = int(tag)
        if self.tag < 0:
            raise ValueError(f"Sequential: tag must be >= 0, got {tag!r}")

    def __enter__(self) -> Sequential:
        """Enter sequential execution (:meth:`begin`)."""
        self.begin()
        return self

    def __exit__(self, *exc) -> None:
        """Exit sequential execution (:meth:`end`)."""
        self.end()

    def begin(self) -> None:
        """Wait for the turn: the previous rank's :meth:`end` (not rank 0).

        Raises:
            MPI.Exception: the wait exceeded ``PYCOMM_TIMEOUT`` or the rank died.
        """
        rank = self.comm.Get_rank()
        if rank > 0:
            self.comm.Recv([bytearray(0), 0, MPI.BYTE], rank - 1, self.tag)

    def end(self) -> None:
        """Pass the turn to the next rank (not the last rank)."""
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        if rank < size - 1:
            self.comm.Send([b"", 0, MPI.BYTE], rank + 1, self.tag)


class Counter:
    """A counter that every rank of ``comm`` advances atomically."""

    def __init__(self, start=0, step=1, *, typecode: str = "i", comm=MPI.COMM_SELF,
                 info=MPI.INFO_NULL, root: int = 0):
        """Initialize the counter (collective over ``comm``).

        Args:
            start: Start value.
            step: Increment value of :meth:`next` without an argument.
            typecode: Type code of the counter, as in the ``array`` module.
            comm: Intracommunicator context.
            info: Info object for the window's creation.
            root: Process rank holding the counter memory.

        Raises:
            TypeError: ``comm`` is not an intracommunicator, ``start`` not a number of
                the type.
            ValueError: ``root`` is not a rank of ``comm``, ``typecode`` names no MPI
                datatype or none of the ``array`` module (all before any window).
        """
        rank, size = _comm_rank(comm, "Counter")
        datatype = MPI.Datatype.fromcode(typecode)
        self._typechar = datatype.typechar
        init = _array.array(self._typechar, [start])
        root = int(root)
        if not 0 <= root < size:
            raise ValueError(f"Counter: root {root} is not a rank of the communicator "
                             f"(size {size})")
        unit = datatype.Get_size()
        here = 1 if rank == root else 0
        self._window = MPI.Win.Allocate(here * unit, unit, info, comm)
        self._start, self._step = start, step
        self._root, self._comm = root, comm
        if here:
            self._window.Lock(rank, MPI.LOCK_EXCLUSIVE)
            self._window.Accumulate(init, rank, op=MPI.REPLACE)
            self._window.Unlock(rank)
        comm.Barrier()

    def __iter__(self) -> Counter:
        """Implement ``iter(self)``."""
        return self

    def __next__(self):
        """Implement ``next(self)``: :meth:`next` by the step."""
        return self.next()

    def next(self, incr=None):
        """Return the current value and advance the counter, atomically.

        Args:
            incr: Increment value (default: the step; 0 reads without changing it).

        Returns:
            The counter value before incrementing.

        Raises:
            RuntimeError: the counter was freed.
        """
        if not self._window:
            raise RuntimeError("counter already freed")
        incr = self._step if incr is None else incr
        delta = _array.array(self._typechar, [incr])
        prev = _array.array(self._typechar, [0])
        window, root = self._window, self._root
        window.Lock(root, MPI.LOCK_SHARED)
        window.Fetch_and_op(delta, prev, root, 0, MPI.SUM if delta[0] != 0 else MPI.NO_OP)
        window.Unlock(root)
        return prev[0]

    def free(self) -> None:
        """Free the counter (collective; a freed counter stays freed)."""
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        if window:
            window.Free()


class Mutex(_Held):
    """Mutual exclusion among the ranks of ``comm``, granted in request order."""

    def __init__(self, *, recursive: bool = False, comm=MPI.COMM_SELF,
                 info=MPI.INFO_NULL, timeout: float | None = None):
        """Initialize the mutex (collective over ``comm``).

        Args:
            recursive: Whether to allow recursive acquisition.
            comm: Intracommunicator context.
            info: Info object for the window's creation.
            timeout: pycomm's keyword: seconds a wait may last (default
                ``PYCOMM_TIMEOUT``).

        Raises:
            TypeError: ``comm`` is not an intracommunicator.
            ValueError: ``timeout`` is not positive.
        """
        _comm_rank(comm, "Mutex")
        self._timeout = _timeout(timeout, "Mutex")
        self._recursive = bool(recursive)
        self._count = 0                 # this rank's holds (0: not held)
        self._window = _rma.lock_window(comm, info)
        self._comm = comm

    def _alive(self) -> MPI.Win:
        if not self._window:
            raise RuntimeError("mutex already freed")
        return self._window

    # what Condition.wait needs: give the mutex up entirely, then take it back as it was
    def _release_save(self) -> int:
        state, self._count = self._count, 0
        _rma.lock_leave(self._window, self._timeout)
        return state

    def _acquire_restore(self, state: int) -> None:
        _rma.lock_enter(self._window, True, self._timeout)
        self._count = state

    def acquire(self, blocking: bool = True) -> bool:
        """Acquire the mutex, blocking or non-blocking.

        Args:
            blocking: If `True`, block until the mutex is held.

        Returns:
            `True` if the mutex is held, `False` otherwise.

        Raises:
            RuntimeError: freed, or held already by this rank (not recursive).
            MPI.Exception: ``ERR_PENDING``, the wait exceeded the timeout.
        """
        self._alive()
        if self._count:
            if not self._recursive:
                raise RuntimeError("cannot acquire already held mutex")
            self._count += 1
            return True
        held = _rma.lock_enter(self._window, bool(blocking), self._timeout)
        self._count = int(held)
        return held

    def release(self) -> None:
        """Release the mutex (once, for a recursive one).

        Raises:
            RuntimeError: freed, or not held by this rank.
        """
        self._alive()
        if not self._count:
            raise RuntimeError("cannot release unheld mutex")
        self._count -= 1
        if not self._count:
            _rma.lock_leave(self._window, self._timeout)

    def locked(self) -> bool:
        """Return whether this rank holds the mutex.

        Raises:
            RuntimeError: freed.
        """
        self._alive()
        return self._count > 0

    def count(self) -> int:
        """Return the recursion count (0: not held).

        Raises:
            RuntimeError: freed.
        """
        self._alive()
        return self._count

    def free(self) -> None:
        """Free the mutex (collective), releasing it first if this rank holds it."""
        if self._window and self._count:
            self._release_save()
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        if window:
            window.Free()


class Condition(_Held):
    """A condition variable: ranks wait under a :class:`Mutex` until notified."""

    def __init__(self, mutex: Mutex | None = None, *, recursive: bool = True,
                 comm=MPI.COMM_SELF, info=MPI.INFO_NULL, timeout: float | None = None):
        """Initialize the condition variable (collective over the mutex's ``comm``).

        Args:
            mutex: Mutual exclusion object (None: a new one over ``comm``).
            recursive: Whether the new mutex allows recursive acquisition.
            comm: Intracommunicator context (ignored with a ``mutex``: its own).
            info: Info object for the windows' creation.
            timeout: pycomm's keyword: seconds a wait may last (default
                ``PYCOMM_TIMEOUT``).

        Raises:
            TypeError: ``mutex`` is not a :class:`Mutex`, ``comm`` not an
                intracommunicator.
            RuntimeError: ``mutex`` was freed.
        """
        if mutex is None:
            _comm_rank(comm, "Condition")
            self._mutex = Mutex(recursive=recursive, comm=comm, info=info, timeout=timeout)
            self._own_mutex = True
        elif not isinstance(mutex, Mutex):
            raise TypeError(f"Condition: mutex must be a sync.Mutex, got {mutex!r}")
        else:
            mutex._alive()
            comm, self._mutex, self._own_mutex = mutex._comm, mutex, False
        self._timeout = _timeout(timeout, "Condition")
        self._window = _rma.queue_window(comm, info)
        self._comm = comm

    def _alive(self, need_lock: str = "") -> MPI.Win:
        if not self._window:
            raise RuntimeError("condition already freed")
        if need_lock and not self._mutex.locked():
            raise RuntimeError(f"cannot {need_lock} on unheld mutex")
        return self._window

    def acquire(self, blocking: bool = True) -> bool:
        """Acquire the underlying mutex (:meth:`Mutex.acquire`).

        Raises:
            RuntimeError: the condition was freed.
        """
        self._alive()
        return self._mutex.acquire(blocking)

    def release(self) -> None:
        """Release the underlying mutex (:meth:`Mutex.release`).

        Raises:
            RuntimeError: the condition was freed.
        """
        self._alive()
        self._mutex.release()

    def locked(self) -> bool:
        """Return whether this rank holds the underlying mutex."""
        return self._mutex.locked()

    def wait(self) -> bool:
        """Release the mutex, wait until notified, and take the mutex back.

        Returns:
            Always `True`.

        Raises:
            RuntimeError: freed, or the mutex is not held.
            MPI.Exception: ``ERR_PENDING``, the wait exceeded the timeout.
        """
        window = self._alive("wait")
        _rma.queue_push(window, window.group_rank)
        state = self._mutex._release_save()
        _rma.sleep(window, self._timeout)
        self._mutex._acquire_restore(state)
        return True

    def wait_for(self, predicate):
        """Wait until a predicate evaluates to true.

        Args:
            predicate: callable returning a boolean, called with the mutex held.

        Returns:
            The result of predicate once it evaluates to true.

        Raises:
            RuntimeError: as :meth:`wait`, when it has to wait.
        """
        result = predicate()
        while not result:
            self.wait()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> int:
        """Wake up the ``n`` ranks that have waited longest (fewer if fewer wait).

        Args:
            n: Maximum number of processes to wake up.

        Returns:
            The actual number of processes woken up.

        Raises:
            RuntimeError: freed, or the mutex is not held.
        """
        window = self._alive("notify")
        ranks = _rma.queue_take(window, max(0, min(int(n), window.group_size)))
        _rma.wake(window, ranks)
        return len(ranks)

    def notify_all(self) -> int:
        """Wake up all processes waiting on this condition.

        Returns:
            The actual number of processes woken up.
        """
        return self.notify(self._alive("notify").group_size)

    def free(self) -> None:
        """Free the condition (collective): release the mutex if this rank holds it,
        free the mutex if the condition made it."""
        if not self._window:
            return
        if self._mutex._window and self._mutex.locked():
            self._mutex._release_save()
        if self._own_mutex:
            self._mutex.free()
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        window.Free()


class Semaphore(_Held):
    """A counter of permits: :meth:`acquire` takes one, waiting while there is none."""

    def __init__(self, value: int = 1, *, bounded: bool = True, comm=MPI.COMM_SELF,
                 info=MPI.INFO_NULL, timeout: float | None = None):
        """Initialize the semaphore (collective over ``comm``).

        Args:
            value: Initial value for internal counter.
            bounded: Bound internal counter to initial value.
            comm: Intracommunicator context.
            info: Info object for the windows' creation.
            timeout: pycomm's keyword: seconds a wait may last (default
                ``PYCOMM_TIMEOUT``).

        Raises:
            ValueError: ``value`` is negative.
        """
        if value < 0:
            raise ValueError("initial value must be non-negative")
        _comm_rank(comm, "Semaphore")
        self._bounded = bool(bounded)
        self._counter = Counter(value, comm=comm, info=info)
        self._condvar = Condition(recursive=False, comm=comm, info=info, timeout=timeout)
        self._comm = comm

    def _alive(self) -> None:
        if not self._counter._window:
            raise RuntimeError("semaphore already freed")

    def acquire(self, blocking: bool = True) -> bool:
        """Acquire semaphore, decrementing the internal counter by one.

        Args:
            blocking: If `True`, block until the semaphore is acquired.

        Returns:
            `True` if the semaphore is acquired, `False` otherwise.

        Raises:
            RuntimeError: freed. MPI.Exception: ``ERR_PENDING``, a wait timed out.
        """
        self._alive()
        with self._condvar:
            while self._counter.next(0) == 0:
                if not blocking:
                    return False
                self._condvar.wait()
            self._counter.next(-1)
            return True

    def release(self, n: int = 1) -> None:
        """Release semaphore, incrementing the internal counter by one or more.

        Args:
            n: Increment for the internal counter.

        Raises:
            ValueError: ``n`` < 1, or a bounded semaphore would exceed its initial value.
            RuntimeError: freed.
        """
        if n < 1:
            raise ValueError("increment must be one or more")
        self._alive()
        with self._condvar:
            if self._bounded and self._counter.next(0) + n > self._counter._start:
                raise ValueError("semaphore released too many times")
            self._counter.next(n)
            self._condvar.notify(n)

    def free(self) -> None:
        """Free semaphore resources (collective)."""
        self._counter.free()
        self._condvar.free()
        self._comm = MPI.COMM_NULL
