"""One request made of many point-to-point ones: the nonblocking schedules' handle.

A nonblocking neighbourhood collective (MPI-4.1 section 7.7) and a partitioned transfer
(MPI-4.1 chapter 4) post several ``Isend``/``Irecv`` requests; the user gets one
:class:`Joined` request that is complete when every part is, so ``Wait``, ``Test``,
``Waitall``... of :class:`pycomm.MPI.request.Request` work on it unchanged. Its ``done``
is read from the parts (no callback to lose when a part completes on the progress thread
while it is being added), and its ``error`` is the first part's error. A request may be
*open*: parts are still to come (a partitioned send whose partitions are not all marked
ready), and it is not done until it is sealed.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError
from pycomm.p2p import ANY_TAG, PROC_NULL
from pycomm.request import Request as _Inner

__all__ = ["Joined"]


class Joined(_Inner):
    """A request complete when it is sealed and all its ``parts`` are.

    Args:
        engine: the p2p engine whose progress completes the parts.
        parts: the pycomm requests posted so far.
        sealed: False while more parts are to be added (:meth:`add`, :meth:`seal`).
    """

    __slots__ = ("parts", "sealed", "missing")

    def __init__(self, engine, parts=(), sealed: bool = True):
        self.parts, self.sealed, self.missing = list(parts), sealed, None
        super().__init__(engine, None, -1, PROC_NULL, ANY_TAG)

    @property
    def done(self) -> bool:
        """True once sealed and every part is complete (the first part error is kept)."""
        if not self.sealed:
            return False
        for p in self.parts:
            if not p.done:
                return False
        if self.error is None:
            self.error = next((p.error for p in self.parts if p.error is not None), None)
        return True

    @done.setter
    def done(self, value: bool) -> None:
        """Ignored: completion is read from the parts."""

    def add(self, part: _Inner) -> None:
        """Add one more posted request."""
        self.parts.append(part)

    def seal(self) -> None:
        """No more parts: the request completes with the ones it has."""
        self.sealed = True

    def Wait(self, status=None, *, timeout: float | None = None) -> bool:
        """As :meth:`pycomm.request.Request.Wait`.

        Raises:
            ArgumentError: the request is still open (``missing`` says what is not
                posted yet: a partitioned send's partitions not marked ready), so no
                wait could end.
            CommTimeoutError, PeerError, TruncationError: as a point-to-point wait.
        """
        if not self.sealed:
            raise ArgumentError(f"Wait: {self.missing or 'the operation is incomplete'}")
        return super().Wait(status, timeout=timeout)
