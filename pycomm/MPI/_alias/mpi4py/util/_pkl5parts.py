"""The parts of a pkl5 message (:mod:`mpi4py.util.pkl5` for pycomm): an object's pickle
stream and out-of-band buffers, the header of their lengths, their blocking sends and
receives (a part over the largest count of one message as one element of a contiguous
type), and the completion of the requests of one object's parts."""

from __future__ import annotations

import struct as _struct
import sys as _sys

from .. import MPI
from ..MPI import PROC_NULL, Pickle, Status, _comm_lock

pickle = Pickle()


_HEADER = MPI.INT64_T                               # the header's element type


_HEADER_ITEM = _struct.calcsize("q")


_MAX_COUNT = (1 << 63) - 1 if MPI.Get_version() >= (4, 0) else (1 << 31) - 1


def _dumps(obj):
    data, bufs = pickle.dumps_oob(obj)
    return data, list(bufs)


def _loads(data, bufs):
    return pickle.loads_oob(data, bufs)


class _BigMPI:
    """Buffer specs of the parts of one object. A part over ``blocksize`` bytes is sent
    as one element of a contiguous type of its size (made once per size and freed on
    leaving the ``with`` block). ``pkl5._bigmpi`` is the instance in use."""

    blocksize = _MAX_COUNT

    def __init__(self):
        self.cache = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for datatype in self.cache.values():
            datatype.Free()
        self.cache.clear()

    def __call__(self, buf):
        view = memoryview(buf)
        nbytes = view.nbytes
        if nbytes <= self.blocksize:
            return (view, nbytes, MPI.BYTE)
        whole = self.cache.get(nbytes)
        if whole is None:
            whole = self.cache[nbytes] = MPI.BYTE.Create_contiguous(nbytes).Commit()
        return (view, 1, whole)


_bigmpi = _BigMPI()


def _in_use():
    """The :class:`_BigMPI` in use: ``pkl5._bigmpi``, which a program (or mpi4py's own
    tests) may replace."""
    return _sys.modules[__package__ + ".pkl5"]._bigmpi


def _header(data, bufs):
    lengths = [len(memoryview(data).cast("B"))]
    lengths += [memoryview(buf).nbytes for buf in bufs]
    return bytearray(_struct.pack(f"{len(lengths)}q", *lengths))


def _unpack(header):
    return list(_struct.unpack(f"{len(header) // _HEADER_ITEM}q", header))


def _alloc(nbytes):
    return MPI.buffer.allocate(nbytes)


def _send_parts(comm, send, data, bufs, dest, tag):
    """Send the header and the parts with ``send(comm, spec, dest, tag)``."""
    send(comm, (_header(data, bufs), _HEADER), dest, tag)
    with _in_use() as part:
        send(comm, part(data), dest, tag)
        for buf in bufs:
            send(comm, part(buf), dest, tag)


def _send(comm, send, obj, dest, tag):
    if dest == PROC_NULL:
        send(comm, (None, 0, MPI.BYTE), dest, tag)
        return
    data, bufs = _dumps(obj)
    with _comm_lock(comm, "send"):
        _send_parts(comm, send, data, bufs, dest, tag)


def _recv_parts(comm, recv, buf, source, tag, status=None):
    """Probe and receive one object's header and parts; return ``(data, bufs)``."""
    if status is None:
        status = Status()
    MPI.Comm.Probe(comm, source, tag, status)
    source, tag = status.Get_source(), status.Get_tag()
    header = bytearray(status.Get_elements(_HEADER) * _HEADER_ITEM)
    MPI.Comm.Recv(comm, (header, _HEADER), source, tag, status)
    lengths = _unpack(header)
    data = None
    if buf is not None:                             # the caller's buffer, if large enough
        view = memoryview(buf).cast("B")
        if len(view) >= lengths[0]:
            data = view[:lengths[0]]
    if data is None:
        data = _alloc(lengths[0])
    bufs = [_alloc(n) for n in lengths[1:]]
    with _in_use() as part:
        recv(comm, part(data), source, tag)
        for rbuf in bufs:
            recv(comm, part(rbuf), source, tag)
    status.Set_elements(MPI.BYTE, sum(lengths))
    return data, bufs


def _recv(comm, recv, buf, source, tag, status):
    if source == PROC_NULL:
        recv(comm, (None, 0, MPI.BYTE), source, tag, status)
        return None
    with _comm_lock(comm, "recv"):
        data, bufs = _recv_parts(comm, recv, buf, source, tag, status)
    return _loads(data, bufs)


def _plain_recv(comm, spec, source, tag):
    MPI.Comm.Recv(comm, spec, source, tag)


def _mrecv_parts(message, mrecv, status=None):
    """Receive the parts of a matched message with ``mrecv(msg, spec)``."""
    if message[0] == MPI.MESSAGE_NO_PROC:
        MPI.Message.Recv(message[0], (bytearray(0), _HEADER), status)
        mrecv(MPI.MESSAGE_NO_PROC, (None, 0, MPI.BYTE))
        data, bufs = _dumps(None)
        return bytearray(data), bufs
    header = bytearray((len(message) - 1) * _HEADER_ITEM)
    MPI.Message.Recv(message[0], (header, _HEADER), status)
    lengths = _unpack(header)
    data = _alloc(lengths[0])
    bufs = [_alloc(n) for n in lengths[1:]]
    with _in_use() as part:
        for msg, buf in zip(message[1:], [data, *bufs]):
            mrecv(msg, part(buf))
    if status is not None:
        status.Set_elements(MPI.BYTE, sum(lengths))
    return data, bufs


def _mrecv(message, status):
    data, bufs = _mrecv_parts(message, MPI.Message.Recv, status)
    return _loads(data, bufs)


def _load(request):
    """The object a completed :class:`Request` of ``Message.irecv`` received, else None."""
    parts = request.__dict__.pop("_parts", None)
    if parts is None:
        return None
    if request != MPI.REQUEST_NULL:                 # pragma: no cover (not completed)
        request._parts = parts
        return None
    return _loads(*parts)


def _complete(request, test, status):
    done = test(list(request), None if status is None else [status] * len(request))
    return (True, _load(request)) if done else (False, None)


def _complete_all(requests, test, statuses):
    if isinstance(statuses, list):
        statuses.extend(Status() for _ in range(len(requests) - len(statuses)))
    flat = [req for request in requests for req in request]
    flat_statuses = None
    if statuses is not None:
        flat_statuses = [sts for request, sts in zip(requests, statuses)
                         for _ in request]
    if test(flat, flat_statuses):
        return True, [_load(request) for request in requests]
    return False, None
