"""The operations and synchronization calls of ``MPI.Win`` (:mod:`pycomm.MPI.win`).

A target's items are a :class:`~pycomm.MPI.msg.Msg` over its mapping (the target
datatype's typemap from ``disp * disp_unit``); each operation runs under the target's
operation lock and is complete when it returns. The synchronization calls reconcile a
separate window's copies (:meth:`RMA._reconcile`) and order the ranks: ``Fence`` a
barrier, PSCW zero-byte messages on the window's communicator, ``Lock`` an ``flock`` of
the target's epoch lock file.
"""

from __future__ import annotations

import fcntl
import time

import numpy as np

from pycomm import config
from pycomm.errors import ArgumentError, CommTimeoutError

from .exceptions import mpi_error, translate_methods
from .msgspec import as_int, message
from .regions import typed as _typed
from .predefined import from_numpy, to_datatype

__all__ = ["FLAVOR_CREATE", "FLAVOR_SHARED", "RMA", "SEPARATE", "UNIFIED"]

LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
_TAG_POST, _TAG_DONE = 1, 2
FLAVOR_CREATE, FLAVOR_SHARED = 1, 4
SEPARATE, UNIFIED = 1, 2


def _error(code: str, text: str):
    return mpi_error(ArgumentError, code, text)


def _byte():
    from . import BYTE
    return BYTE


class _OpLock:
    """The target's operation lock, held while one operation reads or writes it."""

    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _flock_bounded(fd: int, exclusive: bool, where: str) -> None:
    """Take an ``flock`` of ``fd``, waiting at most ``PYCOMM_TIMEOUT`` seconds.

    Tries without blocking first, then polls with a backoff of 50 us doubling to 5 ms
    (the holder is another rank's epoch, which may last as long as its program likes).

    Raises:
        CommTimeoutError: the lock was not free within ``PYCOMM_TIMEOUT``.
    """
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    limit = config.get("PYCOMM_TIMEOUT")
    deadline, delay = time.monotonic() + limit, 5e-5
    while True:
        try:
            fcntl.flock(fd, mode)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise mpi_error(CommTimeoutError, "ERR_PENDING", f"{where}: the lock was "
                                f"held by another rank for over {limit} s "
                                "(PYCOMM_TIMEOUT)") from None
            time.sleep(delay)
            delay = min(delay * 2, 5e-3)


@translate_methods
class RMA:
    """Put/Get/Accumulate... and Fence/PSCW/Lock... over the state ``self._s``."""

    # -- the memory of a target -------------------------------------------------------
    def _region(self, call: str, target_rank: int, target, origin_msg, writable: bool):
        """The target's items a call names, as a Msg over its mapping."""
        s = self._state(call)
        from . import PROC_NULL
        rank = as_int(target_rank, "target_rank", f"Win.{call}")
        if rank == PROC_NULL:
            return None, None
        if not 0 <= rank < len(s["targets"]):
            raise _error("ERR_RANK", f"Win.{call}: target rank {rank} is not in 0.."
                         f"{len(s['targets']) - 1}")
        t = s["targets"][rank]
        if target is None:
            disp, count, dt = 0, None, None
        elif isinstance(target, (int, np.integer)):
            disp, count, dt = int(target), None, None
        elif isinstance(target, (list, tuple)) and len(target) <= 3:
            target = list(target) + [None] * (3 - len(target))
            disp, count, dt = target[0] or 0, target[1], target[2]
        else:
            raise _error("ERR_ARG", f"Win.{call}: target must be None, a displacement or "
                         f"[disp, count, datatype], got {target!r}")
        if dt is None:
            dt = origin_msg.datatype or from_numpy(origin_msg.array.dtype)
        else:
            dt = to_datatype(dt, f"Win.{call}")
        if count is None:
            count = origin_msg.array.size // max(dt.elements(), 1)
        where = f"Win.{call}"
        return t, _typed(t.bytes, dt, as_int(count, "count", where),
                         as_int(disp, "disp", where) * t.disp_unit, where, "target")

    @staticmethod
    def _locked(t) -> _OpLock:
        return _OpLock(t.op_fd)

    @staticmethod
    def _check(call: str, a: np.ndarray, b: np.ndarray) -> None:
        if a.size != b.size:
            raise _error("ERR_COUNT", f"Win.{call}: the origin has {a.size} elements, the "
                         f"target {b.size}")

    def Put(self, origin, target_rank: int, target=None) -> None:
        """Write ``origin`` into ``target_rank``'s window (``target``: ``disp`` or
        ``[disp, count, datatype]``, in the target's disp units)."""
        src = message(origin, "Win.Put", "origin", writable=False)
        t, dst = self._region("Put", target_rank, target, src, True)
        if t is not None:
            self._check("Put", src.array, dst.array)
            with self._locked(t):
                dst.array[...] = src.array.view(dst.array.dtype)
                dst.finish()

    def Get(self, origin, target_rank: int, target=None) -> None:
        """Read ``target_rank``'s window into ``origin``."""
        dst = message(origin, "Win.Get", "origin", writable=True)
        t, src = self._region("Get", target_rank, target, dst, False)
        if t is not None:
            self._check("Get", dst.array, src.array)
            with self._locked(t):
                dst.array[...] = src.array.view(dst.array.dtype)
            dst.finish()

    def _combine(self, call: str, src, dst, op, result=None) -> None:
        from . import REPLACE
        from .ops import with_datatype
        self._check(call, src.array, dst.array)
        old = dst.array.copy()
        if result is not None:
            self._check(call, result.array, dst.array)
            result.array[...] = old.view(result.array.dtype)
        new = src.array.astype(dst.array.dtype, copy=True) if op != REPLACE else \
            src.array.view(dst.array.dtype).copy()
        op = with_datatype(op, dst.datatype)
        op.check(new.dtype)
        op.apply(old, new)                  # new = old op origin; REPLACE keeps origin
        dst.array[...] = new
        dst.finish()

    def Accumulate(self, origin, target_rank: int, target=None, op=None) -> None:
        """``target = target op origin`` in ``target_rank``'s window, atomically."""
        from . import SUM
        src = message(origin, "Win.Accumulate", "origin", writable=False)
        t, dst = self._region("Accumulate", target_rank, target, src, True)
        if t is not None:
            with self._locked(t):
                self._combine("Accumulate", src, dst, SUM if op is None else op)

    def Get_accumulate(self, origin, result, target_rank: int, target=None,
                       op=None) -> None:
        """``result = target; target = target op origin``, atomically."""
        from . import SUM
        res = message(result, "Win.Get_accumulate", "result", writable=True)
        if origin is None:
            raise TypeError("Win.Get_accumulate: origin: expecting buffer or list/tuple "
                            "(NO_OP reads it not, but it is a message as in mpi4py)")
        src = message(origin, "Win.Get_accumulate", "origin", writable=False)
        t, dst = self._region("Get_accumulate", target_rank, target, src, True)
        if t is not None:
            with self._locked(t):
                self._combine("Get_accumulate", src, dst, SUM if op is None else op, res)
            res.finish()

    @staticmethod
    def _single(call: str, spec, msg, arg: str):
        """The predefined datatype of a one-item message, as mpi4py checks it.

        Raises:
            ArgumentError (a ValueError): not exactly one item, or a derived datatype.
        """
        count = msg.array.size // max(msg.per, 1)
        if count != 1:
            raise _error("ERR_COUNT", f"Win.{call}: {arg}: expecting a single element, "
                         f"got {count}")
        if msg.datatype is not None:
            return msg.datatype
        if type(spec) is np.ndarray:            # message()'s fast path: its own dtype
            return from_numpy(msg.array.dtype)
        raise _error("ERR_TYPE", f"Win.{call}: {arg}: a derived datatype (MPI allows "
                     "only predefined ones here)")

    def Fetch_and_op(self, origin, result, target_rank: int, target_disp: int = 0,
                     op=None) -> None:
        """:meth:`Get_accumulate` of one item at ``target_disp``.

        Args:
            origin: one item (its datatype is the target's too).
            result: one item of the same datatype, written with the target's old value.
            target_rank: the target's rank in the window's group (``PROC_NULL``: nothing).
            target_disp: displacement in the target's disp units.
            op: the reduction (default ``SUM``; ``REPLACE``, ``NO_OP``...).

        Raises:
            ValueError: origin or result is not one item, or their datatypes differ
                (before the target is touched).
        """
        from . import PROC_NULL
        src = message(origin, "Win.Fetch_and_op", "origin", writable=False)
        res = message(result, "Win.Fetch_and_op", "result", writable=True)
        if as_int(target_rank, "target_rank", "Win.Fetch_and_op") == PROC_NULL:
            return
        dt = self._single("Fetch_and_op", origin, src, "origin")
        if self._single("Fetch_and_op", result, res, "result") != dt:
            raise _error("ERR_TYPE", "Win.Fetch_and_op: mismatch in origin and result "
                         "MPI datatypes")
        self.Get_accumulate(origin, result, target_rank, [target_disp, 1, dt], op)

    def Compare_and_swap(self, origin, compare, result, target_rank: int,
                         target_disp: int = 0) -> None:
        """``result = target; if target == compare: target = origin``, atomically.

        Args:
            origin, compare, result: one item each, all of one predefined datatype.
            target_rank: the target's rank in the window's group (``PROC_NULL``: nothing).
            target_disp: displacement in the target's disp units.

        Raises:
            ValueError: an argument is not one item, or the datatypes differ (before the
                target is touched).
        """
        from . import PROC_NULL
        where = "Win.Compare_and_swap"
        src = message(origin, where, "origin", writable=False)
        cmp = message(compare, where, "compare", writable=False)
        res = message(result, where, "result", writable=True)
        if as_int(target_rank, "target_rank", where) == PROC_NULL:
            return
        dt = self._single("Compare_and_swap", origin, src, "origin")
        for spec, msg, arg in ((compare, cmp, "compare"), (result, res, "result")):
            if self._single("Compare_and_swap", spec, msg, arg) != dt:
                raise _error("ERR_TYPE", f"{where}: mismatch in origin and {arg} MPI "
                             "datatypes")
        t, dst = self._region("Compare_and_swap", target_rank, [target_disp, 1, dt],
                              src, True)
        with self._locked(t):
            old = dst.array.copy()
            res.array[...] = old.view(res.array.dtype)
            if np.array_equal(old, cmp.array.view(old.dtype)):
                dst.array[...] = src.array.view(old.dtype)
                dst.finish()
        res.finish()

    def _done(self):
        from .request import Request
        return Request()        # the operation completed when it returned

    def Rput(self, origin, target_rank: int, target=None):
        self.Put(origin, target_rank, target)
        return self._done()

    def Rget(self, origin, target_rank: int, target=None):
        self.Get(origin, target_rank, target)
        return self._done()

    def Raccumulate(self, origin, target_rank: int, target=None, op=None):
        self.Accumulate(origin, target_rank, target, op)
        return self._done()

    def Rget_accumulate(self, origin, result, target_rank: int, target=None, op=None):
        self.Get_accumulate(origin, result, target_rank, target, op)
        return self._done()

    # -- synchronization --------------------------------------------------------------
    def _reconcile(self, s: dict) -> None:
        """A Create or Allocate window: the owner's stores to the public copy, then the
        public copy back into the owner's memory (see the module docstring)."""
        if s["flavor"] == FLAVOR_SHARED:
            return
        priv, synced = s["private"], s["synced"]
        t = s["targets"][s["comm"].rank]
        with self._locked(t):
            stored = priv != synced
            t.bytes[stored] = priv[stored]
            priv[...] = t.bytes
            synced[...] = t.bytes

    def Fence(self, assertion: int = 0) -> None:
        """End one access/exposure epoch and begin the next (collective)."""
        s = self._state("Fence")
        self._reconcile(s)
        s["comm"].Barrier()
        self._reconcile(s)

    def Sync(self) -> None:
        """Reconcile this rank's public and private copies."""
        self._reconcile(self._state("Sync"))

    def Post(self, group, assertion: int = 0) -> None:
        """Expose the window to the ranks of ``group`` (they call :meth:`Start`)."""
        s = self._state("Post")
        self._reconcile(s)
        ranks = self._ranks(s, group)
        for r in ranks:
            s["comm"].Send([b"", 0, _byte()], r, _TAG_POST)
        s["post"] = ranks

    def Start(self, group, assertion: int = 0) -> None:
        """Begin accessing the windows of the ranks of ``group`` once they posted."""
        s = self._state("Start")
        ranks = self._ranks(s, group)
        for r in ranks:
            s["comm"].Recv([bytearray(0), 0, _byte()], r, _TAG_POST)
        s["start"] = ranks

    def Complete(self) -> None:
        """End the access epoch of :meth:`Start`."""
        s = self._state("Complete")
        for r in s["start"] or ():
            s["comm"].Send([b"", 0, _byte()], r, _TAG_DONE)
        s["start"] = None

    def Wait(self) -> None:
        """End the exposure epoch of :meth:`Post` once every origin completed."""
        s = self._state("Wait")
        for r in s["post"] or ():
            s["comm"].Recv([bytearray(0), 0, _byte()], r, _TAG_DONE)
        s["post"] = None
        self._reconcile(s)

    def Test(self) -> bool:
        """:meth:`Wait` if every origin completed already; whether it did."""
        s = self._state("Test")
        if all(s["comm"].Iprobe(r, _TAG_DONE) for r in s["post"] or ()):
            self.Wait()
            return True
        return False

    @staticmethod
    def _ranks(s: dict, group) -> list[int]:
        from . import Group
        return list(Group.Translate_ranks(group, list(range(group.Get_size())),
                                          s["comm"].Get_group()))

    def Lock(self, rank: int, lock_type: int = LOCK_EXCLUSIVE, assertion: int = 0) -> None:
        """Begin a passive-target epoch on ``rank``'s window (``PROC_NULL``: nothing).

        Args:
            rank: the target's rank in the window's group.
            lock_type: ``LOCK_EXCLUSIVE`` or ``LOCK_SHARED``.
            assertion: ignored (``MODE_NOCHECK``...: a hint).

        Raises:
            MPI.Exception: ``ERR_RMA_SYNC`` if this rank locked ``rank`` already,
                ``ERR_LOCKTYPE``, ``ERR_RANK``; ``ERR_PENDING`` (a ``TimeoutError``) if
                another rank held a conflicting lock for over ``PYCOMM_TIMEOUT``.
        """
        from . import PROC_NULL
        s = self._state("Lock")
        rank = as_int(rank, "rank", "Win.Lock")
        if rank == PROC_NULL:           # as MPICH: a valid target, nothing to lock
            return
        if rank in s["locks"]:
            raise _error("ERR_RMA_SYNC", f"Win.Lock: rank {rank} is locked already")
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise _error("ERR_LOCKTYPE", f"Win.Lock: lock_type {lock_type}")
        if not 0 <= rank < len(s["targets"]):
            raise _error("ERR_RANK", f"Win.Lock: rank {rank} is not in 0.."
                         f"{len(s['targets']) - 1}")
        _flock_bounded(s["targets"][rank].epoch_fd, lock_type == LOCK_EXCLUSIVE,
                       f"Win.Lock(rank={rank})")
        s["locks"][rank] = lock_type
        if rank == s["comm"].rank:
            self._reconcile(s)

    def Unlock(self, rank: int) -> None:
        """End the passive-target epoch on ``rank``'s window."""
        from . import PROC_NULL
        s = self._state("Unlock")
        rank = as_int(rank, "rank", "Win.Unlock")
        if rank == PROC_NULL:
            return
        if s["locks"].pop(rank, None) is None:
            raise _error("ERR_RMA_SYNC", f"Win.Unlock: rank {rank} is not locked")
        if rank == s["comm"].rank:
            self._reconcile(s)
        fcntl.flock(s["targets"][rank].epoch_fd, fcntl.LOCK_UN)

    def Lock_all(self, assertion: int = 0) -> None:
        for r in range(len(self._state("Lock_all")["targets"])):
            self.Lock(r, LOCK_SHARED)

    def Unlock_all(self) -> None:
        for r in list(self._state("Unlock_all")["locks"]):
            self.Unlock(r)

    def Flush(self, rank: int) -> None:
        """Operations complete when they return: nothing to wait for."""
        self._state("Flush")

    def Flush_all(self) -> None:
        self._state("Flush_all")

    def Flush_local(self, rank: int) -> None:
        self._state("Flush_local")

    def Flush_local_all(self) -> None:
        self._state("Flush_local_all")
