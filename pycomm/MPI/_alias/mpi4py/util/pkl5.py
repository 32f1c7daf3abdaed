"""``mpi4py.util.pkl5`` for pycomm: object communication with pickle protocol 5.

An object is pickled with ``MPI.pickle.dumps_oob``: a pickle stream plus the object's
large buffers (NumPy arrays, bytearrays, ``PickleBuffer``), which travel out of band as
separate byte messages without being copied into the stream. A message on the wire is a
header (``int64`` lengths: the stream's, then each buffer's) followed by one message per
part, all with the same source, destination and tag; the receiver probes the header,
allocates the parts and receives them in order. A part over the largest count of one
message is sent as one element of a contiguous type, so objects over 2 GiB go through.

The classes wrap a communicator as mpi4py's do: ``pkl5.Intracomm(MPI.COMM_WORLD)``
gives ``send``/``bsend``/``ssend``/``isend``/``ibsend``/``issend``/``recv``/
``sendrecv``/``mprobe``/``improbe`` and the object collectives ``bcast``/``gather``/
``scatter``/``allgather``/``alltoall``; the collectives except ``bcast`` run as
point-to-point messages on a duplicate of the communicator made on first use (a
collective call, as in mpi4py) with a tag that advances per call. ``irecv`` is not
supported (as in mpi4py); ``mprobe``/``improbe`` give a :class:`Message` whose
``recv``/``irecv`` complete the receive, and :class:`Request` groups the requests of
one object's parts.
"""

from __future__ import annotations

import struct as _struct
import threading as _threading
import weakref as _weakref

from .. import MPI
from ..MPI import ANY_SOURCE, ANY_TAG, PROC_NULL, ROOT, Pickle, Status, _comm_lock
# Pickle, _BigMPI and _bigmpi: mpi4py's names, which its own tests use through this module
from ._pkl5parts import (_alloc, _BigMPI, _bigmpi, _complete, _complete_all, _dumps, _HEADER,
                          _header, _HEADER_ITEM, _loads, _mrecv, _mrecv_parts, _plain_recv,
                          _recv, _recv_parts, _send, _send_parts, _unpack, pickle)

__all__ = ["Comm", "Intercomm", "Intracomm", "Message", "Request", "pickle"]



# -- point to point ---------------------------------------------------------------------


def _isend(comm, isend, obj, dest, tag):
    requests = []
    _send(comm, lambda c, spec, d, t: requests.append(isend(c, spec, d, t)),
          obj, dest, tag)
    return Request(requests)


# -- matched probe ----------------------------------------------------------------------

def _mprobe(comm, mprobe, source, tag, status):
    if source == PROC_NULL:
        return Message([MPI.Comm.Mprobe(comm, source, tag, status)])
    if status is None:
        status = Status()
    with _comm_lock(comm, "recv"):
        first = mprobe(comm, source, tag, status)
        if first is None:
            return None
        messages = [first]
        source, tag = status.Get_source(), status.Get_tag()
        nbytes = 0
        for _ in range(status.Get_elements(_HEADER)):   # the parts follow the header
            messages.append(MPI.Comm.Mprobe(comm, source, tag, status))
            nbytes += status.Get_elements(MPI.BYTE)
        status.Set_elements(MPI.BYTE, nbytes)
        return Message(messages)


def _imrecv(message):
    requests = []
    data, bufs = _mrecv_parts(
        message, lambda msg, spec: requests.append(MPI.Message.Irecv(msg, spec)))
    request = Request(requests)
    request._parts = (data, bufs)                   # unpickled when the request completes
    return request


# -- requests ---------------------------------------------------------------------------


# -- collectives ------------------------------------------------------------------------

_CONTEXTS: _weakref.WeakKeyDictionary = _weakref.WeakKeyDictionary()
_CONTEXTS_LOCK = _threading.Lock()


class _Context:
    """The duplicate communicator of a communicator's object collectives (and, for an
    inter-communicator, its local group's intra-communicator) and the next tag."""

    def __init__(self, comm):
        self.dup = comm.Dup()
        self.local = None
        self.tag = 0
        self.tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767

    def next_tag(self):
        if self.tag >= self.tag_ub:
            self.tag = 0
        tag, self.tag = self.tag, self.tag + 1
        return tag


def _context(comm):
    key = comm._inner("pkl5")                       # noqa: SLF001  (shared by all wrappers)
    with _comm_lock(comm, "@commctx"):
        with _CONTEXTS_LOCK:
            ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _Context(comm)
            with _CONTEXTS_LOCK:
                _CONTEXTS[key] = ctx
        if comm.Is_inter() and ctx.local is None:
            merged = comm.Merge(comm.Get_size() > comm.Get_remote_size())
            try:
                ctx.local = merged.Create(comm.Get_group())
            finally:
                merged.Free()
        return ctx


def _intra_context(comm):
    ctx = _context(comm)
    return ctx.dup, ctx.next_tag()


def _inter_context(comm):
    ctx = _context(comm)
    return ctx.dup, ctx.next_tag(), ctx.local


def _bad_root(comm):
    comm.Call_errhandler(MPI.ERR_ROOT)
    raise MPI.Exception(MPI.ERR_ROOT)               # pragma: no cover


def _bcast_parts(comm, data, bufs, root):
    """Broadcast the header's length, the header, then the parts from ``root``."""
    if comm.Get_rank() == root:
        header = _header(data, bufs)
        comm.Bcast((bytearray(_struct.pack("q", len(header) // _HEADER_ITEM)), _HEADER),
                   root)
        comm.Bcast((header, _HEADER), root)
    else:
        count = bytearray(_HEADER_ITEM)
        comm.Bcast((count, _HEADER), root)
        header = bytearray(_unpack(count)[0] * _HEADER_ITEM)
        comm.Bcast((header, _HEADER), root)
        lengths = _unpack(header)
        data = _alloc(lengths[0])
        bufs = [_alloc(n) for n in lengths[1:]]
    with _bigmpi as part:
        comm.Bcast(part(data), root)
        for buf in bufs:
            comm.Bcast(part(buf), root)
    return data, bufs


def _bcast(comm, obj, root):
    if not comm.Is_inter():
        data, bufs = _dumps(obj if comm.Get_rank() == root else None)
        with _comm_lock(comm, "bcast"):
            data, bufs = _bcast_parts(comm, data, bufs, root)
        return _loads(data, bufs)
    dup, tag, local = _inter_context(comm)
    if root == PROC_NULL:
        return None
    if root == ROOT:
        data, bufs = _dumps(obj)
        _send_parts(dup, MPI.Comm.Send, data, bufs, 0, tag)
        return None
    if not 0 <= root < comm.Get_remote_size():
        _bad_root(comm)
    if local.Get_rank() == 0:
        data, bufs = _recv_parts(dup, _plain_recv, None, root, tag)
    else:
        data, bufs = _dumps(None)
    with _comm_lock(local, "bcast"):
        data, bufs = _bcast_parts(local, data, bufs, 0)
    return _loads(data, bufs)


class _Exchange:
    """One object collective as point-to-point messages on the context's duplicate."""

    def __init__(self, comm):
        if comm.Is_inter():
            self.comm, self.tag, _ = _inter_context(comm)
            self.size = comm.Get_remote_size()
        else:
            self.comm, self.tag = _intra_context(comm)
            self.size = comm.Get_size()
        self.requests = []

    def send(self, obj, dest):
        data, bufs = _dumps(obj)
        _send_parts(self.comm, self._isend, data, bufs, dest, self.tag)

    def _isend(self, comm, spec, dest, tag):
        self.requests.append(MPI.Comm.Isend(comm, spec, dest, tag))

    def recv(self, source):
        return _loads(*_recv_parts(self.comm, _plain_recv, None, source, self.tag))

    def recv_all(self):
        return [self.recv(source) for source in range(self.size)]

    def finish(self):
        MPI.Request.Waitall(self.requests)


def _roles(comm, root, root_sends):
    """``(sends, receives)`` of this process in a rooted collective; ``root_sends``:
    scatter (the root sends), else gather (the root receives)."""
    if comm.Is_inter():
        if root == PROC_NULL:
            return False, False
        if root == ROOT:
            return root_sends, not root_sends
        if 0 <= root < comm.Get_remote_size():
            return not root_sends, root_sends
        _bad_root(comm)
    if not 0 <= root < comm.Get_size():
        _bad_root(comm)
    at_root = root == comm.Get_rank()
    return (at_root or not root_sends), (at_root or root_sends)


def _gather(comm, obj, root):
    sends, receives = _roles(comm, root, root_sends=False)
    ex = _Exchange(comm)
    if sends:
        ex.send(obj, root)
    objs = ex.recv_all() if receives else None
    ex.finish()
    return objs


def _as_list(objs, size):
    if objs is None:
        objs = [None] * size
    elif not isinstance(objs, list):
        objs = list(objs)
    if len(objs) != size:
        raise ValueError(f"expecting {size} items, got {len(objs)}")
    return objs


def _scatter(comm, objs, root):
    sends, receives = _roles(comm, root, root_sends=True)
    ex = _Exchange(comm)
    if sends:
        for dest, obj in enumerate(_as_list(objs, ex.size)):
            ex.send(obj, dest)
    obj = ex.recv(root) if receives else None
    ex.finish()
    return obj


def _allgather(comm, obj):
    ex = _Exchange(comm)
    data, bufs = _dumps(obj)
    for dest in range(ex.size):
        _send_parts(ex.comm, ex._isend, data, bufs, dest, ex.tag)   # noqa: SLF001
    objs = ex.recv_all()
    ex.finish()
    return objs


def _alltoall(comm, objs):
    ex = _Exchange(comm)
    for dest, obj in enumerate(_as_list(objs, ex.size)):
        ex.send(obj, dest)
    objs = ex.recv_all()
    ex.finish()
    return objs


# -- public classes ---------------------------------------------------------------------

class _Parts(tuple):
    """The handles of one object's parts (``_handle``: their MPI class, ``_null``: the
    null handle); equal to the same handles, or to a handle all of them match."""

    _handle = _null = None

    def __new__(cls, handles=None):
        if handles is None:
            handles = (cls._null,)
        elif isinstance(handles, cls._handle):
            handles = (handles,)
        return super().__new__(cls, handles)

    def __eq__(self, other):
        """Equal to a group of the same handles, or to a handle all of them match."""
        if isinstance(other, type(self)):
            return tuple(self) == tuple(other)
        if isinstance(other, self._handle):
            return all(h == other for h in self)
        return NotImplemented

    def __ne__(self, other):
        """Negation of ``==``."""
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = tuple.__hash__

    def __bool__(self):
        """True while any of the handles is not null."""
        return any(bool(h) for h in self)


class Request(_Parts):
    """The requests of one object's parts, completed together: ``Request(request=None)``
    takes an ``MPI.Request`` or a sequence of them (REQUEST_NULL by default)."""

    _handle, _null = MPI.Request, MPI.REQUEST_NULL

    def __new__(cls, request=None):
        return super().__new__(cls, request)

    def Free(self) -> None:  # noqa: N802
        """Free the requests."""
        for req in self:
            req.Free()

    def free(self) -> None:
        """Free the requests (null ones are left alone)."""
        for req in self:
            req.free()

    def cancel(self) -> None:
        """Cancel the requests."""
        for req in self:
            req.Cancel()

    def get_status(self, status=None) -> bool:
        """Whether all requests are complete, without freeing them."""
        statuses = [status] + [None] * max(len(self) - 1, 0)
        return all(MPI.Request.Get_status(req, sts) for req, sts in zip(self, statuses))

    def test(self, status=None):
        """``(done, obj)``: obj is the received object of a completed ``irecv``."""
        return _complete(self, MPI.Request.Testall, status)

    def wait(self, status=None):
        """Wait for all requests; the received object of an ``irecv``, else None."""
        return _complete(self, MPI.Request.Waitall, status)[1]

    @classmethod
    def get_status_all(cls, requests, statuses=None) -> bool:
        """Whether all of the requests are complete, without freeing them."""
        if statuses is None:
            return all(request.get_status() for request in requests)
        statuses += [Status() for _ in range(len(statuses), len(requests))]
        return all(request.get_status(sts) for request, sts in zip(requests, statuses))

    @classmethod
    def testall(cls, requests, statuses=None):
        """``(done, objs)`` for a list of requests."""
        return _complete_all(requests, MPI.Request.Testall, statuses)

    @classmethod
    def waitall(cls, requests, statuses=None):
        """Wait for all of the requests; the list of received objects."""
        return _complete_all(requests, MPI.Request.Waitall, statuses)[1]


class Message(_Parts):
    """The matched messages of one object's parts (from ``mprobe``/``improbe``):
    ``Message(message=None)`` takes an ``MPI.Message`` or a sequence of them
    (MESSAGE_NULL by default)."""

    _handle, _null = MPI.Message, MPI.MESSAGE_NULL

    def __new__(cls, message=None):
        return super().__new__(cls, message)

    def free(self) -> None:
        """Free the messages (nothing to do for matched messages)."""
        for msg in self:
            msg.free()

    def recv(self, status=None):
        """Receive the matched object (blocking)."""
        return _mrecv(self, status)

    def irecv(self):
        """Start receiving the matched object; a :class:`Request` whose ``wait`` gives
        it."""
        return _imrecv(self)

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match an incoming object (blocking)."""
        return _mprobe(comm, MPI.Comm.Mprobe, source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match an incoming object if there is one, else None."""
        return _mprobe(comm, MPI.Comm.Improbe, source, tag, status)


class Comm(MPI.Comm):
    """A communicator whose object methods use pickle protocol 5 with out-of-band
    buffers."""

    def __new__(cls, comm=None):
        """Wrap ``comm`` (COMM_NULL by default)."""
        return MPI.Comm.__new__(cls, comm)

    def send(self, obj, dest, tag=0):
        """Send an object (standard mode)."""
        _send(self, MPI.Comm.Send, obj, dest, tag)

    def bsend(self, obj, dest, tag=0):
        """Send an object (buffered mode)."""
        _send(self, MPI.Comm.Bsend, obj, dest, tag)

    def ssend(self, obj, dest, tag=0):
        """Send an object (synchronous mode)."""
        MPI.Request.Waitall(list(_isend(self, MPI.Comm.Issend, obj, dest, tag)))

    def isend(self, obj, dest, tag=0):
        """Start sending an object (standard mode); a :class:`Request`."""
        return _isend(self, MPI.Comm.Isend, obj, dest, tag)

    def ibsend(self, obj, dest, tag=0):
        """Start sending an object (buffered mode); a :class:`Request`."""
        return _isend(self, MPI.Comm.Ibsend, obj, dest, tag)

    def issend(self, obj, dest, tag=0):
        """Start sending an object (synchronous mode); a :class:`Request`."""
        return _isend(self, MPI.Comm.Issend, obj, dest, tag)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Receive an object; ``buf`` (optional) holds the pickle stream if large
        enough."""
        return _recv(self, MPI.Comm.Recv, buf, source, tag, status)

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):  # noqa: ARG002
        """Not supported (as in mpi4py): use ``improbe``/``mprobe`` and
        ``Message.irecv``."""
        raise RuntimeError("unsupported")

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None,  # noqa: PLR0913
                 source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        """Send an object and receive one."""
        requests = _isend(self, MPI.Comm.Isend, sendobj, dest, sendtag)
        obj = _recv(self, MPI.Comm.Recv, recvbuf, source, recvtag, status)
        MPI.Request.Waitall(list(requests))
        return obj

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match an incoming object (blocking); a :class:`Message`."""
        return _mprobe(self, MPI.Comm.Mprobe, source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match an incoming object if there is one; a :class:`Message` or None."""
        return _mprobe(self, MPI.Comm.Improbe, source, tag, status)

    def bcast(self, obj, root=0):
        """Broadcast an object from ``root``."""
        return _bcast(self, obj, root)

    def gather(self, sendobj, root=0):
        """Gather objects at ``root`` (a list there, None elsewhere)."""
        return _gather(self, sendobj, root)

    def scatter(self, sendobj, root=0):
        """Scatter a list of objects from ``root``."""
        return _scatter(self, sendobj, root)

    def allgather(self, sendobj):
        """Gather objects at every process."""
        return _allgather(self, sendobj)

    def alltoall(self, sendobj):
        """Send the i-th object to process i; the list of received objects."""
        return _alltoall(self, sendobj)


class Intracomm(Comm, MPI.Intracomm):
    """Intra-communicator with the methods of :class:`Comm`."""


class Intercomm(Comm, MPI.Intercomm):
    """Inter-communicator with the methods of :class:`Comm`."""
