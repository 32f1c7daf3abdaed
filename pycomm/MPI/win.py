"""``MPI.Win``: one-sided communication over shared memory, for ranks on one host.

Each rank's window is a file in ``/dev/shm``, named with the job's segment prefix
(``pycomm-<job>-win-...``, which the launcher sweeps after the job) and unlinked once every
rank of the window has mapped it (or at once, if creating the window fails), that every
rank of the window maps; ``Put``, ``Get``, ``Accumulate``, ``Get_accumulate``,
``Fetch_and_op`` and ``Compare_and_swap`` read and write the target's mapping directly,
each under the target's operation lock (an ``flock``), so accumulates are atomic per call,
as MPI requires per element. Operations complete when they return: the ``R*`` variants
give completed requests and ``Flush*`` have nothing to wait for.

Memory model: ``Win.Allocate_shared`` gives the mapping itself as the window's memory
(``WINUNIFIED``; other ranks' memory through ``Shared_query``). ``Win.Create`` exposes
memory the program already has, which another process cannot map, and ``Win.Allocate``
memory of this process, so for them the mapping is the public copy and the program's
memory the private copy (``WINSEPARATE``, as MPI allows; a store right after
``Allocate`` does not race with the others' first accumulates, as with MPICH, where a
target applies remote operations when it next calls MPI): they are reconciled at the
owner's synchronization calls -- ``Fence``, ``Post``/``Wait``, ``Lock``/``Unlock`` of its
own rank, ``Sync`` and ``Free`` -- bytes the owner stored since the last reconciliation go
to the public copy, then the public copy comes back into the buffer.

Synchronization: ``Fence`` (a barrier), ``Post``/``Start``/``Complete``/``Wait``/``Test``
(zero-byte messages on the window's own communicator), ``Lock``/``Unlock`` (the target's
lock file: ``LOCK_EXCLUSIVE`` an exclusive ``flock``, ``LOCK_SHARED`` a shared one) and
``Lock_all``/``Unlock_all``. A communicator that spans hosts, and ``Win.Create_dynamic``,
raise ``NotImplementedError``.
"""

from __future__ import annotations

import mmap
import os
import socket
import uuid

import numpy as np

from pycomm.errors import ArgumentError
from transports.shmring import allocate

from .exceptions import ErrhandlerMethods, mpi_error, translate_methods
from .keyvals import check_keyval, delete_attr, free_attrs, set_attr, user_attr
from .msgspec import BOTTOM, _raw, as_int
from .winops import FLAVOR_CREATE, FLAVOR_SHARED, SEPARATE, UNIFIED, RMA

__all__ = ["WIN_NULL", "Win"]

_FLAVOR_ALLOCATE = 2


def _prefix(comm) -> str:
    """The path prefix of this job's window files (see the module docstring)."""
    import pycomm
    job = getattr(pycomm.init()._engine, "job_id", None) or f"p{os.getpid()}"
    return f"/dev/shm/pycomm-{job}-win-"


def _error(code: str, text: str):
    return mpi_error(ArgumentError, code, text)


class _Target:
    """Another rank's window as this process maps it: bytes, disp unit and lock files."""

    def __init__(self, path: str, size: int, disp_unit: int):
        self.size, self.disp_unit = size, disp_unit
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, max(size, 1))
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)[:size]
        self.epoch_fd = os.open(path + ".epoch", os.O_RDWR)
        self.op_fd = os.open(path + ".op", os.O_RDWR)

    def close(self) -> None:
        self.bytes = None
        try:
            self.map.close()
        except BufferError:     # a view of it is still alive: the mapping goes with it
            pass
        for fd in (self.fd, self.epoch_fd, self.op_fd):
            os.close(fd)


@translate_methods
class Win(RMA, ErrhandlerMethods):
    """A window of memory that the other ranks of its communicator can access; the
    operations and synchronization calls are :class:`pycomm.MPI.winops.RMA`'s."""

    def __init__(self, win: Win | None = None):
        if win is not None and not isinstance(win, Win):
            raise TypeError(f"Win({win!r}): expected a window or nothing")
        self._s = win._s if isinstance(win, Win) else None

    # -- creation ---------------------------------------------------------------------
    @classmethod
    def _make(cls, comm, size: int, disp_unit: int, flavor: int, private, info) -> Win:
        from . import COMM_SELF
        comm = COMM_SELF if comm is None else comm
        where = f"Win.{ {1: 'Create', 2: 'Allocate', 4: 'Allocate_shared'}[flavor]}"
        if size < 0 or disp_unit <= 0:
            raise _error("ERR_ARG", f"{where}: size {size} and disp_unit {disp_unit} must "
                         "be >= 0 and > 0")
        wcomm = comm.Dup()
        hosts = wcomm.allgather(socket.gethostname())
        if len(set(hosts)) > 1:
            wcomm.Free()
            raise NotImplementedError(f"{where}: pycomm's windows are shared memory; the "
                                      f"communicator spans hosts {sorted(set(hosts))}")
        base = wcomm.bcast(_prefix(comm) + uuid.uuid4().hex + "-" if wcomm.rank == 0
                           else None, 0)
        mine = f"{base}{wcomm.rank}"
        files = (mine, mine + ".epoch", mine + ".op")
        try:
            failed = None
            try:
                for path, n in zip(files, (max(size, 1), 0, 0)):
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                    try:
                        os.ftruncate(fd, n)
                        if n:       # (a full /dev/shm: an error here, not SIGBUS later)
                            allocate(fd, 0, n)
                    finally:
                        os.close(fd)
            except OSError as exc:      # every rank learns of it: none maps a short file
                failed = f"rank {wcomm.rank}: {path}: {exc.strerror or exc}"
            layout = wcomm.allgather((size, disp_unit, failed))
            failures = [f for _, _, f in layout if f is not None]
            if failures:
                wcomm.Free()
                raise _error("ERR_NO_MEM", f"{where}: the window's memory could not be "
                             f"made: {'; '.join(failures)}")
            targets = [_Target(f"{base}{r}", s, u) for r, (s, u, _) in enumerate(layout)]
            wcomm.Barrier()             # every rank mapped every file: unlink them now
        finally:
            for path in files:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        self = cls.__new__(cls)
        me = targets[wcomm.rank]
        if private is None:             # Allocate: this process's own memory, separate
            private = me.bytes if flavor == FLAVOR_SHARED else np.zeros(size, np.uint8)
        self._s = {"comm": wcomm, "targets": targets, "flavor": flavor, "name": "",
                   "private": private, "synced": private.copy(), "info": info,
                   "errhandler": None, "attrs": {}, "post": None, "start": None,
                   "locks": {}, "memory": None}
        return self

    @classmethod
    def Create(cls, memory, disp_unit: int = 1, info=None, comm=None) -> Win:
        """A window over ``memory`` (None or ``BOTTOM``: no memory) on every rank of
        ``comm`` (collective)."""
        if memory is None or memory is BOTTOM:
            raw = np.empty(0, np.uint8)
        else:
            raw, _ = _raw(memory, True, "Win.Create", "memory")
        out = cls._make(comm, raw.size, as_int(disp_unit, "disp_unit", "Win.Create"),
                        FLAVOR_CREATE, raw, info)
        out._s["memory"] = memory
        return out

    @classmethod
    def Allocate(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> Win:
        """A window of ``size`` new bytes on each rank (collective)."""
        return cls._make(comm, as_int(size, "size", "Win.Allocate"),
                         as_int(disp_unit, "disp_unit", "Win.Allocate"),
                         _FLAVOR_ALLOCATE, None, info)

    @classmethod
    def Allocate_shared(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> Win:
        """:meth:`Allocate`, and every rank may read the others' memory directly
        (:meth:`Shared_query`)."""
        return cls._make(comm, as_int(size, "size", "Win.Allocate_shared"),
                         as_int(disp_unit, "disp_unit", "Win.Allocate_shared"),
                         FLAVOR_SHARED, None, info)

    @classmethod
    def Create_dynamic(cls, info=None, comm=None) -> Win:
        raise NotImplementedError("Win.Create_dynamic: pycomm's windows are shared memory "
                                  "of a size fixed at creation (no Attach/Detach)")

    def _state(self, call: str) -> dict:
        if self._s is None:
            raise _error("ERR_WIN", f"Win.{call}: the window is WIN_NULL")
        return self._s

    def Free(self) -> None:
        """Free the window (collective); a ``Create`` window's buffer gets the last
        updates of the public copy first, and its attributes are deleted (their keys'
        delete callbacks run)."""
        s = self._state("Free")
        try:
            free_attrs(self, s["attrs"], "Win.Free")
        finally:                        # collective: the other ranks free it regardless
            self._reconcile(s)
            s["comm"].Barrier()         # nobody accesses the memory any more
            self._reconcile(s)
            for t in s["targets"]:
                t.close()
            s["comm"].Free()
            self._s = None

    def __eq__(self, other) -> bool:
        return isinstance(other, Win) and self._s is other._s

    def __hash__(self) -> int:
        return id(self._s)

    def __bool__(self) -> bool:
        return self._s is not None

    # -- queries ----------------------------------------------------------------------
    def tomemory(self):
        """The window's memory on this rank (a ``Create`` window: the buffer it got)."""
        from .membuf import buffer
        s = self._state("tomemory")
        mem = s["memory"] if s["flavor"] == FLAVOR_CREATE else s["private"]
        if mem is None or mem is BOTTOM:
            mem = np.empty(0, np.uint8)
        return mem if isinstance(mem, buffer) else buffer(mem)

    def Shared_query(self, rank: int):
        """The memory of ``rank``'s window, if this process can read it directly.

        Args:
            rank: a rank of the window's group, or ``PROC_NULL`` for the lowest rank
                whose window is not empty (MPI 4.1).

        Returns:
            ``(memory, disp_unit)``: an ``Allocate_shared`` window gives the rank's
            memory itself; the other flavors, whose memory is each process's own
            (MPI 4.1 allows any flavor here), an empty buffer and the rank's disp unit.

        Raises:
            MPI.Exception: ``ERR_RANK`` for a rank outside the group.
        """
        from . import PROC_NULL
        from .membuf import buffer
        s = self._state("Shared_query")
        targets = s["targets"]
        rank = as_int(rank, "rank", "Win.Shared_query")
        if rank == PROC_NULL:
            rank = next((r for r, t in enumerate(targets) if t.size), 0)
        elif not 0 <= rank < len(targets):
            raise _error("ERR_RANK", f"Win.Shared_query: rank {rank} is not in 0.."
                         f"{len(targets) - 1} (or PROC_NULL)")
        t = targets[rank]
        if s["flavor"] != FLAVOR_SHARED:
            return buffer(np.empty(0, np.uint8)), t.disp_unit
        return buffer(t.bytes), t.disp_unit

    def Get_group(self):
        return self._state("Get_group")["comm"].Get_group()

    group = property(Get_group)

    @property
    def group_size(self) -> int:
        return self._state("group_size")["comm"].size

    @property
    def group_rank(self) -> int:
        return self._state("group_rank")["comm"].rank

    def Get_attr(self, keyval: int):
        from . import WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT, WIN_MODEL, WIN_SIZE
        s = self._state("Get_attr")
        keyval = check_keyval(keyval, "Win.Get_attr")
        me = s["targets"][s["comm"].rank]
        if keyval == WIN_BASE:
            return s["private"].ctypes.data if s["private"].size else 0
        builtin = {WIN_SIZE: me.size, WIN_DISP_UNIT: me.disp_unit,
                   WIN_CREATE_FLAVOR: s["flavor"],
                   WIN_MODEL: UNIFIED if s["flavor"] == FLAVOR_SHARED else SEPARATE}
        if keyval in builtin:
            return builtin[keyval]
        return user_attr("Win", s["attrs"], keyval, "Win.Get_attr")

    def Set_attr(self, keyval: int, attrval) -> None:
        """Cache ``attrval`` under ``keyval``, a key of ``Win.Create_keyval``.

        Raises:
            MPI.Exception: ERR_WIN (WIN_NULL), ERR_KEYVAL (a predefined, unknown or freed
                key), ERR_OTHER (the delete callback of a replaced value raised).
        """
        s = self._state("Set_attr")
        set_attr("Win", self, s["attrs"], keyval, attrval, "Win.Set_attr")

    def Delete_attr(self, keyval: int) -> None:
        """Remove the value cached under ``keyval`` (its key's delete callback runs).

        Raises:
            MPI.Exception: ERR_WIN, ERR_KEYVAL, ERR_OTHER (as :meth:`Set_attr`).
        """
        s = self._state("Delete_attr")
        delete_attr("Win", self, s["attrs"], keyval, "Win.Delete_attr")

    @property
    def attrs(self) -> tuple[int, int, int]:
        """``(base address, size, disp_unit)`` of this rank's window."""
        from . import WIN_BASE, WIN_DISP_UNIT, WIN_SIZE
        return tuple(self.Get_attr(k) for k in (WIN_BASE, WIN_SIZE, WIN_DISP_UNIT))

    @property
    def flavor(self) -> int:
        return self._state("flavor")["flavor"]

    @property
    def model(self) -> int:
        from . import WIN_MODEL
        return self.Get_attr(WIN_MODEL)

    def Get_name(self) -> str:
        return self._state("Get_name")["name"] if self._s else "MPI_WIN_NULL"

    def Set_name(self, name: str) -> None:
        self._state("Set_name")["name"] = str(name)

    name = property(Get_name, Set_name)

    def Get_info(self):
        from . import Info
        return Info.Create()

    def Set_info(self, info) -> None:
        self._state("Set_info")["info"] = info

    info = property(Get_info, Set_info)

    def __repr__(self) -> str:
        return "<MPI.WIN_NULL>" if self._s is None else f"<MPI.Win {self.Get_name()!r}>"


WIN_NULL = Win()
