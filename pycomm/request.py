"""Requests: one pending send, receive or collective (mpi4py's ``Request``).

A request is created by the p2p engine (:mod:`pycomm.p2p`) or by a nonblocking
collective (:mod:`pycomm.nbc`) and completed by whoever finishes the operation; waiting
drives the engine's progress. Waiting, testing and cancelling are calls into the engine
like any other: while another thread of the rank waits in pycomm they raise
:class:`pycomm.errors.ThreadLevelError` (pycomm provides ``THREAD_SERIALIZED``).
"""

from __future__ import annotations

from typing import Any

from . import trace as _trace

__all__ = ["Request", "sent_request"]


class Request:
    """One pending send or receive (mpi4py's ``Request``, minus the class methods).

    Attributes set on completion of a receive: ``source`` (world rank), ``tag``, ``count``
    (bytes received). ``error`` is an exception to raise on wait, or None.
    """

    __slots__ = ("engine", "done", "view", "nbytes", "ctx", "peer", "tag", "source", "count",
                 "error", "obj", "cancelled", "on_done", "comm", "post", "expect", "sig")

    def __init__(self, engine: Any, view, ctx: int, peer: int, tag: int):
        self.engine = engine
        self.done = False
        self.view = view                # memoryview 'B' of the user buffer, None = allocate
        self.nbytes = len(view) if view is not None else -1
        self.ctx, self.peer, self.tag = ctx, peer, tag
        self.source, self.count = peer, 0
        self.error: BaseException | None = None
        self.obj: Any = None            # receive with allocation: the bytearray received
        self.cancelled = False
        self.on_done = None             # callback(request) run once at completion
        self.comm = None                # communicator that translates ``source``
        self.post = None                # object receives: bytes -> object
        self.expect = -1                # collectives: exact byte count required
        self.sig = None                 # collectives: the call's signature (pycomm.signature)

    # -- mpi4py's Request API -------------------------------------------------------------
    def _status(self, status) -> None:
        if status is not None:
            if self.expect == -2:       # a send's status says nothing but cancelled (MPICH)
                status.source, status.tag, status.count = -2, -1, 0   # ANY_SOURCE, ANY_TAG
                status.cancelled = self.cancelled
                return
            src = self.source
            if self.comm is not None:
                src = self.comm._from_world.get(src, src)
            status.source, status.tag, status.count = src, self.tag, self.count
            status.cancelled = self.cancelled

    def Wait(self, status=None, *, timeout: float | None = None) -> bool:
        """Block until the operation completes; fill ``status`` (MPI_Wait).

        Args:
            status: a Status to fill with the source, tag and count (bytes) of a receive, or
                None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            True (mpi4py's convention).

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (None:
                ``PYCOMM_TIMEOUT``); the operation stays pending.
            PeerError: the peer died or its connection dropped.
            TruncationError: a receive's message was larger than its buffer.
            CollectiveMismatchError, CollectiveError: a nonblocking collective failed (see
                :class:`~pycomm.comm.Communicator`).
            CommError: the sender withdrew a large message this receive had matched.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if self.done and self.error is None:    # (an eager send, complete at its Isend)
            _trace.instant("Wait", self.comm, self.tag, self.nbytes, self.peer)
        else:
            _trace.traced("Wait", self.comm, self.tag, self.nbytes, self.peer,
                          self.engine.wait, self, timeout)
        self._status(status)
        return True

    def Test(self, status=None) -> bool:
        """Make progress once; return whether the operation has completed (MPI_Test).

        Args:
            status: a Status to fill (source, tag, count in bytes) when complete, or None.

        Returns:
            bool: True when complete (``status`` is then filled).

        Raises:
            PeerError: a link failed while making progress.
            TruncationError, CollectiveMismatchError, CollectiveError, CommError: the completed
                operation failed, as in :meth:`Wait`.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        if not self.done:
            self.engine.progress()
            if not self.done:
                return False
        if self.error is not None:
            raise self.error
        self._status(status)
        return True

    def Cancel(self) -> None:
        """Cancel a receive that has not matched, or withdraw a large send not yet handed over.

        Eager sends, matched receives and completed requests are left alone; ``Status.cancelled``
        (after :meth:`Wait`) tells whether it took effect (MPI_Cancel). See
        :meth:`pycomm.p2p.Engine.cancel`.

        Returns:
            None.

        Raises:
            Nothing: a dead peer is ignored (nothing can read the buffer any more).
        """
        self.engine.cancel(self)

    def Free(self) -> None:
        """Forget the request (MPI_Request_free); the operation still completes.

        Returns:
            None.

        Raises:
            Nothing.
        """

    def wait(self, status=None, *, timeout: float | None = None):
        """Wait for the operation; return the object received (mpi4py's object ``wait``).

        Args:
            status: a Status to fill (source, tag, count in bytes), or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            The object of an object receive (:meth:`~pycomm.comm.Communicator.irecv`); None for
            sends, buffer operations, a cancelled receive and a receive from PROC_NULL.

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (None:
                ``PYCOMM_TIMEOUT``); the operation stays pending.
            PeerError: the peer died or its connection dropped.
            TruncationError: a receive's message was larger than its buffer.
            CollectiveMismatchError, CollectiveError: a nonblocking collective failed (see
                :class:`~pycomm.comm.Communicator`).
            CommError: the sender withdrew a large message this receive had matched.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        self.Wait(status, timeout=timeout)
        return self.post(self.obj) if self.post is not None and not self.cancelled else None

    def test(self, status=None):
        """Make progress once; return ``(done, object)`` (mpi4py's object ``test``).

        Args:
            status: a Status to fill when complete, or None.

        Returns:
            tuple: ``(False, None)`` while pending; ``(True, obj)`` when complete, ``obj`` the
            object received (None for sends and buffer operations).

        Raises:
            PeerError, TruncationError, CollectiveMismatchError, CollectiveError, CommError: as
                :meth:`Test`.
        """
        if not self.Test(status):
            return False, None
        return True, (self.post(self.obj) if self.post is not None and not self.cancelled
                      else None)

    @staticmethod
    def Waitall(requests, statuses=None, *, timeout: float | None = None) -> bool:
        """Wait for every request; fill ``statuses`` (MPI_Waitall).

        Every request completes before the first failed one's error is raised, and the
        statuses of those complete are filled first, the failed one's included (MPI's
        ``MPI_ERR_IN_STATUS``).

        Args:
            requests: an iterable of Requests (may be empty).
            statuses: a list of Status objects, one per request, or None.
            timeout: keyword-only; seconds to wait for all (None: ``PYCOMM_TIMEOUT``).

        Returns:
            True (mpi4py's convention).

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (None:
                ``PYCOMM_TIMEOUT``); the operation stays pending.
            PeerError: the peer died or its connection dropped.
            TruncationError: a receive's message was larger than its buffer.
            CollectiveMismatchError, CollectiveError: a nonblocking collective failed (see
                :class:`~pycomm.comm.Communicator`).
            CommError: the sender withdrew a large message this receive had matched.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        reqs = requests if type(requests) is list else list(requests)
        if reqs:
            nbytes, over = 0, True
            for r in reqs:
                if r.nbytes > 0:
                    nbytes += r.nbytes
                if not r.done or r.error is not None:
                    over = False
            if over:            # complete already, without error: nothing to wait for
                _trace.instant("Waitall", reqs[0].comm, -1, nbytes, -1)
            else:
                try:
                    _trace.traced("Waitall", reqs[0].comm, -1, nbytes, -1,
                                  reqs[0].engine.wait_all, reqs, timeout)
                except BaseException:
                    # MPI_ERR_IN_STATUS: the statuses of the requests that completed
                    # (the failed one's too: a truncated receive's source, tag, count)
                    # are filled all the same
                    if statuses is not None:
                        for r, st in zip(reqs, statuses):
                            if r.done:
                                r._status(st)
                    raise
        if statuses is not None:
            for r, st in zip(reqs, statuses):
                r._status(st)
        return True

    @staticmethod
    def waitall(requests, statuses=None, *, timeout: float | None = None) -> list:
        """Wait for every request; return the objects received (mpi4py's object ``waitall``).

        Args:
            requests: a sequence of Requests.
            statuses: a list of Status objects, one per request, or None.
            timeout: keyword-only; seconds to wait for all (None: ``PYCOMM_TIMEOUT``).

        Returns:
            list: per request, the object received, or None for sends and buffer operations.

        Raises:
            CommTimeoutError, PeerError, TruncationError, CollectiveMismatchError,
                CollectiveError, CommError: as :meth:`Waitall`.
        """
        Request.Waitall(requests, statuses, timeout=timeout)
        return [r.post(r.obj) if r.post is not None else None for r in requests]

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """Make progress once; return whether every request has completed (MPI_Testall).

        Args:
            requests: an iterable of Requests (may be empty).
            statuses: a list of Status objects, filled when all are complete, or None.

        Returns:
            bool: True when all are complete.

        Raises:
            PeerError: a link failed while making progress.
            TruncationError, CollectiveMismatchError, CollectiveError, CommError: all are
                complete and one of them failed (the first such error).
        """
        reqs = list(requests)
        if reqs:
            reqs[0].engine.progress()
        if not all(r.done for r in reqs):
            return False
        for r in reqs:
            if r.error is not None:
                raise r.error
        if statuses is not None:
            for r, st in zip(reqs, statuses):
                r._status(st)
        return True

    @staticmethod
    def Waitany(requests, status=None, *, timeout: float | None = None) -> int:
        """Wait until one of ``requests`` completes; return its index (MPI_Waitany).

        Args:
            requests: an iterable of Requests.
            status: a Status to fill for the completed request, or None.
            timeout: keyword-only; seconds to wait (None: ``PYCOMM_TIMEOUT``).

        Returns:
            int: the index of a completed request (the lowest), or -1 for an empty list.

        Raises:
            CommTimeoutError: not complete within ``timeout`` seconds (None:
                ``PYCOMM_TIMEOUT``); the operation stays pending.
            PeerError: the peer died or its connection dropped.
            TruncationError: a receive's message was larger than its buffer.
            CollectiveMismatchError, CollectiveError: a nonblocking collective failed (see
                :class:`~pycomm.comm.Communicator`).
            CommError: the sender withdrew a large message this receive had matched.
            ThreadLevelError: another thread of this rank is waiting in pycomm.
        """
        reqs = list(requests)
        if not reqs:
            return -1
        engine = reqs[0].engine
        _trace.traced("Waitany", reqs[0].comm, -1, -1, -1, engine.wait_until,
                      lambda: any(r.done for r in reqs), timeout, "Waitany")
        i = next(i for i, r in enumerate(reqs) if r.done)
        reqs[i].Wait(status)
        return i

    def _complete(self) -> None:
        self.done = True
        if self.on_done is not None:
            cb, self.on_done = self.on_done, None
            cb(self)


def sent_request(engine: Any, ctx: int, dest: int, tag: int, nbytes: int) -> Request:
    """The request of an eager send already complete: the transport took the whole frame
    within the ``Isend`` call (:meth:`pycomm.comm.Communicator.Isend`); ``dest`` is the
    world rank, ``nbytes`` the message's size."""
    req = Request(engine, None, ctx, dest, tag)
    req.nbytes = nbytes
    req.expect = -2                 # marks a send
    req.done = True
    return req
