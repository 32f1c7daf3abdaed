"""The communicator: mpi4py's ``Comm`` / ``Intracomm``, assembled from its API classes.

A :class:`Communicator` validates every argument (before any byte moves), translates its
ranks to world ranks, and hands the work to the p2p engine (point-to-point) or to a
collective algorithm from :mod:`pycomm.collectives`, chosen by the cost model or by the
caller (``algorithm=`` / ``PYCOMM_ALGORITHM_<COLLECTIVE>``).

Tag spaces: user point-to-point traffic travels on context ``3*cid``, collectives on
``3*cid + 1`` with a per-call sequence number as tag, so collectives never match user
messages or each other, and communicators never share traffic (context ids: see
:mod:`pycomm.groups`).

Consistency: every collective message carries its call's signature (:mod:`pycomm.signature`)
and a receive checks it, so mismatched calls raise
:class:`~pycomm.errors.CollectiveMismatchError` instead of mixing their bytes. A collective
that fails on one rank, even before sending anything (a bad argument), is abandoned on
every rank (:meth:`pycomm.p2p.Engine.abort_call`): every rank counts it and raises
:class:`~pycomm.errors.CollectiveError` naming the failed rank, so the next call matches
again. A message of a call this rank has finished proves a mismatch the receives could not
see (two ranks that both believed they were the root of a Bcast): that call and the next
are then abandoned on every rank, with the mismatch in the error. (This last check is off
while nonblocking collectives are in flight: their earlier calls legitimately still
receive.) The bookkeeping is :mod:`pycomm.calls`.

What a communicator is made of. State with behaviour of its own is a component the
communicator holds: ``_calls`` (:class:`pycomm.calls.CollectiveCalls`: numbering and
failure bookkeeping of the collective calls), ``_selection``
(:class:`pycomm.tuning.selection.AlgorithmSelection`: each call's algorithm, chosen, run and
logged), ``_plans`` (:mod:`pycomm.plan`: decided call shapes) and ``_slots``
(:class:`pycomm.shmcoll.SharedSlots`: small calls through shared memory). mpi4py's method
set comes from six API classes, each on its own page: the point-to-point calls on buffers
(:mod:`pycomm.pt2pt`), the blocking buffer collectives (:mod:`pycomm.bufcoll`), the object
API (lowercase methods, :mod:`pycomm.objects`), the vector and scan collectives
(:mod:`pycomm.vcoll`), the nonblocking collectives (:mod:`pycomm.nbc`) and groups and
communicator management (:mod:`pycomm.groups`).

What the API classes build on, besides those components, is this module's: the engine
(``_engine``), ``rank``, ``size`` and ``name``, the members' world ranks (``_world``, and
``_from_world`` back), the point-to-point and collective contexts (``_pctx``, ``_cctx``),
``_freed``, ``_debug``, and the argument checks every call makes the same way
(``_check_alive``, ``_check_rank``, ``_check_tag``, ``_check_root``, ``_check_op``, and
``_pair`` for a send and a receive buffer of one dtype), whose errors name this rank, and
``_wait_posted``, the wait of a blocking point-to-point call (object or buffer) that
withdraws what it posted on a timeout. Beyond these, an API class uses another's public
methods only (the object API posts with ``Isend`` and ``Irecv_alloc``, the nonblocking
twins run the blocking ones), never its private state.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from . import config
from . import trace as _trace
from .buffers import IN_PLACE, as_array
from .bufcoll import CollectiveMethods
from .calls import CollectiveCalls
from .errors import ArgumentError, CommError, CommTimeoutError, InvalidBufferError
from .groups import GroupMethods
from .nbc import NonblockingMethods
from .objects import ObjectMethods
from .vcoll import VectorMethods
from .ops import Op
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Engine
from .plan import UNDECIDED
from .pt2pt import TAG_UB, PointToPointMethods
from .tuning.selection import AlgorithmSelection
from .status import Status

__all__ = ["Communicator", "Status", "TAG_UB"]

# How long an aborting rank waits for the launcher to stop the job before it exits by
# itself (the launcher reacts within its 20 ms tick, a node agent within 0.1 s).
_ABORT_WAIT_S = 3.0


class Communicator(PointToPointMethods, CollectiveMethods, ObjectMethods, GroupMethods,
                   VectorMethods, NonblockingMethods):
    """A group of ranks that communicate (mpi4py's ``Comm`` / ``Intracomm``).

    Every collective call (buffer, object, vector and the preparation of the nonblocking
    ones) can raise, besides its own argument errors:

    - :class:`~pycomm.errors.CollectiveMismatchError`: the ranks called different
      collectives, or this one with a different root, op, dtype or count;
    - :class:`~pycomm.errors.CollectiveError`: the call failed on another rank (it is
      abandoned on every rank, and the communicator stays usable);
    - :class:`~pycomm.errors.PeerError`: a peer died or its connection dropped;
    - :class:`~pycomm.errors.CommTimeoutError`: not complete within ``PYCOMM_TIMEOUT``
      seconds;
    - :class:`~pycomm.errors.CommError`: the communicator has been freed.

    Args:
        engine: the process's p2p engine.
        cid: context id (unique per communicator in the job).
        world_ranks: world rank of each member, in communicator rank order.
        rank: this process's rank in the communicator.
        name: the communicator's name, for messages (default ``"pycomm.COMM_WORLD"``).
    """

    def __init__(self, engine: Engine, cid: int, world_ranks: list[int], rank: int,
                 name: str = "pycomm.COMM_WORLD"):
        self._engine = engine
        self._cid = cid
        # the block of the shared-memory collective area its slots use (pycomm.slotblocks):
        # COMM_WORLD's is 0, a derived communicator's is set at its creation, -1 for none
        self._block = 0 if cid == 0 else -1
        self._pctx, self._cctx = 3 * cid, 3 * cid + 1
        self._world = list(world_ranks)
        self._from_world = {w: i for i, w in enumerate(self._world)}
        self.rank = rank
        self.size = len(self._world)
        self.name = name
        self._calls = CollectiveCalls(self)   # numbering and failure bookkeeping
        self._plans: dict | None = None       # call shape -> plan (pycomm.plan)
        # pycomm.shmcoll.SharedSlots, or None; decided with the first plan (plan.slots_of)
        self._slots = UNDECIDED
        self._plans_gen = 0
        self._freed = False
        comms = getattr(engine, "comms", None)     # (a test's fake engine has none)
        if comms is not None:
            comms.add(self)
        # the nonblocking twins' queue (pycomm.nbc), None outside them: every collective
        # reads it, and Python 3.11 reads an instance attribute much faster than the
        # class default NonblockingMethods declares
        self._defer = None
        self._debug = config.get("PYCOMM_DEBUG")
        self._selection = AlgorithmSelection(self)   # each call's algorithm: chosen, run

    # -- basics ---------------------------------------------------------------------------
    def Get_rank(self) -> int:
        """Return this process's rank in the communicator (the ``rank`` attribute).

        Returns:
            int: 0 .. size - 1.

        Raises:
            Nothing.
        """
        return self.rank

    def Get_size(self) -> int:
        """Return the number of ranks in the communicator (the ``size`` attribute).

        Returns:
            int: at least 1.

        Raises:
            Nothing.
        """
        return self.size

    def Get_name(self) -> str:
        """Return the communicator's name (e.g. ``"pycomm.COMM_WORLD.Split(1)"``).

        Returns:
            str: the name used in error messages and in the flight recorder.

        Raises:
            Nothing.
        """
        return self.name

    def __repr__(self) -> str:
        return f"<{self.name} rank {self.rank} of {self.size}>"

    def _check_alive(self) -> None:
        """Raise CommError naming this rank if the communicator has been freed."""
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")

    def _wait_posted(self, reqs: list, timeout: float | None) -> None:
        """Wait for the requests a blocking call posted; on timeout, withdraw its receives
        that have not matched, so that they cannot swallow a later message, and its large
        sends not yet handed over, so that the buffer is not read after the call."""
        try:
            _trace.record_wait(self, reqs, timeout)     # the flight recorder waits for them
        except CommTimeoutError:
            for r in reqs:
                self._engine.cancel(r)      # no effect on eager sends, matched receives
            raise

    def _check_rank(self, value, arg: str, *, allow_any: bool = False) -> int:
        ok = isinstance(value, (int, np.integer)) and (
            0 <= value < self.size or value == PROC_NULL or
            (allow_any and value == ANY_SOURCE))
        if not ok:
            extra = ", ANY_SOURCE" if allow_any else ""
            raise ArgumentError(f"rank {self.rank}: {arg}={value!r} is invalid; expected 0.."
                                f"{self.size - 1} (or PROC_NULL{extra})")
        return int(value)

    def _check_tag(self, value, arg: str, *, allow_any: bool = False) -> int:
        ok = isinstance(value, (int, np.integer)) and (
            0 <= value <= TAG_UB or (allow_any and value == ANY_TAG))
        if not ok:
            extra = " or ANY_TAG" if allow_any else ""
            raise ArgumentError(f"rank {self.rank}: {arg}={value!r} is invalid; tags are "
                                f"0..{TAG_UB}{extra}")
        return int(value)

    def _check_root(self, root) -> int:
        if type(root) is int and 0 <= root < self.size:    # the common case, without int()
            return root
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ArgumentError(f"rank {self.rank}: root={root!r} is invalid for a "
                                f"communicator of size {self.size}")
        return int(root)

    def _check_op(self, op, dtype) -> Op:
        if not isinstance(op, Op):
            raise ArgumentError(f"rank {self.rank}: op={op!r} is not a pycomm.Op")
        try:
            op.check(dtype)
        except ArgumentError as exc:
            raise ArgumentError(f"rank {self.rank}: {exc}") from None
        return op

    def _pair(self, sendbuf, recvbuf, what: str):
        recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
        if sendbuf is IN_PLACE:
            return None, recv
        send = as_array(sendbuf, self.rank, "sendbuf")
        sdt, rdt = send.dtype, recv.dtype
        # numpy shares one dtype object among the arrays of a built-in type: the identity
        # test settles the common case, where comparing dtypes costs as much as a call
        if sdt is not rdt and sdt != rdt:
            raise InvalidBufferError(f"rank {self.rank}: {what}: sendbuf dtype {sdt} "
                                     f"differs from recvbuf dtype {rdt}")
        return send, recv

    def chosen_algorithm(self, collective: str, nbytes: int, *, commutative: bool = True,
                         algorithm: str | None = None, blocking: bool = True,
                         op: Op | None = None) -> str:
        """Name the algorithm a call on this communicator would run.

        The same choice the collective itself makes (:func:`pycomm.collectives.choose` with
        this communicator's size, transport and agreed ranks per core), for logs and
        benchmarks: ``"shared_slots"`` where a blocking call goes through shared-memory
        slots instead of messages (:mod:`pycomm.shmcoll`), ``"shm_direct"`` where a
        blocking all-reduce, reduce-scatter-block, all-gather or broadcast reads its
        peers' buffers directly (:mod:`pycomm.shmdirect`; without ``op``, a commutative op
        is taken to be a built-in one, which only a built-in op is). Sends nothing.

        Args:
            collective: e.g. ``"allreduce"`` (a key of ``pycomm.collectives.REGISTRY``).
            nbytes: bytes of the call as defined in :mod:`pycomm.collectives` (e.g. the
                whole receive buffer for allgather).
            commutative: whether the reduction op commutes.
            algorithm: as the collective's ``algorithm=``; None honours
                ``PYCOMM_ALGORITHM_<COLLECTIVE>``, ``"auto"`` ignores it.
            blocking: False names what the nonblocking variant (``Iallreduce``, ...) runs,
                which always sends messages.
            op: the call's :class:`pycomm.Op`; when given, it decides ``commutative`` and
                whether the direct path can serve the call (a user-defined op, even a
                commutative one, sends messages).

        Returns:
            str: the algorithm's registry name (e.g. ``"recursive_doubling"``),
            ``"shared_slots"`` or ``"shm_direct"``.

        Raises:
            ArgumentError: unknown collective or algorithm, a named algorithm that cannot
                serve the call, or an ``op`` that is not a :class:`pycomm.Op`.
        """
        if op is not None:
            if not isinstance(op, Op):
                raise ArgumentError(f"rank {self.rank}: chosen_algorithm: op={op!r} is not "
                                    "a pycomm.Op")
            commutative = op.commutative
        return self._selection.chosen_algorithm(collective, nbytes, commutative=commutative,
                                                algorithm=algorithm, blocking=blocking, op=op)

    # -- misc -----------------------------------------------------------------------------
    def Abort(self, errorcode: int = 1) -> None:
        """End the whole job (MPI_Abort): every rank stops, the job exits with ``errorcode``.

        As under ``mpiexec``. Under ``launch.py`` (and a :class:`pycomm.Pool`) this rank
        publishes an abort note in the job's store (:func:`pycomm.stall.read_abort`) and
        stays alive, its connections open, while the launcher stops every rank. So no peer
        sees it vanish and reports a failure of its own: the other ranks end silently. If
        nothing stops it within ``_ABORT_WAIT_S`` seconds (no launcher reads the note), or
        there is no store (a world of one, ``mpiexec``), it exits by itself.

        Args:
            errorcode: the job's exit status (default 1; taken modulo 256).

        Returns:
            Never: the process exits (``os._exit``, no atexit handlers, no cleanup) or is
            stopped by the launcher.

        Raises:
            Nothing.
        """
        sys.stderr.write(f"pycomm: rank {self.rank} called Abort({errorcode})\n")
        sys.stderr.flush()
        inspector = getattr(self._engine, "_inspector", None)
        if inspector is not None and inspector.report_abort(int(errorcode)):
            time.sleep(_ABORT_WAIT_S)
        os._exit(int(errorcode) & 0xFF)
