"""mpi4py's point-to-point buffer methods of ``MPI.Comm`` (``Send``/``Recv`` and their
buffered, synchronous, nonblocking, persistent and combined forms, probes and matched
probes), over a pycomm Communicator's methods of the same names.

Each turns its mpi4py arguments into what :class:`pycomm.comm.Communicator` takes
(message specs become typed contiguous arrays, :mod:`pycomm.MPI.msgspec`; integral-float
ranks and tags become ints). A receive into a non-contiguous datatype is unpacked when the
call (or its request) completes (:func:`fin`). A mixin of :class:`pycomm.MPI.comm.Comm`,
whose ``_inner(call)`` gives the Communicator.
"""

from __future__ import annotations

from pycomm.errors import TruncationError
from pycomm.p2p import ANY_SOURCE, ANY_TAG

from .exceptions import translate_methods
from .membuf import BSEND
from .msg import plain
from .msgspec import Msg, as_int, message
from .prequest import Prequest
from .request import Request, Status, completed

__all__ = ["BufferPointToPoint", "fin", "received"]


def fin(*msgs: Msg):
    """The completion action of a call whose receive side was packed (None if none)."""
    todo = [m for m in msgs if m is not None and m._unpack is not None]
    if not todo:
        return None
    return lambda: [m.finish() for m in todo] and None


def received(m: Msg, receive, *args) -> None:
    """``receive(*args)``, a blocking receive into ``m``, then ``m``'s unpack; after a
    truncation too (TruncationError, raised after it), since the buffer got what fit: a
    vector of 4 INTs receiving 10 holds the first 4 in its blocks, as under MPICH."""
    try:
        receive(*args)
    except TruncationError:
        m.finish()
        raise
    m.finish()


@translate_methods
class BufferPointToPoint:
    """The point-to-point buffer methods of ``MPI.Comm`` (see the module docstring)."""

    def _where(self, call: str) -> str:
        return f"rank {self.rank}: {call}"

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking standard send of the message ``buf`` (any mpi4py message spec)."""
        c = self._c
        if c is not None and type(dest) is int and type(tag) is int:
            array = plain(buf, False)
            if array is not None:               # nothing to parse
                return c.Send(array, dest, tag)
        c = self._inner("Send")
        m = message(buf, f"rank {c.rank}: Send", "buf", writable=False)
        c.Send(m.array, as_int(dest, "dest", "Send"), as_int(tag, "tag", "Send"))

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking synchronous send: returns once ``dest`` has started the matching
        receive (rendezvous at every size)."""
        c = self._inner("Ssend")
        m = message(buf, f"rank {c.rank}: Ssend", "buf", writable=False)
        c.Ssend(m.array, as_int(dest, "dest", "Ssend"), as_int(tag, "tag", "Ssend"))

    Rsend = Send

    def Bsend(self, buf, dest: int, tag: int = 0) -> None:
        """Buffered send: returns at once; a private copy of the data travels."""
        self.Ibsend(buf, dest, tag)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> None:
        """Blocking receive into the message ``buf``; fills ``status``."""
        c = self._c
        if c is not None and type(source) is int and type(tag) is int:
            array = plain(buf, True)
            if array is not None:               # nothing to parse, nothing to unpack
                return c.Recv(array, source, tag, status)
        c = self._inner("Recv")
        m = message(buf, f"rank {c.rank}: Recv", "buf", writable=True)
        received(m, c.Recv, m.array, as_int(source, "source", "Recv"),
                 as_int(tag, "tag", "Recv"), status)

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a standard send; ``buf`` must stay untouched until the request completes."""
        c = self._c
        if c is not None and type(dest) is int and type(tag) is int:
            array = plain(buf, False)
            if array is not None:               # nothing to parse
                return Request._wrap(c.Isend(array, dest, tag))
        c = self._inner("Isend")
        m = message(buf, f"rank {c.rank}: Isend", "buf", writable=False)
        return Request._wrap(c.Isend(m.array, as_int(dest, "dest", "Isend"),
                                     as_int(tag, "tag", "Isend")))

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send: the request completes once ``dest`` has started the
        matching receive."""
        c = self._inner("Issend")
        m = message(buf, f"rank {c.rank}: Issend", "buf", writable=False)
        return Request._wrap(c.Issend(m.array, as_int(dest, "dest", "Issend"),
                                      as_int(tag, "tag", "Issend")))

    Irsend = Isend

    def Ibsend(self, buf, dest: int, tag: int = 0) -> Request:
        """Buffered nonblocking send of a private copy: a live request, complete at once
        (``buf`` is free again), to ``PROC_NULL`` too, as MPICH's."""
        c = self._inner("Ibsend")
        m = message(buf, f"rank {c.rank}: Ibsend", "buf", writable=False)
        inner = c.Isend(m.array.copy(), as_int(dest, "dest", "Ibsend"),
                        as_int(tag, "tag", "Ibsend"))
        BSEND.add(inner)
        return completed(c._engine)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive into ``buf``; valid after the request completes."""
        c = self._c
        if c is not None and type(source) is int and type(tag) is int:
            array = plain(buf, True)
            if array is not None:               # nothing to parse, nothing to unpack
                return Request._wrap(c.Irecv(array, source, tag))
        c = self._inner("Irecv")
        m = message(buf, f"rank {c.rank}: Irecv", "buf", writable=True)
        return Request._wrap(c.Irecv(m.array, as_int(source, "source", "Irecv"),
                                     as_int(tag, "tag", "Irecv")), fin(m))

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving into ``recvbuf`` from ``source``."""
        c = self._c
        if c is not None and type(dest) is int and type(sendtag) is int and \
                type(source) is int and type(recvtag) is int:
            s, r = plain(sendbuf, False), plain(recvbuf, True)
            if s is not None and r is not None:     # nothing to parse, nothing to unpack
                return c.Sendrecv(s, dest, sendtag, r, source, recvtag, status)
        c = self._inner("Sendrecv")
        w = f"rank {c.rank}: Sendrecv"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True)
        received(r, c.Sendrecv, s.array, as_int(dest, "dest", w),
                 as_int(sendtag, "sendtag", w), r.array, as_int(source, "source", w),
                 as_int(recvtag, "recvtag", w), status)

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking :meth:`Sendrecv`: one request completing both halves."""
        c = self._inner("Isendrecv")
        w = f"rank {c.rank}: Isendrecv"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True)
        return self._pair(c, w, s.array, dest, sendtag, r, source, recvtag)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0,
                          source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking :meth:`Sendrecv_replace` (the outgoing data is copied first)."""
        c = self._inner("Isendrecv_replace")
        w = f"rank {c.rank}: Isendrecv_replace"
        r = message(buf, w, "buf", writable=True)
        return self._pair(c, w, r.array.copy(), dest, sendtag, r, source, recvtag)

    def _pair(self, c, w, out, dest, sendtag, r, source, recvtag) -> Request:
        """Post a receive and a send; the request completes when the receive has and then
        waits for the send (its receiver posted it already, so that wait is short)."""
        rr = c.Irecv(r.array, as_int(source, "source", w), as_int(recvtag, "recvtag", w))
        sr = c.Isend(out, as_int(dest, "dest", w), as_int(sendtag, "sendtag", w))

        def finish() -> None:
            sr.Wait()
            r.finish()
        return Request._wrap(rr, finish)

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0,
                         source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                         status: Status | None = None) -> None:
        """Send ``buf`` and receive into it (the outgoing data is copied first)."""
        c = self._inner("Sendrecv_replace")
        w = f"rank {c.rank}: Sendrecv_replace"
        r = message(buf, w, "buf", writable=True)
        received(r, c.Sendrecv, r.array.copy(), as_int(dest, "dest", w),
                 as_int(sendtag, "sendtag", w), r.array, as_int(source, "source", w),
                 as_int(recvtag, "recvtag", w), status)

    def Send_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each ``Start()`` sends ``buf``'s current contents."""
        return self._persistent("Send_init", self.Isend, buf, dest, tag)

    def Ssend_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent synchronous send: each ``Start()`` is an :meth:`Issend`."""
        return self._persistent("Ssend_init", self.Issend, buf, dest, tag)

    Bsend_init = Send_init
    Rsend_init = Send_init

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """A persistent receive into ``buf``."""
        return self._persistent("Recv_init", self.Irecv, buf, source, tag)

    def _persistent(self, call, post, buf, peer, tag) -> Prequest:
        w = f"rank {self._inner(call).rank}: {call}"
        message(buf, w, "buf", writable=post == self.Irecv)     # checked now, once
        peer, tag = as_int(peer, "peer", w), as_int(tag, "tag", w)

        def start():
            r = post(buf, peer, tag)
            return r._r, r._finish
        return Prequest._persistent(start)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None) -> bool:
        """Block until a matching message is there; fills ``status``. Returns True."""
        return self._inner("Probe").Probe(as_int(source, "source", "Probe"),
                                          as_int(tag, "tag", "Probe"), status)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> bool:
        """Whether a matching message is there (fills ``status`` if so)."""
        return self._inner("Iprobe").Iprobe(as_int(source, "source", "Iprobe"),
                                            as_int(tag, "tag", "Iprobe"), status)

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None):
        """Block until a matching message is there and take it: an ``MPI.Message``
        (``MESSAGE_NO_PROC`` for ``PROC_NULL``). See :mod:`pycomm.MPI.message`."""
        from .message import matched_probe
        return matched_probe(self._inner("Mprobe"), as_int(source, "source", "Mprobe"),
                             as_int(tag, "tag", "Mprobe"), status, True)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None):
        """Take a matching message if one is there: an ``MPI.Message``, else None."""
        from .message import matched_probe
        return matched_probe(self._inner("Improbe"), as_int(source, "source", "Improbe"),
                             as_int(tag, "tag", "Improbe"), status, False)

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Object form of Mprobe (the message's ``recv()`` returns the object)."""
        return self.Mprobe(source, tag, status)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        return self.Improbe(source, tag, status)
