"""Matched probes: ``Comm.Mprobe``/``Improbe`` (and ``mprobe``/``improbe``) and
``MPI.Message``.

A matched probe takes the message out of the matching queue so that no other receive can
get it. The Communicator offers no matched probe, so the façade does it with its public
calls: ``Probe`` (or ``Iprobe``) finds the message's source, tag and size, and a receive
posted at once for exactly that source and tag into a private buffer of that size takes
it. That receive gets the probed message and no other: messages between two ranks do not
overtake each other, so the earliest message from that source with that tag is the one
probed (for a single thread; under ``THREAD_SERIALIZED`` no other thread receives in
between). ``Message.Recv`` then copies the bytes into the user's buffer (one extra copy;
a buffer too small is ``ERR_TRUNCATE``).

As in MPI (and mpi4py over MPICH), receiving a message makes it ``MESSAGE_NULL``, a
message of a probe of ``PROC_NULL`` (``MESSAGE_NO_PROC``) included; the predefined
``MESSAGE_NO_PROC`` itself stays as it is. ``Irecv``/``irecv`` return a live request,
complete at once (the bytes are here), whose ``Wait`` fills the status with the message's
source, tag and count (``PROC_NULL``, ``ANY_TAG`` and 0 for ``MESSAGE_NO_PROC``) and
raises ``ERR_TRUNCATE`` when the buffer was too small, as ``MPI_Imrecv`` does.
"""

from __future__ import annotations

import numpy as np

import pycomm as _pycomm
from pycomm.errors import ArgumentError, TruncationError
from pycomm.serial import loads
from pycomm.p2p import ANY_SOURCE, ANY_TAG, PROC_NULL

from .exceptions import mpi_error, translate_methods
from .msgspec import message
from .request import Request, Status, completed

__all__ = ["MESSAGE_NO_PROC", "MESSAGE_NULL", "Message", "matched_probe"]

_NOTHING = np.empty(0, np.uint8)


@translate_methods
class Message:
    """A message taken by a matched probe (mpi4py's ``MPI.Message``); receive it once with
    ``Recv``/``Irecv`` (buffers) or ``recv``/``irecv`` (objects). ``Message()`` is
    ``MESSAGE_NULL``; ``Message(message)`` is another handle of ``message``."""

    __slots__ = ("__weakref__", "_data", "_engine", "_noproc", "_source", "_tag")

    def __init__(self, message: Message | None = None):
        if message is not None and not isinstance(message, Message):
            raise TypeError(f"Message({message!r}): expected an MPI.Message or nothing")
        src = message
        self._data = None if src is None else src._data
        self._source = PROC_NULL if src is None else src._source
        self._tag = ANY_TAG if src is None else src._tag
        self._noproc = False if src is None else src._noproc
        self._engine = None if src is None else src._engine

    def __bool__(self) -> bool:
        return self._data is not None or self._noproc

    def __eq__(self, other) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._data is other._data and self._noproc == other._noproc

    def __hash__(self) -> int:
        return id(self._data)

    def _take(self, status, count: int | None = None) -> tuple[np.ndarray, int, int]:
        """The message's bytes, source and tag (fills ``status``, with ``count`` bytes if
        given); the message becomes ``MESSAGE_NULL`` unless it is the predefined
        ``MESSAGE_NO_PROC``."""
        if not self:
            raise mpi_error(ArgumentError, "ERR_REQUEST",
                            "Message: MESSAGE_NULL cannot be received")
        data = self._data if self._data is not None else _NOTHING
        source, tag = (PROC_NULL, ANY_TAG) if self._noproc else (self._source, self._tag)
        if status is not None:
            status.source, status.tag = source, tag
            status.count = data.nbytes if count is None else count
            status.error, status.cancelled = 0, False
        if self is not MESSAGE_NO_PROC:
            self._data, self._noproc = None, False
        return data, source, tag

    def _done(self, data: np.ndarray, source: int, tag: int, error=None,
              post=None) -> Request:
        """A live request, complete already, reporting ``source``, ``tag``, the count of
        ``data`` and ``error`` on Wait/Test (``post(bytes)``: what ``wait`` returns)."""
        engine = self._engine if self._engine is not None else _pycomm.init()._engine
        return completed(engine, source, tag, data.nbytes, error,
                         None if post is None else data.tobytes(), post)

    def Recv(self, buf, status: Status | None = None) -> None:
        """Receive the message into the message spec ``buf``.

        Args:
            buf: a writable message spec (``[array, count, datatype]``...; ``None`` or an
                empty buffer for ``MESSAGE_NO_PROC``).
            status: filled with the message's source, tag and count, or None.

        Raises:
            MPI.Exception (ERR_REQUEST): the message is MESSAGE_NULL.
            MPI.Exception (ERR_TRUNCATE, a TruncationError): ``buf`` is too small.
        """
        m = message(buf, "Message.Recv", "buf", writable=True)
        if not self:
            self._take(status)                      # raises ERR_REQUEST
        count, error = _copy_into(m, self._data if self._data is not None else _NOTHING,
                                  "Message.Recv")
        self._take(status, count)
        if error is not None:
            raise error

    def Irecv(self, buf) -> Request:
        """Receive the message into ``buf``; a live request that is complete at once (the
        bytes are here). Its Wait fills the status and raises ERR_TRUNCATE if ``buf`` was
        too small (what fits is written), as ``MPI_Imrecv`` does.

        Args:
            buf: a writable message spec, as for :meth:`Recv`.

        Returns:
            Request: not null; complete.

        Raises:
            MPI.Exception (ERR_REQUEST): the message is MESSAGE_NULL.
        """
        m = message(buf, "Message.Irecv", "buf", writable=True)
        data, source, tag = self._take(None)
        count, error = _copy_into(m, data, "Message.Irecv")
        return self._done(data[:count], source, tag, error)

    def recv(self, status: Status | None = None):
        """Receive the message as a Python object (sent with ``send``/``isend``).

        Returns:
            The object (None for ``MESSAGE_NO_PROC``).

        Raises:
            MPI.Exception (ERR_REQUEST): the message is MESSAGE_NULL.
        """
        data, _, _ = self._take(status)
        return loads(data.tobytes()) if data.nbytes else None

    def irecv(self) -> Request:
        """Object form of Irecv: a live request, complete at once, whose ``wait()`` fills
        the status and returns the object (None for ``MESSAGE_NO_PROC``).

        Raises:
            MPI.Exception (ERR_REQUEST): the message is MESSAGE_NULL.
        """
        data, source, tag = self._take(None)
        return self._done(data, source, tag, post=loads)

    @classmethod
    def Probe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status=None) -> Message:
        """``comm.Mprobe(source, tag, status)`` (mpi4py's defaults: any source, any tag)."""
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status=None) -> Message | None:
        """``comm.Improbe(source, tag, status)`` (mpi4py's defaults: any source, any
        tag)."""
        return comm.Improbe(source, tag, status)


def _copy_into(m, data: np.ndarray, where: str) -> tuple[int, Exception | None]:
    """Copy ``data`` into the message ``m`` (what fits); the bytes copied and the
    truncation error if it did not all fit (MPICH's status then counts the bytes
    received: 8 of a 20-byte message, with ERR_TRUNCATE), else None."""
    target = m.array.view(np.uint8).reshape(-1) if m.array.size else _NOTHING
    n = min(data.nbytes, target.nbytes)
    target[:n] = data[:n]
    m.finish()
    if data.nbytes > target.nbytes:
        return n, mpi_error(TruncationError, "ERR_TRUNCATE", f"{where}: the message "
                            f"has {data.nbytes} bytes, the buffer {target.nbytes}")
    return n, None


def matched_probe(comm, source: int, tag: int, status, block: bool) -> Message | None:
    """Probe (blocking or not) and take the message; None when ``block`` is False and no
    message matches. ``comm`` is the pycomm Communicator."""
    st = Status()
    if block:
        comm.Probe(source, tag, st)
    elif not comm.Iprobe(source, tag, st):
        return None
    out = Message()
    out._engine = comm._engine
    if st.source == PROC_NULL:
        out._noproc = True
    else:
        data = np.empty(st.count, np.uint8)
        comm.Recv(data, st.source, st.tag)
        out._data, out._source, out._tag = data, st.source, st.tag
    if status is not None:
        status.source, status.tag, status.count = st.source, st.tag, st.count
    return out


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._noproc = True
