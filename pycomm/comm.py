"""The communicator: mpi4py's buffer API (point-to-point and collectives) over the engine.

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
(:class:`pycomm.shmcoll.SharedSlots`: small calls through shared memory). The rest of
mpi4py's method set comes from four API classes, each on its own page and each built on
the methods here and those components: the object API (lowercase methods,
:mod:`pycomm.objects`), the vector and scan collectives (:mod:`pycomm.vcoll`), the
nonblocking collectives (:mod:`pycomm.nbc`) and groups and communicator management
(:mod:`pycomm.groups`).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from . import config, trace as _trace
from .buffers import _CASTABLE, IN_PLACE, as_array, byte_view
from .calls import CollectiveCalls
from .errors import ArgumentError, CommError, CommTimeoutError, InvalidBufferError
from .groups import GroupMethods
from .nbc import NonblockingMethods
from .objects import ObjectMethods
from .vcoll import VectorMethods
from .ops import SUM, Op
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Engine, Request, null_request
from .plan import UNDECIDED, plan_call
from .tuning.selection import AlgorithmSelection
from .signature import collective
from .status import Status, fill as _fill

__all__ = ["Communicator", "Status", "TAG_UB"]

TAG_UB = 2**31 - 1


class Communicator(ObjectMethods, GroupMethods, VectorMethods, NonblockingMethods):
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
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ArgumentError(f"rank {self.rank}: root={root!r} is invalid for a "
                                f"communicator of size {self.size}")
        return int(root)

    def _status_of(self, req: Request, status: Status | None) -> None:
        if status is not None:
            status.source = self._from_world.get(req.source, req.source)
            status.tag, status.count, status.cancelled = req.tag, req.count, req.cancelled

    # -- point-to-point, buffers ----------------------------------------------------------
    def Isend(self, buf, dest: int, tag: int = 0, *, synchronous: bool = False) -> Request:
        """Start a standard-mode send of ``buf`` to ``dest`` (MPI_Isend).

        Small messages (<= ``PYCOMM_EAGER_LIMIT`` bytes) are copied out eagerly; larger ones use
        rendezvous, so the buffer must stay untouched until the request completes.
        ``synchronous=True`` (:meth:`Issend`) takes the rendezvous at every size: the request
        completes only once the matching receive has started.

        Args:
            buf: a C-contiguous numpy array of a numeric or bool dtype (any shape), any
                buffer-protocol object, or ``[buf, datatype]`` / ``[buf, count, datatype]``;
                its bytes are sent (``buf.nbytes`` of them).
            dest: destination rank in this communicator, or PROC_NULL (nothing is sent).
            tag: message tag, 0..TAG_UB (default 0).
            synchronous: keyword-only; complete only once the matching receive has started.

        Returns:
            Request: complete once ``buf`` may be reused; its ``Wait`` raises PeerError if
            ``dest`` dies first.

        Raises:
            ArgumentError: invalid ``dest`` or ``tag``.
            InvalidBufferError: ``buf`` is not a contiguous numeric buffer, or its count or
                datatype does not fit it.
            PeerError: the connection to ``dest`` has already failed.
            CommError: the communicator has been freed.
        """
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        arr = as_array(buf, self.rank, "buf")
        dest = self._check_rank(dest, "dest")
        tag = self._check_tag(tag, "tag")
        if dest == PROC_NULL:
            return null_request(self._engine)
        return self._engine.isend(byte_view(arr), self._world[dest], self._pctx, tag,
                                  None, synchronous)

    def Send(self, buf, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` to ``dest``; return once ``buf`` may be reused (MPI_Send).

        A small message returns as soon as the transport has copied it, a large (rendezvous) one
        once the receiver has taken it. See :meth:`Isend`.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Isend`, before anything is sent.
            CommTimeoutError: not handed over within ``timeout`` seconds; a large (rendezvous)
                message is then withdrawn, so a receive posted later never reads ``buf`` (see
                :mod:`pycomm.p2p`).
            PeerError: ``dest`` died or its connection dropped.
            CommError: the communicator has been freed.
        """
        eng = self._engine
        # The common case, a small numpy array that the transport takes at once, needs no
        # request: the checks the general path makes (with their messages) are inlined.
        if type(buf) is np.ndarray and type(dest) is int and type(tag) is int and \
                0 < buf.nbytes <= eng.eager_limit and 0 <= dest < self.size and \
                0 <= tag <= TAG_UB and not eng._threaded and buf.flags.c_contiguous and \
                buf.dtype.char in _CASTABLE and not self._freed:
            w = self._world[dest]
            if eng.send_now(buf.data.cast("B"), w, self._pctx, tag):
                _trace.instant("Send", self, tag, buf.nbytes, w)
                return
        self._wait_posted([self.Isend(buf, dest, tag)], timeout)

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a synchronous-mode send, complete once the matching receive has started.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).

        Returns:
            Request: complete once ``dest`` has started the matching receive.

        Raises:
            ArgumentError, InvalidBufferError, PeerError, CommError: as :meth:`Isend`.
        """
        return self.Isend(buf, dest, tag, synchronous=True)

    def Ssend(self, buf, dest: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``buf`` synchronously: return once ``dest`` has started the matching receive.

        Args:
            buf: the data, as for :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB (default 0).
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Isend`, before anything is sent.
            CommTimeoutError: no matching receive started within ``timeout`` seconds; the
                message is then withdrawn, as in :meth:`Send`.
            PeerError: ``dest`` died or its connection dropped.
            CommError: the communicator has been freed.
        """
        self._wait_posted([self.Isend(buf, dest, tag, synchronous=True)], timeout)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive of a message into ``buf`` (MPI_Irecv).

        Args:
            buf: a writable C-contiguous numeric buffer (or ``[buf, datatype]`` / ``[buf,
                count, datatype]``); the message may fill up to ``buf.nbytes`` bytes.
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (completes at once, with
                count 0).
            tag: message tag, or ANY_TAG (default).

        Returns:
            Request: after its ``Wait``, a Status gives source, tag and count (bytes); ``Wait``
            raises TruncationError if the message was larger than ``buf``.

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            InvalidBufferError: ``buf`` is not a contiguous numeric buffer, or is read-only.
            PeerError: the connection to ``source`` has already failed.
            CommError: the communicator has been freed.
        """
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        arr = as_array(buf, self.rank, "buf", writable=True)
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:
            return null_request(self._engine)
        src = self._world[source] if source >= 0 else ANY_SOURCE
        req = self._engine.irecv(byte_view(arr), src, self._pctx, tag)
        req.comm = self
        return req

    def Irecv_alloc(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive whose buffer is allocated, at the message's size, on match.

        A message of any size is taken: the receive of a matched probe (MPI_Mprobe +
        MPI_Mrecv) in one call. The object API receives with it.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (completes at once,
                with no data).
            tag: message tag, or ANY_TAG (default).

        Returns:
            Request: after its ``Wait``, ``req.obj`` is a ``bytearray`` of the message
            (``None`` from PROC_NULL) and a Status gives source, tag and count (bytes).

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            PeerError: the connection to ``source`` has already failed.
            CommError: the communicator has been freed.
        """
        if self._freed:
            raise CommError(f"rank {self.rank}: {self.name} has been freed")
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:
            return null_request(self._engine)
        req = self._engine.irecv(None, self._world[source] if source >= 0 else ANY_SOURCE,
                                 self._pctx, tag)
        req.comm = self
        return req

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None, *, timeout: float | None = None) -> None:
        """Receive a message into ``buf``, blocking until it has arrived (MPI_Recv).

        Args:
            buf: a writable C-contiguous numeric buffer, as for :meth:`Irecv`.
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            tag: message tag, or ANY_TAG (default).
            status: a Status to fill (source, tag, count in bytes), or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError, InvalidBufferError: as :meth:`Irecv`, before anything is posted.
            TruncationError: the message is larger than ``buf``.
            CommTimeoutError: nothing matched within ``timeout`` seconds (the receive is then
                withdrawn).
            PeerError: ``source`` died or its connection dropped.
            CommError: the communicator has been freed, or the sender withdrew a large message
                this receive had matched (its Send timed out).
        """
        eng = self._engine
        if type(buf) is np.ndarray and type(source) is int and type(tag) is int and \
                buf.nbytes and (0 <= source < self.size or source == ANY_SOURCE) and \
                (0 <= tag <= TAG_UB or tag == ANY_TAG) and not eng._threaded and \
                buf.flags.c_contiguous and buf.flags.writeable and \
                buf.dtype.char in _CASTABLE and not self._freed:
            # the common case with the checks of Irecv inlined (see Send)
            view = buf.data.cast("B")
            if source >= 0 and tag >= 0:
                # A small message from a named rank: take it straight from the transport
                # when it is the next frame from there (Engine.recv_now), spinning a while
                # for it; else (another frame first, or none in time) post a receive.
                w = self._world[source]
                n = eng.recv_now(view, w, self._pctx, tag, spin=True)
                if n >= 0:
                    _trace.instant("Recv", self, tag, n, w)
                    if status is not None:
                        status.source, status.tag, status.count = source, tag, n
                        status.cancelled = False
                    return
            req = eng.irecv(view, self._world[source] if source >= 0 else ANY_SOURCE,
                            self._pctx, tag)
            req.comm = self
            if req.done and req.error is None:      # taken from the unexpected queue
                _trace.instant("Recv", self, tag, req.count, req.source)
            else:                                   # _wait_posted and record_wait, inlined
                n = _trace.begin("Recv", self, tag, req.nbytes, None, req.peer)
                try:
                    eng.wait(req, timeout)
                except BaseException as exc:
                    _trace.fail(n, exc)
                    if isinstance(exc, CommTimeoutError):
                        eng.cancel(req)     # unmatched: it must not swallow a later message
                    raise
                _trace.end(n)
        else:
            req = self.Irecv(buf, source, tag)
            self._wait_posted([req], timeout)
        if status is not None:
            self._status_of(req, status)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None, *, timeout: float | None = None) -> None:
        """Send ``sendbuf`` to ``dest`` and receive into ``recvbuf``; both progress together.

        Args:
            sendbuf: the data to send, as ``buf`` of :meth:`Isend`.
            dest: destination rank, or PROC_NULL.
            sendtag: tag of the message sent, 0..TAG_UB (default 0).
            recvbuf: a writable numeric buffer for the message received (required).
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            recvtag: tag to receive, or ANY_TAG (default).
            status: a Status to fill for the receive, or None.
            timeout: keyword-only; seconds to wait for both (None: ``PYCOMM_TIMEOUT``).

        Returns:
            None.

        Raises:
            ArgumentError: ``recvbuf`` is None, or a rank or tag is invalid (the send side is
                checked before the receive is posted).
            InvalidBufferError: a buffer is unusable (``recvbuf`` read-only).
            TruncationError: the message received is larger than ``recvbuf``.
            CommTimeoutError: not complete within ``timeout`` seconds (both are withdrawn).
            PeerError: a peer died or its connection dropped.
            CommError: the communicator has been freed.
        """
        if recvbuf is None:
            raise ArgumentError(f"rank {self.rank}: Sendrecv needs a recvbuf")
        # Check the send side before the receive is posted: a receive left posted by a
        # call that raised would swallow a later message.
        sendbuf = as_array(sendbuf, self.rank, "sendbuf")
        self._check_rank(dest, "dest")
        self._check_tag(sendtag, "sendtag")
        r = self.Irecv(recvbuf, source, recvtag)
        s = self.Isend(sendbuf, dest, sendtag)
        self._wait_posted([s, r], timeout)
        self._status_of(r, status)

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

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> bool:
        """Return whether a message that a receive (``source``, ``tag``) would match has arrived.

        Makes progress once and does not receive the message.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL (always True, count 0).
            tag: message tag, or ANY_TAG (default).
            status: a Status filled with the message's source, tag and count (bytes) when
                True, or None.

        Returns:
            bool: True when such a message is waiting.

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            PeerError: a link failed while making progress.
            CommError: the communicator has been freed.
        """
        self._check_alive()
        source = self._check_rank(source, "source", allow_any=True)
        tag = self._check_tag(tag, "tag", allow_any=True)
        if source == PROC_NULL:         # MPI: succeeds at once, as a receive from it would
            _fill(status, PROC_NULL, ANY_TAG, 0)
            return True
        src = self._world[source] if source >= 0 else ANY_SOURCE
        u = self._engine.iprobe(src, self._pctx, tag)
        if u is None:
            return False
        _fill(status, self._from_world.get(u.src, u.src), u.tag, u.nbytes)
        return True

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None, *, timeout: float | None = None) -> bool:
        """Block until a message that a receive (``source``, ``tag``) would match has arrived.

        Args:
            source: sending rank, ANY_SOURCE (default) or PROC_NULL.
            tag: message tag, or ANY_TAG (default).
            status: a Status filled with the message's source, tag and count (bytes), or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            True (mpi4py's convention).

        Raises:
            ArgumentError: invalid ``source`` or ``tag``.
            CommTimeoutError: no such message within ``timeout`` seconds.
            PeerError: a peer died or its connection dropped.
            CommError: the communicator has been freed.
        """
        st = Status() if status is None else status
        self._engine.wait_until(lambda: self.Iprobe(source, tag, st), timeout,
                                f"Probe(source={source}, tag={tag})")
        return True

    def chosen_algorithm(self, collective: str, nbytes: int, *, commutative: bool = True,
                         algorithm: str | None = None, blocking: bool = True) -> str:
        """Name the algorithm a call on this communicator would run.

        The same choice the collective itself makes (:func:`pycomm.collectives.choose` with
        this communicator's size, transport and agreed ranks per core), for logs and
        benchmarks: ``"shared_slots"`` where a blocking call goes through shared-memory
        slots instead of messages (:mod:`pycomm.shmcoll`), ``"shm_direct"`` where a
        blocking all-reduce, reduce-scatter-block or all-gather reads its peers' buffers
        directly (:mod:`pycomm.shmdirect`; a commutative op is taken to be a built-in
        one: a user-defined op sends messages). Sends nothing.

        Args:
            collective: e.g. ``"allreduce"`` (a key of ``pycomm.collectives.REGISTRY``).
            nbytes: bytes of the call as defined in :mod:`pycomm.collectives` (e.g. the
                whole receive buffer for allgather).
            commutative: whether the reduction op commutes.
            algorithm: as the collective's ``algorithm=``; None honours
                ``PYCOMM_ALGORITHM_<COLLECTIVE>``, ``"auto"`` ignores it.
            blocking: False names what the nonblocking variant (``Iallreduce``, ...) runs,
                which always sends messages.

        Returns:
            str: the algorithm's registry name (e.g. ``"recursive_doubling"``),
            ``"shared_slots"`` or ``"shm_direct"``.

        Raises:
            ArgumentError: unknown collective or algorithm, or a named algorithm that
                cannot serve the call.
        """
        return self._selection.chosen_algorithm(collective, nbytes, commutative=commutative,
                                                algorithm=algorithm, blocking=blocking)

    # -- collectives, buffers -------------------------------------------------------------
    def _slots_call(self, plan, collective: str, nbytes: int, *args) -> None:
        """Run a blocking call through shared-memory slots or direct reads (``plan``: its
        plan there, see :func:`pycomm.plan.plan_call`; ``args``: its kernel's, see
        :meth:`pycomm.shmcoll.SharedSlots.kernel`), recorded like any call."""
        cc = self._calls.begin(plan[0], True)
        if self._debug:
            return self._selection.run(collective, nbytes, None, plan[3],
                                       lambda fn: fn(cc, *args), plan=plan)
        n = _trace.begin(collective, self, cc.tag, nbytes, plan[1], -1)
        try:
            plan[2](cc, *args)
        except BaseException as exc:
            _trace.fail(n, exc)
            raise
        _trace.end(n)

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
        send = None if sendbuf is IN_PLACE else as_array(sendbuf, self.rank, "sendbuf")
        if send is not None and send.dtype != recv.dtype:
            raise InvalidBufferError(f"rank {self.rank}: {what}: sendbuf dtype {send.dtype} "
                                     f"differs from recvbuf dtype {recv.dtype}")
        return send, recv

    @collective
    def Barrier(self, *, algorithm: str | None = None) -> None:
        """Block until every rank of the communicator has entered the barrier (MPI_Barrier).

        Algorithms: see :mod:`pycomm.collectives.barrier`; a one-host shared-memory
        communicator uses :mod:`pycomm.shmcoll`.

        Args:
            algorithm: keyword-only; a name of ``pycomm.algorithms("barrier")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_BARRIER`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: unknown ``algorithm``.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        plan = plan_call(self, "barrier", None, -1, 0, algorithm)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "barrier", 0)
        cc = self._calls.begin(plan[0])
        self._selection.run("barrier", 0, algorithm, None, lambda fn: fn(cc), plan=plan)

    @collective
    def Bcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> None:
        """Broadcast ``buf`` from ``root`` to every rank, in place (MPI_Bcast).

        Algorithms: see :mod:`pycomm.collectives.bcast` (small calls on one host:
        :mod:`pycomm.shmcoll`).

        Args:
            buf: C-contiguous numeric buffer, the same dtype and element count on every rank:
                the data at the root, overwritten (so writable) elsewhere.
            root: the rank that sends (default 0).
            algorithm: keyword-only; a name of ``pycomm.algorithms("bcast")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_BCAST`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: invalid ``root`` or ``algorithm``.
            InvalidBufferError: ``buf`` is unusable (read-only on a non-root rank).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        root = self._check_root(root)
        arr = as_array(buf, self.rank, "buf", writable=self.rank != root)
        plan = plan_call(self, "bcast", arr.dtype, arr.size, arr.nbytes, algorithm, root=root)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "bcast", arr.nbytes, arr, root)
        cc = self._calls.begin(plan[0])
        self._selection.run("bcast", arr.nbytes, algorithm, None, lambda fn: fn(cc, arr, root),
                            plan=plan)

    @collective
    def Allreduce(self, sendbuf, recvbuf, op: Op = SUM, *,
                  algorithm: str | None = None) -> None:
        """Combine every rank's ``sendbuf`` element-wise with ``op``; all get the result.

        Every rank ends with bit-identical bytes. Algorithms: see
        :mod:`pycomm.collectives.allreduce` (small calls on one host: :mod:`pycomm.shmcoll`).

        Args:
            sendbuf: this rank's contribution, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: the result (writable), same dtype and element count as ``sendbuf``.
            op: SUM (default), PROD, MIN, MAX, ... or a user Op; a non-commutative op gets the
                operands in rank order.
            algorithm: keyword-only; a name of ``pycomm.algorithms("allreduce")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_ALLREDUCE`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: ``op`` is not an Op or not defined on the dtype; unknown
                ``algorithm``.
            InvalidBufferError: the buffers' element counts or dtypes differ, or ``recvbuf``
                is read-only.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        send, recv = self._pair(sendbuf, recvbuf, "Allreduce")
        if send is not None:
            if send.size != recv.size:
                raise InvalidBufferError(f"rank {self.rank}: Allreduce: sendbuf has "
                                         f"{send.size} elements, recvbuf {recv.size}")
        plan = plan_call(self, "allreduce", recv.dtype, recv.size, recv.nbytes, algorithm, op)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "allreduce", recv.nbytes, recv, plan[3], send)
        op = plan[3]
        cc = self._calls.begin(plan[0])

        def call(fn):           # recvbuf is written only once the algorithm is known
            if send is not None:
                np.copyto(recv, send)
            fn(cc, recv, op)
        self._selection.run("allreduce", recv.nbytes, algorithm, op, call, plan=plan)

    @collective
    def Reduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0, *,
               algorithm: str | None = None) -> None:
        """Combine every rank's ``sendbuf`` element-wise with ``op`` into ``recvbuf`` at ``root``.

        Algorithms: see :mod:`pycomm.collectives.reduce` (small calls on one host:
        :mod:`pycomm.shmcoll`).

        Args:
            sendbuf: this rank's contribution; IN_PLACE at the root (``recvbuf`` holds it).
            recvbuf: the result at the root (writable, same dtype and element count as
                ``sendbuf``); ignored (may be None) elsewhere.
            op: SUM (default), PROD, MIN, MAX, ... or a user Op (rank order kept).
            root: the rank that gets the result (default 0).
            algorithm: keyword-only; a name of ``pycomm.algorithms("reduce")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_REDUCE`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: invalid ``root``, ``op`` or ``algorithm``; IN_PLACE off the root.
            InvalidBufferError: the root's buffers differ in element count or dtype.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        root = self._check_root(root)
        if self.rank == root:
            send, recv = self._pair(sendbuf, recvbuf, "Reduce")
            if send is not None:
                if send.size != recv.size:
                    raise InvalidBufferError(f"rank {self.rank}: Reduce: sendbuf has "
                                             f"{send.size} elements, recvbuf {recv.size}")
            work = recv
        else:
            if sendbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Reduce: IN_PLACE is only valid at "
                                    "the root")
            send = None
            work = as_array(sendbuf, self.rank, "sendbuf")   # copied below if need be
        plan = plan_call(self, "reduce", work.dtype, work.size, work.nbytes, algorithm, op,
                         root)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "reduce", work.nbytes, work, root, plan[3], send)
        if self.rank != root:
            work = work.copy()          # the algorithms reduce into it
        op = plan[3]
        cc = self._calls.begin(plan[0])

        def call(fn):           # recvbuf is written only once the algorithm is known
            if send is not None:
                np.copyto(work, send)
            fn(cc, work, root, op)
        self._selection.run("reduce", work.nbytes, algorithm, op, call, plan=plan)

    @collective
    def Allgather(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        """Gather every rank's ``sendbuf`` into every rank's ``recvbuf``, in rank order.

        Algorithms: see :mod:`pycomm.collectives.allgather` (small calls on one host:
        :mod:`pycomm.shmcoll`).

        Args:
            sendbuf: this rank's block of n elements, or IN_PLACE (it is already block
                ``rank`` of ``recvbuf``).
            recvbuf: size * n elements of the same dtype (writable); block i comes from rank i.
            algorithm: keyword-only; a name of ``pycomm.algorithms("allgather")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_ALLGATHER`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: unknown ``algorithm``.
            InvalidBufferError: ``recvbuf`` is not size times ``sendbuf``, the dtypes differ,
                or ``recvbuf`` is read-only.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        send, recv = self._pair(sendbuf, recvbuf, "Allgather")
        count = self._blocks(recv, send, "Allgather")
        plan = plan_call(self, "allgather", recv.dtype, count, recv.nbytes, algorithm)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "allgather", recv.nbytes, recv, count, send)
        cc = self._calls.begin(plan[0])

        def call(fn):           # recvbuf is written only once the algorithm is known
            if send is not None:
                recv[self.rank * count:(self.rank + 1) * count] = send
            fn(cc, recv, count)
        self._selection.run("allgather", recv.nbytes, algorithm, None, call, plan=plan)

    @collective
    def Gather(self, sendbuf, recvbuf, root: int = 0, *,
               algorithm: str | None = None) -> None:
        """Gather every rank's ``sendbuf`` into ``recvbuf`` at ``root``, in rank order.

        Algorithms: see :mod:`pycomm.collectives.gather`.

        Args:
            sendbuf: this rank's block of n elements; IN_PLACE at the root (its block is
                already block ``root`` of ``recvbuf``).
            recvbuf: at the root, size * n elements of the same dtype (writable); ignored
                elsewhere.
            root: the rank that receives (default 0).
            algorithm: keyword-only; a name of ``pycomm.algorithms("gather")``, ``"auto"``
                (the cost model) or None (``PYCOMM_ALGORITHM_GATHER`` if set, else
                the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: invalid ``root`` or ``algorithm``; IN_PLACE off the root.
            InvalidBufferError: the root's ``recvbuf`` is not size times ``sendbuf``, or the
                dtypes differ.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        root = self._check_root(root)
        if self.rank == root:
            send, recv = self._pair(sendbuf, recvbuf, "Gather")
            count = self._blocks(recv, send, "Gather")
            if send is None:
                send = recv[root * count:(root + 1) * count]
        else:
            if sendbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Gather: IN_PLACE is only valid at "
                                    "the root")
            send, recv = as_array(sendbuf, self.rank, "sendbuf"), None
        plan = plan_call(self, "gather", send.dtype, send.size, send.nbytes * self.size,
                         algorithm, root=root)
        cc = self._calls.begin(plan[0])
        self._selection.run("gather", send.nbytes * self.size, algorithm, None,
                            lambda fn: fn(cc, send, recv, root), plan=plan)

    @collective
    def Scatter(self, sendbuf, recvbuf, root: int = 0, *,
                algorithm: str | None = None) -> None:
        """Send block i of root's ``sendbuf`` to rank i's ``recvbuf`` (MPI_Scatter).

        Algorithms: see :mod:`pycomm.collectives.scatter`.

        Args:
            sendbuf: at the root, size * n elements; ignored elsewhere.
            recvbuf: this rank's n elements (writable); IN_PLACE at the root (it keeps its
                block in ``sendbuf``).
            root: the rank that sends (default 0).
            algorithm: keyword-only; a name of ``pycomm.algorithms("scatter")``, ``"auto"``
                (the cost model) or None (``PYCOMM_ALGORITHM_SCATTER`` if set, else
                the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: invalid ``root`` or ``algorithm``; IN_PLACE off the root.
            InvalidBufferError: the root's ``sendbuf`` is not size times ``recvbuf`` (with
                IN_PLACE: not a multiple of the size), or ``recvbuf`` is read-only.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        root = self._check_root(root)
        if self.rank == root:
            if recvbuf is IN_PLACE:
                send = as_array(sendbuf, self.rank, "sendbuf")
                if send.size % self.size:
                    raise InvalidBufferError(f"rank {self.rank}: Scatter: sendbuf has "
                                             f"{send.size} elements, not a multiple of "
                                             f"{self.size}")
                n = send.size // self.size
                recv = send[root * n:(root + 1) * n].copy()
            else:
                recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
                send = as_array(sendbuf, self.rank, "sendbuf")
                self._blocks(send, recv, "Scatter", recv_side=False)
                if send.dtype != recv.dtype:
                    raise InvalidBufferError(f"rank {self.rank}: Scatter: sendbuf dtype "
                                             f"{send.dtype} differs from recvbuf dtype "
                                             f"{recv.dtype}")
        else:
            if recvbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Scatter: IN_PLACE is only valid at "
                                    "the root")
            send, recv = None, as_array(recvbuf, self.rank, "recvbuf", writable=True)
        plan = plan_call(self, "scatter", recv.dtype, recv.size, recv.nbytes * self.size,
                         algorithm, root=root)
        cc = self._calls.begin(plan[0])
        self._selection.run("scatter", recv.nbytes * self.size, algorithm, None,
                            lambda fn: fn(cc, send, recv, root), plan=plan)

    @collective
    def Alltoall(self, sendbuf, recvbuf, *, algorithm: str | None = None) -> None:
        """Send block j of ``sendbuf`` to rank j; block i of ``recvbuf`` comes from rank i.

        Algorithms: see :mod:`pycomm.collectives.alltoall`.

        Args:
            sendbuf: size blocks of n elements, or IN_PLACE (``recvbuf`` holds them; a copy is
                taken first).
            recvbuf: size blocks of n elements of the same dtype (writable).
            algorithm: keyword-only; a name of ``pycomm.algorithms("alltoall")``, ``"auto"``
                (the cost model) or None (``PYCOMM_ALGORITHM_ALLTOALL`` if set, else
                the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: unknown ``algorithm``.
            InvalidBufferError: the element counts or dtypes differ, or the count is not a
                multiple of the communicator size.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        send, recv = self._pair(sendbuf, recvbuf, "Alltoall")
        if send is None:
            send = recv.copy()
        elif send.size != recv.size:
            raise InvalidBufferError(f"rank {self.rank}: Alltoall: sendbuf has {send.size} "
                                     f"elements, recvbuf {recv.size}")
        if recv.size % self.size:
            raise InvalidBufferError(f"rank {self.rank}: Alltoall: {recv.size} elements is "
                                     f"not a multiple of the communicator size {self.size}")
        count = recv.size // self.size
        plan = plan_call(self, "alltoall", recv.dtype, count, recv.nbytes, algorithm)
        cc = self._calls.begin(plan[0])
        self._selection.run("alltoall", recv.nbytes, algorithm, None,
                            lambda fn: fn(cc, send, recv, count), plan=plan)

    @collective
    def Reduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM, *,
                             algorithm: str | None = None) -> None:
        """Reduce ``sendbuf`` (size * n elements) with ``op``; rank i gets block i (n elements).

        Algorithms: see :mod:`pycomm.collectives.reduce_scatter` (small calls on one host:
        :mod:`pycomm.shmcoll`).

        Args:
            sendbuf: this rank's size * n elements, or IN_PLACE (``recvbuf`` holds them and
                gets the result in its first n).
            recvbuf: n elements of the same dtype (writable).
            op: SUM (default), PROD, MIN, MAX, ... or a user Op (rank order kept).
            algorithm: keyword-only; a name of ``pycomm.algorithms("reduce_scatter_block")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or None
                (``PYCOMM_ALGORITHM_REDUCE_SCATTER_BLOCK`` if set, else the cost model).

        Returns:
            None.

        Raises:
            ArgumentError: invalid ``op`` or ``algorithm``.
            InvalidBufferError: ``sendbuf`` is not size times ``recvbuf`` (IN_PLACE:
                ``recvbuf`` is not a multiple of the size), or the dtypes differ.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`Communicator`).
        """
        send, recv = self._pair(sendbuf, recvbuf, "Reduce_scatter_block")
        if send is None:
            if recv.size % self.size:
                raise InvalidBufferError(f"rank {self.rank}: Reduce_scatter_block: recvbuf "
                                         f"of {recv.size} elements is not a multiple of "
                                         f"{self.size}")
            n = recv.size // self.size
            work, out = recv, recv[:n]
        else:
            if send.size != recv.size * self.size:
                raise InvalidBufferError(f"rank {self.rank}: Reduce_scatter_block: sendbuf "
                                         f"has {send.size} elements, expected size*"
                                         f"{recv.size} = {recv.size * self.size}")
            work, out = send, recv
        plan = plan_call(self, "reduce_scatter_block", out.dtype, out.size, work.nbytes,
                         algorithm, op)
        if plan[4] is not None and self._defer is None:
            return self._slots_call(plan[4], "reduce_scatter_block", work.nbytes, work, out,
                                    plan[3])
        if send is None:
            work = work.copy()          # IN_PLACE: the result lands on the input
        op = plan[3]
        cc = self._calls.begin(plan[0])
        self._selection.run("reduce_scatter_block", work.nbytes, algorithm, op,
                            lambda fn: fn(cc, work, out, op), plan=plan)

    def _blocks(self, whole: np.ndarray, part: np.ndarray | None, what: str,
                recv_side: bool = True) -> int:
        if whole.size % self.size:
            name = "recvbuf" if recv_side else "sendbuf"
            raise InvalidBufferError(f"rank {self.rank}: {what}: {name} has {whole.size} "
                                     f"elements, not a multiple of the size {self.size}")
        count = whole.size // self.size
        if part is not None and part.size != count:
            name = "sendbuf" if recv_side else "recvbuf"
            raise InvalidBufferError(f"rank {self.rank}: {what}: {name} has {part.size} "
                                     f"elements but the other buffer implies {count} per "
                                     "rank")
        return count

    # -- misc -----------------------------------------------------------------------------
    def Abort(self, errorcode: int = 1) -> None:
        """Terminate this process at once (MPI_Abort); the launcher then stops the other ranks.

        Args:
            errorcode: this process's exit status (default 1).

        Returns:
            Never: the process exits (``os._exit``, no atexit handlers, no cleanup).

        Raises:
            Nothing.
        """
        sys.stderr.write(f"pycomm: rank {self.rank} called Abort({errorcode})\n")
        sys.stderr.flush()
        os._exit(errorcode)


