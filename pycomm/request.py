"""Requests: one pending send, receive or collective (mpi4py's ``Request``).

A request is created by the p2p engine (:mod:`pycomm.p2p`) or by a nonblocking
collective (:mod:`pycomm.nbc`) and completed by whoever finishes the operation; waiting
drives the engine's progress.
"""

from __future__ import annotations

from typing import Any

from . import trace as _trace

__all__ = ["Request"]


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
            src = self.source
            if self.comm is not None:
                src = self.comm._from_world.get(src, src)
            status.source, status.tag, status.count = src, self.tag, self.count
            status.cancelled = self.cancelled

    def Wait(self, status=None, *, timeout: float | None = None) -> bool:
        """Block until the operation completes; fill ``status``. Returns True.

        Raises:
            CommTimeoutError, PeerError, TruncationError (see :meth:`Engine.wait`).
        """
        _trace.traced("Wait", self.comm, self.tag, self.nbytes, self.peer, self.engine.wait,
                      self, timeout)
        self._status(status)
        return True

    def Test(self, status=None) -> bool:
        """Make progress once; True (and ``status`` filled) when complete."""
        if not self.done:
            self.engine.progress()
            if not self.done:
                return False
        if self.error is not None:
            raise self.error
        self._status(status)
        return True

    def Cancel(self) -> None:
        """Cancel a receive that has not matched a message yet, or withdraw a large send
        whose payload has not been handed over (no effect otherwise; ``Status.cancelled``
        tells). See :meth:`pycomm.p2p.Engine.cancel`."""
        self.engine.cancel(self)

    def Free(self) -> None:
        """Forget the request (it still completes)."""

    def wait(self, status=None, *, timeout: float | None = None):
        """Object form: wait and return the received object (None for sends)."""
        self.Wait(status, timeout=timeout)
        return self.post(self.obj) if self.post is not None and not self.cancelled else None

    def test(self, status=None):
        """Object form: ``(done, object or None)``."""
        if not self.Test(status):
            return False, None
        return True, (self.post(self.obj) if self.post is not None else None)

    @staticmethod
    def Waitall(requests, statuses=None, *, timeout: float | None = None) -> bool:
        """Wait for every request; fill ``statuses`` (a list) if given. Returns True."""
        reqs = list(requests)
        if reqs:
            _trace.traced("Waitall", reqs[0].comm, -1, sum(max(0, r.nbytes) for r in reqs),
                          -1, reqs[0].engine.wait_all, reqs, timeout)
        if statuses is not None:
            for r, st in zip(reqs, statuses):
                r._status(st)
        return True

    @staticmethod
    def waitall(requests, statuses=None, *, timeout: float | None = None) -> list:
        """Object form of Waitall: the list of received objects (None for sends)."""
        Request.Waitall(requests, statuses, timeout=timeout)
        return [r.post(r.obj) if r.post is not None else None for r in requests]

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """True when every request has completed (progress is made once)."""
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
        """Wait until one request completes; return its index."""
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
