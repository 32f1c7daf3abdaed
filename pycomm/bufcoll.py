"""The blocking buffer collectives: ``Barrier``, ``Bcast``, ``Allreduce``, ``Reduce``,
``Allgather``, ``Gather``, ``Scatter``, ``Alltoall``, ``Reduce_scatter_block`` (mpi4py
names and semantics).

Each call validates its buffers before any byte moves and takes its plan
(:func:`pycomm.plan.plan_call`: signature, algorithm and function, decided once per call
shape). A plan that skips the message layer runs through ``_slots_call`` (one host's
shared-memory slots for small calls, :mod:`pycomm.shmcoll`; direct reads of the peers'
buffers for large all-reduces, reduce-scatters and all-gathers, :mod:`pycomm.shmdirect`);
otherwise the call is numbered (:meth:`pycomm.calls.CollectiveCalls.begin`) and the
communicator's ``_selection`` runs the algorithm, from :mod:`pycomm.collectives` (each
algorithm's source is named there). The nonblocking twins (:mod:`pycomm.nbc`) run these
same methods with the schedule deferred (``_defer``), which always sends messages. The
errors every collective call may raise are listed in :class:`pycomm.comm.Communicator`.
"""

from __future__ import annotations

import numpy as np

from . import trace as _trace
from .buffers import IN_PLACE, as_array
from .errors import ArgumentError, InvalidBufferError
from .ops import SUM, Op
from .plan import plan_call
from .signature import collective

__all__ = ["CollectiveMethods"]


class CollectiveMethods:
    """Mixin of the communicator: the blocking collectives on buffers (see the module
    docstring; the attributes, components and checks it uses are :mod:`pycomm.comm`'s)."""

    def _slots_call(self, plan, collective: str, nbytes: int, *args) -> None:
        """Run a blocking call through shared-memory slots or direct reads (``plan``: its
        plan there, see :func:`pycomm.plan.plan_call`; ``args``: its kernel's, see
        :func:`pycomm.slotkernels.kernel`), recorded like any call."""
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
            return plan[4][5]()
        cc = self._calls.begin(plan[0])
        self._selection.run("barrier", 0, algorithm, None, lambda fn: fn(cc), plan=plan)

    @collective
    def Bcast(self, buf, root: int = 0, *, algorithm: str | None = None) -> None:
        """Broadcast ``buf`` from ``root`` to every rank, in place (MPI_Bcast).

        Algorithms: see :mod:`pycomm.collectives.bcast` (on one host: small calls through
        :mod:`pycomm.shmcoll`, large ones by direct reads, :func:`pycomm.shmdirect.direct_bcast`).

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
        nbytes = arr.nbytes
        plan = plan_call(self, "bcast", arr.dtype, arr.size, nbytes, algorithm, root=root)
        if plan[4] is not None and self._defer is None:
            return plan[4][5](arr, root)
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
        count, nbytes = recv.size, recv.nbytes
        if send is not None:
            if send.size != count:
                raise InvalidBufferError(f"rank {self.rank}: Allreduce: sendbuf has "
                                         f"{send.size} elements, recvbuf {count}")
        plan = plan_call(self, "allreduce", recv.dtype, count, nbytes, algorithm, op)
        if plan[4] is not None and self._defer is None:
            return plan[4][5](recv, plan[3], send)
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
            return plan[4][5](work, root, plan[3], send)
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
        nbytes = recv.nbytes
        plan = plan_call(self, "allgather", recv.dtype, count, nbytes, algorithm)
        if plan[4] is not None and self._defer is None:
            return plan[4][5](recv, count, send)
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

        Algorithms: see :mod:`pycomm.collectives.alltoall` (small calls on one host:
        :mod:`pycomm.shmcoll`).

        Args:
            sendbuf: size blocks of n elements, or IN_PLACE (``recvbuf`` holds them; a copy is
                taken first).
            recvbuf: size blocks of n elements of the same dtype (writable).
            algorithm: keyword-only; a name of ``pycomm.algorithms("alltoall")`` (which
                also turns off the shared-memory slots), ``"auto"`` (the cost model) or
                None (``PYCOMM_ALGORITHM_ALLTOALL`` if set, else the cost model).

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
        if plan[4] is not None and self._defer is None:
            return plan[4][5](send, recv, count)
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
            count = recv.size // self.size
            work, out = recv, recv[:count]
        else:
            count = recv.size
            if send.size != count * self.size:
                raise InvalidBufferError(f"rank {self.rank}: Reduce_scatter_block: sendbuf "
                                         f"has {send.size} elements, expected size*"
                                         f"{count} = {count * self.size}")
            work, out = send, recv
        nbytes = work.nbytes
        plan = plan_call(self, "reduce_scatter_block", out.dtype, count, nbytes,
                         algorithm, op)
        if plan[4] is not None and self._defer is None:
            return plan[4][5](work, out, plan[3])
        if send is None:
            work = work.copy()          # IN_PLACE: the result lands on the input
        op = plan[3]
        cc = self._calls.begin(plan[0])
        self._selection.run("reduce_scatter_block", work.nbytes, algorithm, op,
                            lambda fn: fn(cc, work, out, op), plan=plan)

    def _blocks(self, whole: np.ndarray, part: np.ndarray | None, what: str,
                recv_side: bool = True) -> int:
        total = whole.size
        if total % self.size:
            name = "recvbuf" if recv_side else "sendbuf"
            raise InvalidBufferError(f"rank {self.rank}: {what}: {name} has {total} "
                                     f"elements, not a multiple of the size {self.size}")
        count = total // self.size
        if part is not None and part.size != count:
            name = "sendbuf" if recv_side else "recvbuf"
            raise InvalidBufferError(f"rank {self.rank}: {what}: {name} has {part.size} "
                                     f"elements but the other buffer implies {count} per "
                                     "rank")
        return count
