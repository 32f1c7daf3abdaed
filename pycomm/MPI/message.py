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
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError, TruncationError
from pycomm.objects import loads
from pycomm.p2p import ANY_TAG, PROC_NULL

from .exceptions import mpi_error, translate_methods
from .msgspec import message
from .request import Request, Status

__all__ = ["MESSAGE_NO_PROC", "MESSAGE_NULL", "Message", "matched_probe"]


@translate_methods
class Message:
    """A message taken by a matched probe (mpi4py's ``MPI.Message``); receive it once with
    ``Recv``/``Irecv`` (buffers) or ``recv``/``irecv`` (objects). ``Message()`` is
    ``MESSAGE_NULL``."""

    __slots__ = ("_data", "_noproc", "_source", "_tag")

    def __init__(self, message: Message | None = None):
        src = message if isinstance(message, Message) else None
        self._data = None if src is None else src._data
        self._source = PROC_NULL if src is None else src._source
        self._tag = ANY_TAG if src is None else src._tag
        self._noproc = False if src is None else src._noproc

    def __bool__(self) -> bool:
        return self._data is not None or self._noproc

    def __eq__(self, other) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._data is other._data and self._noproc == other._noproc

    def __hash__(self) -> int:
        return id(self._data)

    def _take(self, status) -> np.ndarray:
        if not self:
            raise mpi_error(ArgumentError, "ERR_REQUEST",
                            "Message: MESSAGE_NULL cannot be received")
        data = self._data if self._data is not None else np.empty(0, np.uint8)
        if status is not None:
            status.source, status.tag, status.count = self._source, self._tag, data.nbytes
            status.error, status.cancelled = 0, False
        self._data = None         # received: MESSAGE_NULL (MESSAGE_NO_PROC stays itself)
        return data

    def Recv(self, buf, status: Status | None = None) -> None:
        """Receive the message into the message spec ``buf``.

        Raises:
            MPI.Exception (ERR_TRUNCATE, a TruncationError): ``buf`` is too small.
        """
        m = message(buf, "Message.Recv", "buf", writable=True)
        data = self._take(status)
        target = m.array.view(np.uint8) if m.array.size else np.empty(0, np.uint8)
        if data.nbytes > target.nbytes:
            raise mpi_error(TruncationError, "ERR_TRUNCATE", f"Message.Recv: the message "
                            f"has {data.nbytes} bytes, the buffer {target.nbytes}")
        target[:data.nbytes] = data
        m.finish()

    def Irecv(self, buf) -> Request:
        """Receive into ``buf`` (complete at once: the bytes are here)."""
        self.Recv(buf)
        return Request()

    def recv(self, status: Status | None = None):
        """Receive the message as a Python object (sent with ``send``/``isend``)."""
        data = self._take(status)
        return loads(data.tobytes()) if data.nbytes else None

    def irecv(self):
        """Object form of Irecv; ``wait()`` returns the object."""
        obj = self.recv()
        return _Done(obj)

    @classmethod
    def Probe(cls, comm, source: int, tag: int, status=None) -> Message:
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source: int, tag: int, status=None) -> Message | None:
        return comm.Improbe(source, tag, status)


class _Done(Request):
    """An object receive that already completed: ``wait()``/``test()`` return its object."""

    __slots__ = ("_obj",)

    def __init__(self, obj):
        super().__init__()
        self._obj = obj

    def wait(self, status=None):
        return self._obj

    def test(self, status=None):
        return True, self._obj


def matched_probe(comm, source: int, tag: int, status, block: bool) -> Message | None:
    """Probe (blocking or not) and take the message; None when ``block`` is False and no
    message matches. ``comm`` is the pycomm Communicator."""
    st = Status()
    if block:
        comm.Probe(source, tag, st)
    elif not comm.Iprobe(source, tag, st):
        return None
    out = Message()
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
