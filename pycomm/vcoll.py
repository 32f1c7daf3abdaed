"""Vector collectives and prefix reductions: ``Gatherv``, ``Scatterv``, ``Allgatherv``,
``Alltoallv``, ``Reduce_scatter``, ``Scan``, ``Exscan`` (mpi4py names and semantics).

Vector buffers follow mpi4py's buffer specifications: ``[buf, counts]`` (displacements
are the running sum of the counts), ``[buf, counts, displs]``, ``[buf, counts, displs,
datatype]`` or ``[buf, (counts, displs), datatype]``; counts and displacements are in
elements. A rank may contribute zero elements. Everything is validated before any byte
moves; the schedules live in :mod:`pycomm.collectives`.
"""

from __future__ import annotations

from itertools import accumulate
from operator import add

import numpy as np

from . import slotkernels
from .buffers import IN_PLACE, CheckedVector, as_array
from .errors import ArgumentError, InvalidBufferError, TruncationError
from .ops import SUM
from .plan import SHARED_SLOTS, kept, slot_limit, slots_of
from .signature import collective, signature

__all__ = ["VectorMethods"]


class VectorMethods:
    """Mixin of the communicator: the collectives with per-rank counts, and scans."""

    _vspec_memo: dict | None = None     # per spec argument: the last accepted short pass

    def _vspec(self, spec, arg: str, *, writable: bool):
        """Parse a vector buffer spec into (1-D array, counts list, displs list)."""
        if type(spec) is CheckedVector:
            return spec[0], spec[1], spec[2]
        if type(spec) in (list, tuple) and len(spec) == 3 and \
                type(spec[0]) is np.ndarray and type(spec[1]) is list and \
                type(spec[2]) is list:      # [array, counts, displs]: one short pass
            arr = as_array(spec[0], self.rank, arg, writable=writable)
            counts, displs, n = spec[1], spec[2], arr.size
            # A program passes the same counts call after call: copies of the lists this
            # pass last accepted for ``arg`` are kept, with their furthest block end, and
            # equal ones are not walked again. The copies are what is returned (callers
            # only read them; equal floats or numpy ints come back as these ints).
            memo = self._vspec_memo
            if memo is None:
                memo = self._vspec_memo = {}
            last = memo.get(arg)
            if last is not None and n >= last[2] and counts == last[0] and \
                    displs == last[1]:
                return arr, last[0], last[1]
            if len(counts) == len(displs) == self.size and all(
                    type(c) is int and type(d) is int and 0 <= c and 0 <= d and
                    c + d <= n for c, d in zip(counts, displs)):
                counts, displs = list(counts), list(displs)
                memo[arg] = (counts, displs, max(map(add, counts, displs), default=0))
                return arr, counts, displs
        if not isinstance(spec, (list, tuple)) or len(spec) < 2:
            raise InvalidBufferError(f"rank {self.rank}: {arg} must be [buf, counts], "
                                     "[buf, counts, displs] or [buf, (counts, displs), "
                                     "datatype]")
        buf, rest = spec[0], list(spec[1:])
        if rest and isinstance(rest[0], tuple) and len(rest[0]) == 2 and \
                not isinstance(rest[0][0], (int, np.integer)):
            counts, displs, rest = rest[0][0], rest[0][1], rest[1:]
        else:
            counts = rest.pop(0)
            displs = rest.pop(0) if rest and not _is_datatype(rest[0]) else None
        datatype = rest[0] if rest else None
        arr = as_array([buf, datatype] if datatype is not None else buf, self.rank, arg,
                       writable=writable)
        counts = self._counts(counts, arg, "counts")
        if displs is None:
            displs = [0, *accumulate(counts[:-1])]
        else:
            displs = self._counts(displs, arg, "displs")
        if max(map(add, counts, displs)) > arr.size:    # (one pass; the loop names it)
            for r, (c, d) in enumerate(zip(counts, displs)):
                if d + c > arr.size:
                    raise InvalidBufferError(f"rank {self.rank}: {arg}: block {r} "
                                             f"(displacement {d}, count {c}) overruns the "
                                             f"buffer of {arr.size} elements")
        return arr, counts, displs

    def _counts(self, values, arg: str, name: str = "") -> list[int]:
        """``values`` as ``size`` non-negative ints (``arg`` and ``name`` label them in
        the error, built only then)."""
        try:
            out = list(map(int, values))
        except (TypeError, ValueError):
            raise ArgumentError(f"rank {self.rank}: {arg} {name}".rstrip() + " must be a "
                                f"sequence of ints, got {values!r}") from None
        if len(out) != self.size or min(out) < 0:
            raise ArgumentError(f"rank {self.rank}: {arg} {name}".rstrip() + f" must hold "
                                f"{self.size} non-negative ints, got {out}")
        return out

    @collective
    def Gatherv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None):
        """Gather a variable-size block from every rank into root's ``[buf, counts, displs]``.

        Algorithm: see :mod:`pycomm.collectives.gather`.

        Args:
            sendbuf: this rank's block (``counts[rank]`` elements of the receive dtype at the
                root), or IN_PLACE at the root: its block is already at ``displs[root]``.
            recvbuf: at the root, a vector spec (``[buf, counts]``, ``[buf, counts, displs]``,
                ``[buf, counts, displs, datatype]`` or ``[buf, (counts, displs), datatype]``);
                ignored elsewhere.
            root: rank that receives.
            algorithm: keyword-only; a name of ``pycomm.algorithms("gatherv")`` or None.

        Returns:
            None; block i lands at ``displs[i]`` of the root's buffer.

        Raises:
            ArgumentError: bad root, counts or displacements, or IN_PLACE off the root.
            InvalidBufferError: a block overruns ``recvbuf``, or ``sendbuf`` does not match
                ``counts[root]`` and the receive dtype.
            TruncationError: a block's size differs from the count this rank expects
                (the ranks passed different counts).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        root = self._check_root(root)
        counts = displs = recv = None
        if self.rank == root:
            recv, counts, displs = self._vspec(recvbuf, "recvbuf", writable=True)
            if sendbuf is IN_PLACE:
                send = recv[displs[root]:displs[root] + counts[root]]
            else:
                send = as_array(sendbuf, self.rank, "sendbuf")
                if send.size != counts[root] or send.dtype != recv.dtype:
                    raise InvalidBufferError(f"rank {self.rank}: Gatherv: sendbuf has "
                                             f"{send.size} x {send.dtype}, counts[root] is "
                                             f"{counts[root]} x {recv.dtype}")
        else:
            if sendbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Gatherv: IN_PLACE only at the root")
            send = as_array(sendbuf, self.rank, "sendbuf")
        cc = self._calls.begin(signature("Gatherv", send.dtype, -1, root))
        self._selection.run("gatherv", 0, algorithm, None,
                            lambda fn: fn(cc, send, recv, counts, displs, root),
                            log_bytes=sum(counts) * recv.itemsize if self.rank == root
                            else send.nbytes)

    @collective
    def Scatterv(self, sendbuf, recvbuf, root: int = 0, *, algorithm: str | None = None):
        """Send block i (``counts[i]`` elements at ``displs[i]``) of root's buffer to rank i.

        Algorithm: see :mod:`pycomm.collectives.scatter`.

        Args:
            sendbuf: at the root, a vector spec (as ``recvbuf`` of :meth:`Gatherv`); ignored
                elsewhere.
            recvbuf: this rank's block (``counts[rank]`` elements, writable), or IN_PLACE at the
                root: it keeps its own block in place.
            root: rank that sends.
            algorithm: keyword-only; a name of ``pycomm.algorithms("scatterv")`` or None.

        Returns:
            None; ``recvbuf`` holds this rank's block.

        Raises:
            ArgumentError: bad root, counts or displacements, or IN_PLACE off the root.
            InvalidBufferError: a block overruns ``sendbuf``, or ``recvbuf`` does not match
                ``counts[rank]`` and the send dtype.
            TruncationError: a block's size differs from the count this rank expects
                (the ranks passed different counts).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        root = self._check_root(root)
        send = counts = displs = None
        if self.rank == root:
            send, counts, displs = self._vspec(sendbuf, "sendbuf", writable=False)
            if recvbuf is IN_PLACE:
                recv = send[displs[root]:displs[root] + counts[root]].copy()
            else:
                recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
                if recv.size != counts[root] or recv.dtype != send.dtype:
                    raise InvalidBufferError(f"rank {self.rank}: Scatterv: recvbuf has "
                                             f"{recv.size} x {recv.dtype}, counts[root] is "
                                             f"{counts[root]} x {send.dtype}")
        else:
            if recvbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Scatterv: IN_PLACE only at the root")
            recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
        cc = self._calls.begin(signature("Scatterv", recv.dtype, -1, root))
        self._selection.run("scatterv", 0, algorithm, None,
                            lambda fn: fn(cc, send, counts, displs, recv, root),
                            log_bytes=sum(counts) * send.itemsize if self.rank == root
                            else recv.nbytes)

    @collective
    def Allgatherv(self, sendbuf, recvbuf, *, algorithm: str | None = None):
        """Every rank gets every rank's block in ``[recvbuf, counts, displs]``.

        Algorithm: see :mod:`pycomm.collectives.allgather`.

        Args:
            sendbuf: this rank's block (``counts[rank]`` elements of ``recvbuf``'s dtype), or
                IN_PLACE: it is already at ``displs[rank]`` of ``recvbuf``.
            recvbuf: a vector spec (as ``recvbuf`` of :meth:`Gatherv`), the same counts on
                every rank.
            algorithm: keyword-only; a name of ``pycomm.algorithms("allgatherv")`` or None.

        Returns:
            None; block i lands at ``displs[i]`` of every rank's ``recvbuf``.

        Raises:
            ArgumentError: bad counts or displacements.
            InvalidBufferError: a block overruns ``recvbuf``, or ``sendbuf`` does not match
                ``counts[rank]`` and ``recvbuf``'s dtype.
            TruncationError: a block's size differs from the count this rank expects
                (the ranks passed different counts).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        recv, counts, displs = self._vspec(recvbuf, "recvbuf", writable=True)
        mine = recv[displs[self.rank]:displs[self.rank] + counts[self.rank]]
        if sendbuf is not IN_PLACE:
            send = as_array(sendbuf, self.rank, "sendbuf")
            if send.size != counts[self.rank] or send.dtype != recv.dtype:
                raise InvalidBufferError(f"rank {self.rank}: Allgatherv: sendbuf has "
                                         f"{send.size} x {send.dtype}, counts[{self.rank}] "
                                         f"is {counts[self.rank]} x {recv.dtype}")
            mine[...] = send
        cc = self._calls.begin(signature("Allgatherv", recv.dtype))
        self._selection.run("allgatherv", sum(counts) * recv.itemsize, algorithm, None,
                            lambda fn: fn(cc, recv, counts, displs))

    @collective
    def Alltoallv(self, sendbuf, recvbuf, *, algorithm: str | None = None):
        """Rank i sends ``sendcounts[j]`` elements to rank j, described by both specs.

        Algorithm: see :mod:`pycomm.collectives.alltoall` (on one host, a blocking call
        whose blocks fit a shared-memory slot: :func:`pycomm.slotkernels.alltoallv`).

        Args:
            sendbuf: a vector spec whose block j goes to rank j, or IN_PLACE: ``recvbuf``'s
                blocks are sent (a copy is taken first).
            recvbuf: a vector spec whose block j receives rank j's block for this rank (its
                count must equal that rank's send count to this rank).
            algorithm: keyword-only; a name of ``pycomm.algorithms("alltoallv")`` (which
                also turns off the shared-memory slots) or None.

        Returns:
            None; block j of ``recvbuf`` holds what rank j sent this rank.

        Raises:
            ArgumentError: bad counts or displacements.
            InvalidBufferError: a block overruns its buffer, or the two dtypes differ.
            TruncationError: a block's size differs from the matching receive count
                (the ranks passed inconsistent counts).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        recv, rcounts, rdispls = self._vspec(recvbuf, "recvbuf", writable=True)
        if sendbuf is IN_PLACE:
            send, scounts, sdispls = recv.copy(), rcounts, rdispls
        else:
            send, scounts, sdispls = self._vspec(sendbuf, "sendbuf", writable=False)
            if send.dtype != recv.dtype:
                raise InvalidBufferError(f"rank {self.rank}: Alltoallv: sendbuf dtype "
                                         f"{send.dtype} differs from recvbuf {recv.dtype}")
            me = self.rank
            if scounts[me] != rcounts[me]:      # this rank's block to itself: known here
                raise TruncationError(f"rank {me}: Alltoallv: this rank sends itself "
                                      f"{scounts[me]} elements (sendcounts[{me}]), "
                                      f"recvcounts[{me}] is {rcounts[me]}")
        sig = signature("Alltoallv", recv.dtype)
        nbytes = sum(scounts) * send.itemsize
        # (decided on every rank's first call, this one's nonblocking twin included: a
        # rank whose communicator has not decided its slots does not say that it entered
        # a call by messages, and its peers in the slots would wait for it)
        slots = slots_of(self)
        # through the slots when this rank's blocks and their table fit one (a rank past
        # it takes messages, and its peers see that and follow: pycomm.shmcoll)
        if slots is not None and self._defer is None and algorithm in (None, "auto"):
            limit, kernel, by_messages = kept(self, ("alltoallv slots", algorithm), lambda: (
                slot_limit(slots, "alltoallv", algorithm) - 16 * self.size,
                slotkernels.alltoallv(slots),
                self._selection.choose("alltoallv", 0, algorithm, True)[1]))
            if nbytes <= limit:
                return self._slots_call((sig, SHARED_SLOTS, kernel, None), "alltoallv",
                                        nbytes, send, scounts, sdispls, recv, rcounts,
                                        rdispls, by_messages)
        cc = self._calls.begin(sig)
        self._selection.run("alltoallv", 0, algorithm, None,
                            lambda fn: fn(cc, send, scounts, sdispls, recv, rcounts, rdispls),
                            log_bytes=nbytes)

    @collective
    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *,
                       algorithm: str | None = None):
        """Reduce ``sendbuf`` (sum(recvcounts) elements); rank i gets ``recvcounts[i]``.

        Algorithm: see :mod:`pycomm.collectives.reduce_scatter`.

        Args:
            sendbuf: this rank's contribution, ``sum(recvcounts)`` elements, or IN_PLACE:
                ``recvbuf`` holds the whole input and the result lands in its start.
            recvbuf: receives this rank's ``recvcounts[rank]`` reduced elements (writable).
            recvcounts: elements each rank receives; None: each rank's ``recvbuf`` size, agreed
                first with one blocking Allgather (not with IN_PLACE).
            op: SUM, PROD, MIN, MAX, ... or a user Op (applied in rank order).
            algorithm: keyword-only; a name of ``pycomm.algorithms("reduce_scatter")`` or None.

        Returns:
            None; ``recvbuf[:recvcounts[rank]]`` holds block ``rank`` of the reduction.

        Raises:
            ArgumentError: bad ``recvcounts``, IN_PLACE without ``recvcounts``, or an op the
                dtype does not support.
            InvalidBufferError: sizes or dtypes of ``sendbuf`` and ``recvbuf`` do not fit the
                counts.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        recv = as_array(recvbuf, self.rank, "recvbuf", writable=True)
        if recvcounts is None:
            if sendbuf is IN_PLACE:
                raise ArgumentError(f"rank {self.rank}: Reduce_scatter with IN_PLACE needs "
                                    "recvcounts")
            table = np.empty(self.size, dtype=np.int64)
            self.Allgather(np.array([recv.size], dtype=np.int64), table)
            recvcounts = table.tolist()
        counts = self._counts(recvcounts, "recvcounts")
        total = sum(counts)
        if sendbuf is IN_PLACE:
            if recv.size < total:
                raise InvalidBufferError(f"rank {self.rank}: Reduce_scatter: IN_PLACE "
                                         f"recvbuf has {recv.size} elements, needs {total}")
            work, out = recv[:total].copy(), recv[:counts[self.rank]]
        else:
            send = as_array(sendbuf, self.rank, "sendbuf")
            if send.size != total or send.dtype != recv.dtype or recv.size < counts[self.rank]:
                raise InvalidBufferError(f"rank {self.rank}: Reduce_scatter: sendbuf has "
                                         f"{send.size} x {send.dtype} (need {total}), recvbuf "
                                         f"{recv.size} x {recv.dtype} (need "
                                         f"{counts[self.rank]})")
            work, out = send, recv[:counts[self.rank]]   # the schedules only read it
        op = self._check_op(op, out.dtype)
        cc = self._calls.begin(signature("Reduce_scatter", out.dtype, total, op=op))
        self._selection.run("reduce_scatter", work.nbytes, algorithm, op,
                            lambda fn: fn(cc, work, out, counts, op))

    def _scan(self, name: str, sendbuf, recvbuf, op, algorithm):
        send, recv = self._pair(sendbuf, recvbuf, name.capitalize())
        if send is None:
            send = recv.copy()
        elif send.size != recv.size:
            raise InvalidBufferError(f"rank {self.rank}: {name.capitalize()}: sendbuf has "
                                     f"{send.size} elements, recvbuf {recv.size}")
        op = self._check_op(op, recv.dtype)
        cc = self._calls.begin(signature(name.capitalize(), recv.dtype, recv.size, op=op))
        self._selection.run(name, recv.nbytes, algorithm, op, lambda fn: fn(cc, send, recv, op))

    @collective
    def Scan(self, sendbuf, recvbuf, op=SUM, *, algorithm: str | None = None):
        """Inclusive prefix reduction: rank r gets x0 ∘ x1 ∘ … ∘ xr (rank order kept).

        Algorithm: see :mod:`pycomm.collectives.scan`.

        Args:
            sendbuf: this rank's vector x_r, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the prefix, same size and dtype (writable).
            op: SUM, PROD, MIN, MAX, ... or a user Op (non-commutative ones keep rank order).
            algorithm: keyword-only; a name of ``pycomm.algorithms("scan")`` or None.

        Returns:
            None; ``recvbuf`` holds x0 ∘ … ∘ x_rank.

        Raises:
            ArgumentError: an op the dtype does not support, or a bad ``algorithm``.
            InvalidBufferError: the buffers' sizes or dtypes differ.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        self._scan("scan", sendbuf, recvbuf, op, algorithm)

    @collective
    def Exscan(self, sendbuf, recvbuf, op=SUM, *, algorithm: str | None = None):
        """Exclusive prefix reduction: rank r > 0 gets x0 ∘ … ∘ x(r-1).

        Algorithm: see :mod:`pycomm.collectives.scan`.

        Args:
            sendbuf: this rank's vector x_r, or IN_PLACE (then ``recvbuf`` holds it).
            recvbuf: receives the prefix, same size and dtype (writable); rank 0's is left
                untouched (undefined in MPI).
            op: SUM, PROD, MIN, MAX, ... or a user Op (non-commutative ones keep rank order).
            algorithm: keyword-only; a name of ``pycomm.algorithms("exscan")`` or None.

        Returns:
            None.

        Raises:
            ArgumentError: an op the dtype does not support, or a bad ``algorithm``.
            InvalidBufferError: the buffers' sizes or dtypes differ.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        self._scan("exscan", sendbuf, recvbuf, op, algorithm)

    # -- object forms ---------------------------------------------------------------------
    def scan(self, sendobj, op=SUM):
        """Inclusive prefix reduction of Python objects, in rank order.

        Args:
            sendobj: this rank's picklable object.
            op: an Op whose object reduction combines two objects (default SUM: ``+``).

        Returns:
            sendobj of rank 0 ∘ … ∘ sendobj of this rank.

        Raises:
            ArgumentError: ``sendobj`` cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`); this
                one is an :meth:`allgather`.
            Exception: whatever ``op`` raises when it cannot combine two objects (e.g.
                TypeError).
        """
        values = self.allgather(sendobj)
        acc = values[0]
        for v in values[1:self.rank + 1]:
            acc = op.reduce_objects(acc, v)
        return acc

    def exscan(self, sendobj, op=SUM):
        """Exclusive prefix reduction of Python objects, in rank order.

        Args:
            sendobj: this rank's picklable object.
            op: an Op whose object reduction combines two objects (default SUM: ``+``).

        Returns:
            sendobj of rank 0 ∘ … ∘ sendobj of rank - 1; None on rank 0.

        Raises:
            ArgumentError: ``sendobj`` cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`); this
                one is an :meth:`allgather`.
            Exception: whatever ``op`` raises when it cannot combine two objects (e.g.
                TypeError).
        """
        values = self.allgather(sendobj)
        if self.rank == 0:
            return None
        acc = values[0]
        for v in values[1:self.rank]:
            acc = op.reduce_objects(acc, v)
        return acc


def _is_datatype(x) -> bool:
    if x is None or isinstance(x, (str, type, np.dtype)):
        return True
    return not hasattr(x, "__len__")
