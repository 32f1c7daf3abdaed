"""The object API (mpi4py's lowercase methods), built on the buffer API and one collective
call's byte messages.

Objects are serialised by :mod:`pycomm.serial` (pickle, cloudpickle for what pickle
refuses). A message's size is not known to its receiver in advance, so object receives
post a receive that allocates a buffer of the arriving message's size
(:meth:`pycomm.Communicator.Irecv_alloc`), as mpi4py's ``pkl5`` does with matched probes.

A collective object call is one collective call on every rank, whatever its steps, so a
failure in any step fails it everywhere and the ranks stay in step. Where its pickles fit
the shared-memory slots of a one-host communicator it is one slot exchange
(:mod:`pycomm.objslots`); otherwise it moves pickled bytes with the byte sends and
receives of the call's view (:class:`pycomm.calls.CallView` ``isend_bytes``/
``irecv_bytes``: on the communicator's collective context, never matching user messages,
the receive allocating at the message's size), not with ``Gatherv``/``Alltoallv``, which
would first need every size exchanged. Reductions apply the op in rank order, so a
non-commutative user op gets r0 ∘ r1 ∘ … ∘ r(n-1).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import objslots
from .errors import ArgumentError, CollectiveError, add_note
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL
from .serial import dumps, loads
from .signature import collective, signature

__all__ = ["ObjectMethods", "dumps", "loads"]


class _OpFailed:
    """What rank 0 broadcasts in place of an object allreduce's result when its op raised:
    the exception itself where it pickles (the other ranks raise it too), and its text."""

    def __init__(self, exc: Exception):
        self.text = f"{type(exc).__name__}: {exc}"
        try:
            self.exc = pickle.loads(pickle.dumps(exc))     # (sent only if it round-trips)
        except Exception:       # noqa: BLE001  (an exception that does not pickle)
            self.exc = None


class ObjectMethods:
    """Mixin giving :class:`~pycomm.comm.Communicator` its lowercase methods."""

    # -- point-to-point -------------------------------------------------------------------
    def isend(self, obj: Any, dest: int, tag: int = 0, *, synchronous: bool = False):
        """Start sending a picklable object to ``dest``.

        Args:
            obj: any object pickle (or, failing that, cloudpickle) can serialise.
            dest: destination rank in this communicator, or PROC_NULL.
            tag: message tag, 0..TAG_UB.
            synchronous: keyword-only; complete only once the matching receive has started
                (as :meth:`issend`).

        Returns:
            A Request; its ``wait()`` returns None once the bytes are out (or received, when
            synchronous), and raises PeerError if ``dest`` dies first.

        Raises:
            ArgumentError: bad ``dest`` or ``tag``, or ``obj`` cannot be pickled.
            PeerError: the connection to ``dest`` has already failed.
            CommError: the communicator has been freed.
        """
        return self._post_object(obj, dest, tag, synchronous, "issend" if synchronous
                                 else "isend")

    def _post_object(self, obj, dest: int, tag: int, synchronous: bool, call: str):
        """Pickle ``obj`` and post its send; ``call``: the method the user called, for the
        error when ``obj`` does not pickle."""
        payload = dumps(obj, self.rank, f"{call}(dest={dest}, tag={tag})")
        return self.Isend(np.frombuffer(payload, dtype=np.uint8), dest, tag,
                          synchronous=synchronous)

    def issend(self, obj: Any, dest: int, tag: int = 0):
        """Start a synchronous object send, complete once ``dest`` has started the receive.

        Args:
            obj: any picklable object.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB.

        Returns:
            A Request; ``wait()`` returns None (PeerError if ``dest`` dies first).

        Raises:
            ArgumentError: bad ``dest`` or ``tag``, or ``obj`` cannot be pickled.
            PeerError: the connection to ``dest`` has already failed.
            CommError: the communicator has been freed.
        """
        return self.isend(obj, dest, tag, synchronous=True)

    def send(self, obj: Any, dest: int, tag: int = 0, *, timeout: float | None = None):
        """Send a picklable object to ``dest``, blocking until its bytes are out.

        Args:
            obj: any picklable object.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB.
            timeout: keyword-only; seconds to wait (default ``PYCOMM_TIMEOUT``); a large
                message still unsent then is withdrawn, as in :meth:`Send`.

        Returns:
            None.

        Raises:
            ArgumentError: bad ``dest`` or ``tag``, or ``obj`` cannot be pickled.
            PeerError: ``dest`` died or its connection dropped.
            CommTimeoutError: not sent within ``timeout``.
        """
        self._wait_posted([self._post_object(obj, dest, tag, False, "send")], timeout)

    def ssend(self, obj: Any, dest: int, tag: int = 0, *, timeout: float | None = None):
        """Send an object synchronously: return once ``dest`` has started the matching receive.

        Args:
            obj: any picklable object.
            dest: destination rank, or PROC_NULL.
            tag: message tag, 0..TAG_UB.
            timeout: keyword-only; seconds to wait (default ``PYCOMM_TIMEOUT``); the message
                is withdrawn when it runs out, as in :meth:`send`.

        Returns:
            None.

        Raises:
            ArgumentError: bad ``dest`` or ``tag``, or ``obj`` cannot be pickled.
            PeerError: ``dest`` died or its connection dropped.
            CommTimeoutError: no matching receive started within ``timeout``.
        """
        self._wait_posted([self._post_object(obj, dest, tag, True, "ssend")], timeout)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        """Post an object receive.

        Args:
            buf: accepted for mpi4py compatibility and ignored: the receive buffer is allocated
                to the incoming message's size.
            source: sending rank, ANY_SOURCE or PROC_NULL.
            tag: message tag, or ANY_TAG.

        Returns:
            A Request; ``req.wait(status)`` returns the object (None from PROC_NULL) and raises
            PeerError if ``source`` dies first.

        Raises:
            ArgumentError: bad ``source`` or ``tag``.
            PeerError: the connection to ``source`` has already failed.
            CommError: the communicator has been freed.
        """
        self._check_alive()
        req = self.Irecv_alloc(source, tag)
        if req.source != PROC_NULL:
            req.post = loads
        return req

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None, *,
             timeout: float | None = None) -> Any:
        """Receive and return an object.

        Args:
            buf: ignored (mpi4py compatibility; the buffer fits the message).
            source: sending rank, ANY_SOURCE or PROC_NULL.
            tag: message tag, or ANY_TAG.
            status: a Status to fill (source, tag, count in bytes), or None.
            timeout: keyword-only; seconds to wait (default ``PYCOMM_TIMEOUT``).

        Returns:
            The object sent (None from PROC_NULL).

        Raises:
            ArgumentError: bad ``source`` or ``tag``.
            PeerError: ``source`` died or its connection dropped.
            CommTimeoutError: nothing matched within ``timeout``.
        """
        req = self.irecv(buf, source, tag)
        self._wait_posted([req], timeout)
        return req.wait(status)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None, *,
                 timeout: float | None = None) -> Any:
        """Send ``sendobj`` to ``dest`` and return the object received from ``source``.

        Both are in flight at once, so a ring of sendrecv calls cannot deadlock.

        Args:
            sendobj: any picklable object.
            dest: destination rank, or PROC_NULL.
            sendtag: tag of the message sent.
            recvbuf: ignored (mpi4py compatibility).
            source: sending rank, ANY_SOURCE or PROC_NULL.
            recvtag: tag to receive, or ANY_TAG.
            status: a Status to fill for the receive, or None.
            timeout: keyword-only; seconds to wait for both (default ``PYCOMM_TIMEOUT``).

        Returns:
            The object received (None from PROC_NULL).

        Raises:
            ArgumentError: bad rank or tag, or ``sendobj`` cannot be pickled (checked before
                anything is posted).
            PeerError: a peer died or its connection dropped.
            CommTimeoutError: not complete within ``timeout``.
        """
        # Check and pickle the send side before the receive is posted: a receive left
        # posted by a call that raised would swallow a later message.
        self._check_rank(dest, "dest")
        self._check_tag(sendtag, "sendtag")
        payload = np.frombuffer(dumps(sendobj, self.rank, f"sendrecv(dest={dest}, "
                                      f"sendtag={sendtag})"), dtype=np.uint8)
        r = self.irecv(recvbuf, source, recvtag)
        s = self.Isend(payload, dest, sendtag)
        self._wait_posted([s, r], timeout)
        return r.wait(status)

    # -- collectives ----------------------------------------------------------------------
    def barrier(self) -> None:
        """Block until every rank of the communicator has called it (as :meth:`Barrier`).

        Returns:
            None.

        Raises:
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        self.Barrier()

    @collective
    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        """Broadcast a picklable object from ``root``.

        Args:
            obj: the object at the root; ignored elsewhere.
            root: rank that sends.

        Returns:
            The root's object on every rank (the root returns ``obj`` itself, the others an
            unpickled copy).

        Raises:
            ArgumentError: bad ``root``, or ``obj`` cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        root = self._check_root(root)
        data = dumps(obj, self.rank, "bcast") if self.rank == root else b""
        cc, pickles = objslots.exchange(self, "bcast", signature("bcast (objects)", root=root),
                                        data)
        if pickles is not None:
            return obj if self.rank == root else pickles.load(root)
        got = self._bcast_on(cc, [data], root)
        return obj if self.rank == root else loads(got[0])

    def _bcast_on(self, cc, parts: list, root: int) -> list:
        """Broadcast the root's pickles ``parts`` (as many on every rank) on the begun call
        ``cc``: their sizes, then their bytes, each by the algorithm chosen for it.
        Returns ``parts`` at the root, views of the bytes received elsewhere."""
        run = self._selection.run
        me = self.rank == root
        n = np.array([len(p) for p in parts], dtype=np.int64)
        run("bcast", n.nbytes, None, None, lambda fn: fn(cc, n, root))
        buf = np.frombuffer(bytearray().join(parts), dtype=np.uint8) if me else \
            np.empty(int(n.sum()), dtype=np.uint8)   # (root: one copy, and writable)
        run("bcast", buf.nbytes, None, None, lambda fn: fn(cc, buf, root))
        if me:
            return parts
        ends = np.cumsum(n).tolist()
        view = memoryview(buf)
        return [view[e - k:e] for e, k in zip(ends, n.tolist())]

    @collective
    def gather(self, sendobj: Any, root: int = 0) -> list | None:
        """Gather one object per rank at ``root``.

        Args:
            sendobj: this rank's picklable object.
            root: rank that receives.

        Returns:
            At the root, the list of every rank's object in rank order; None elsewhere.

        Raises:
            ArgumentError: bad ``root``, or ``sendobj`` cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        root = self._check_root(root)
        data = dumps(sendobj, self.rank, "gather") if self.rank != root else b""
        cc, pickles = objslots.exchange(self, "gather",
                                        signature("gather (objects)", root=root), data)
        if pickles is not None:
            if self.rank != root:
                return None
            return [sendobj if r == root else pickles.load(r) for r in range(self.size)]
        got = self._gather_on(cc, data, root)
        if got is None:
            return None
        return [sendobj if r == root else loads(got[r]) for r in range(self.size)]

    def _gather_on(self, cc, data: bytes, root: int) -> list | None:
        """Every rank's pickle (``data``: this rank's) at the root on the begun call ``cc``."""
        if self.rank != root:
            cc.waitall([cc.isend_bytes(data, root)])
            return None
        reqs = {r: cc.irecv_bytes(r) for r in range(self.size) if r != root}
        cc.waitall(list(reqs.values()))
        return [data if r == root else reqs[r].obj for r in range(self.size)]

    @collective
    def scatter(self, sendobj=None, root: int = 0) -> Any:
        """Send ``sendobj[i]`` from ``root`` to rank i.

        Args:
            sendobj: at the root, a sequence of ``size`` picklable objects; ignored elsewhere.
            root: rank that sends.

        Returns:
            This rank's item of the root's sequence.

        Raises:
            ArgumentError: bad ``root``, the root's ``sendobj`` is not a sequence of ``size``
                objects, or an item cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        root = self._check_root(root)
        if self.rank == root:
            items = list(sendobj) if sendobj is not None else None
            if items is None or len(items) != self.size:
                got = "None" if items is None else f"{len(items)} items"
                raise ArgumentError(f"rank {self.rank}: scatter at the root needs a sequence "
                                    f"of {self.size} objects, got {got}")
            data = [dumps(items[r], self.rank, "scatter") for r in range(self.size)]
        # (by messages even on one host: through the slots the root would wait for every
        # peer's header, where its eager sends return at once; measured slower)
        cc = self._calls.begin(signature("scatter (objects)", root=root))
        if self.rank == root:
            cc.waitall([cc.isend_bytes(data[r], r) for r in range(self.size) if r != root])
            return items[root]
        req = cc.irecv_bytes(root)
        cc.waitall([req])
        return loads(req.obj)

    @collective
    def allgather(self, sendobj: Any) -> list:
        """Every rank gets every rank's object.

        Through the slots on one host (:mod:`pycomm.objslots`); else a gather at rank 0,
        then a broadcast of the pickles, in the same call.

        Args:
            sendobj: this rank's picklable object.

        Returns:
            The list of every rank's object, in rank order.

        Raises:
            ArgumentError: ``sendobj`` cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        data = dumps(sendobj, self.rank, "allgather")
        cc, pickles = objslots.exchange(self, "allgather", signature("allgather (objects)"),
                                        data)
        if pickles is not None:     # copies of every object, this rank's too (as mpi4py)
            return [pickles.load(r) for r in range(self.size)]
        # by messages, in this one call (a failure in either step fails it everywhere)
        got = self._bcast_on(cc, self._gather_on(cc, data, 0) or [b""] * self.size, 0)
        return [sendobj if r == self.rank == 0 else loads(got[r]) for r in range(self.size)]

    @collective
    def alltoall(self, sendobj) -> list:
        """Rank i sends ``sendobj[j]`` to rank j.

        Args:
            sendobj: a sequence of ``size`` picklable objects, item j for rank j.

        Returns:
            The list of what each rank sent this rank, in rank order.

        Raises:
            ArgumentError: ``sendobj`` does not hold ``size`` items, or one cannot be pickled.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        items = list(sendobj)
        if len(items) != self.size:
            raise ArgumentError(f"rank {self.rank}: alltoall needs a sequence of {self.size} "
                                f"objects, got {len(items)}")
        data = [dumps(items[r], self.rank, "alltoall") for r in range(self.size)]
        cc = self._calls.begin(signature("alltoall (objects)"))
        recvs = {r: cc.irecv_bytes(r) for r in range(self.size) if r != self.rank}
        sends = [cc.isend_bytes(data[r], r) for r in range(self.size) if r != self.rank]
        cc.waitall(sends + list(recvs.values()))
        return [items[r] if r == self.rank else loads(recvs[r].obj) for r in range(self.size)]

    def reduce(self, sendobj: Any, op=None, root: int = 0) -> Any:
        """Combine one object per rank with ``op`` at ``root``, in rank order.

        Args:
            sendobj: this rank's picklable object.
            op: an Op whose object reduction combines two objects (None: SUM, i.e. ``+``); a
                non-commutative op gets r0 ∘ r1 ∘ … ∘ r(n-1).
            root: rank that gets the result.

        Returns:
            The result at the root; None elsewhere.

        Raises:
            ArgumentError: bad ``root``, or ``sendobj`` cannot be pickled.
            Exception: whatever ``op`` raises at the root when it cannot combine two
                objects (e.g. TypeError).
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        from .ops import SUM
        op = SUM if op is None else op
        values = self.gather(sendobj, root)
        if values is None:
            return None
        acc = values[0]
        for v in values[1:]:
            acc = op.reduce_objects(acc, v)
        return acc

    def allreduce(self, sendobj: Any, op=None) -> Any:
        """Combine one object per rank with ``op``; every rank returns the result.

        Every rank's object in one exchange through the slots where the pickles fit (each
        rank then folds them in rank order); else a gather at rank 0, which folds them,
        then a broadcast of the result, in the same call.

        Args:
            sendobj: this rank's picklable object.
            op: an Op whose object reduction combines two objects (None: SUM, i.e. ``+``).

        Returns:
            The result, on every rank.

        Raises:
            ArgumentError: ``sendobj`` or the result cannot be pickled.
            Exception: whatever ``op`` raises when it cannot combine two objects (e.g.
                TypeError), on every rank: each combines the objects itself where they
                went through the slots (:mod:`pycomm.objslots`); else rank 0 combines, and
                the others raise the same exception (a note names rank 0), or
                CollectiveError naming it if the exception does not pickle.
            CollectiveMismatchError, CollectiveError, PeerError, CommTimeoutError, CommError:
                as every collective call (see :class:`~pycomm.comm.Communicator`).
        """
        from .ops import SUM
        op = SUM if op is None else op
        out, everywhere, raised = self._allreduce_call(sendobj, op)
        if everywhere:          # every rank holds every object: each folds them itself
            acc = out[0]
            for v in out[1:]:
                acc = op.reduce_objects(acc, v)
            return acc
        if raised is not None:  # rank 0's op raised: the call is done, rank 0 says so
            raise raised
        if type(out) is _OpFailed:
            if out.exc is not None:     # the op's own exception, as rank 0 raised it
                add_note(out.exc, f"rank {self.rank}: allreduce on {self.name}: raised by "
                         "the op on rank 0, which combines the objects")
                raise out.exc
            raise CollectiveError(f"rank {self.rank}: allreduce on {self.name}: the op "
                                  f"raised on rank 0, which combines the objects: {out.text}")
        return out

    def _allreduce_call(self, sendobj: Any, op) -> tuple[Any, bool, Exception | None]:
        """The call: ``(every object, True, None)`` through the slots; else the objects
        folded at rank 0 and the result (or :class:`_OpFailed`) broadcast: ``(that, False,
        the op's exception at rank 0, else None)``."""
        data = dumps(sendobj, self.rank, "allreduce")
        cc, pickles = objslots.exchange(self, "allreduce", signature("allreduce (objects)"),
                                        data)
        if pickles is not None:
            return [pickles.load(r) for r in range(self.size)], True, None
        gathered = self._gather_on(cc, data, 0)
        if gathered is None:
            return loads(self._bcast_on(cc, [b""], 0)[0]), False, None
        try:
            acc = sendobj
            for p in gathered[1:]:
                acc = op.reduce_objects(acc, loads(p))
        except Exception as exc:    # noqa: BLE001  (the others raise it too, after the call)
            self._bcast_on(cc, [dumps(_OpFailed(exc), self.rank, "allreduce")], 0)
            return None, False, exc
        self._bcast_on(cc, [dumps(acc, self.rank, "allreduce (the op's result)")], 0)
        return acc, False, None

    _allreduce_call.__name__ = "allreduce"        # errors name the user's call
    _allreduce_call = collective(_allreduce_call)
