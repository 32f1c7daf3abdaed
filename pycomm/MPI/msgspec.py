"""mpi4py message specifications -> typed contiguous numpy arrays for the Communicator.

Forms accepted (mpi4py 4.x, ``msgbuffer.pxi``), for one buffer::

    buf                          the whole buffer, its own type (numpy dtype, or BYTE)
    [buf, datatype]              the whole buffer read as ``datatype``
    [buf, count]                 ``count`` items of the buffer's own type
    [buf, count, datatype]       ``count`` items of ``datatype`` from byte 0
    [buf, (count, displ), datatype]  /  [buf, count, displ, datatype]
                                 ``count`` items starting ``displ`` extents in
    None / [None, ...]           an empty message (a rank that passes nothing)

and for the vector collectives::

    [buf, counts]  [buf, counts, displs]  [buf, (counts, displs)]  [buf, counts, datatype]
    [buf, (counts, displs), datatype]  [buf, counts, displs, datatype]

``buf`` is anything with the buffer protocol (numpy arrays of any shape, 0-d included,
bytes, bytearray, memoryview, array.array, mmap), an ``__array_interface__`` object or a
CPU ``__dlpack__`` tensor; ``datatype`` a :class:`~pycomm.MPI.datatypes.Datatype`, a
typecode string or a numpy dtype. Counts, displacements, ranks and tags may be integral
floats (``1.0``), as mpi4py 3.x programs pass; a non-integral one is a TypeError.

A spec becomes a :class:`Msg`: ``array``, a 1-D C-contiguous numpy array in the type's
wire dtype that the Communicator moves, and ``finish()``, which after a receive copies a
packed array back into the user's buffer (a no-op for the zero-copy views of contiguous
types). Errors name the rank, the call and the argument, and are raised before any byte
moves.
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError, InvalidBufferError

from .datatypes import Datatype
from .exceptions import mpi_error
from .membuf import buffer
from .msg import Msg, plain, plain_vector, strided
from .predefined import from_numpy, to_datatype
from .regions import bottom, typed as _typed
from .regions import buf_error as _buf_error

__all__ = ["BOTTOM", "Msg", "as_int", "bottom", "message", "vector_message"]


class NotABufferError(InvalidBufferError, TypeError):
    """An object that is no buffer at all where a buffer is expected: a TypeError too,
    as mpi4py raises for it."""


def _arg_error(message: str):
    return mpi_error(ArgumentError, "ERR_COUNT" if "count" in message else "ERR_ARG",
                     message)


class _Bottom:
    """``MPI.BOTTOM``: the address 0; with a datatype built from absolute addresses
    (``MPI.Get_address``) it names that memory (see :func:`bottom`), else an empty buffer."""

    def __repr__(self) -> str:
        return "MPI.BOTTOM"

    def __index__(self) -> int:
        """0: ``int(MPI.BOTTOM)`` and ``MPI.Aint_add(MPI.BOTTOM, d)`` as in mpi4py."""
        return 0

    __int__ = __index__

    def __eq__(self, other) -> bool:
        if isinstance(other, _Bottom):
            return True
        return other == 0 if isinstance(other, (int, np.integer)) else NotImplemented

    def __hash__(self) -> int:
        return 0

    def __reduce__(self) -> str:
        return "BOTTOM"


BOTTOM = _Bottom()
_BYTE_FORMATS = frozenset("Bc")     # bytes-like buffers: MPI.BYTE ("b" is SIGNED_CHAR)
_PEP3118_COMPLEX = {"Zf": "F", "Zd": "D", "Zg": "G"}


def as_int(value, arg: str, where: str) -> int:
    """``value`` as an int; integral floats are accepted (mpi4py 3.x programs pass them).

    Raises:
        TypeError: not an integer, or a float with a fractional part.
    """
    if type(value) is int:
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        return int(value)                   # a 0-d integer array, as numpy indexes take
    raise TypeError(f"{where}: {arg}={value!r} is not an integer")


def _raw(buf, writable: bool, where: str, arg: str) -> tuple[np.ndarray, np.dtype | None]:
    """The buffer's bytes as a flat uint8 array (no copy) and its own numpy dtype."""
    if isinstance(buf, np.ndarray) and not isinstance(buf, buffer):
        arr = buf
    # (a numpy scalar by its buffer: read-only, as mpi4py takes it; np.asarray would
    # make a writable copy, and a receive into it would be lost)
    elif isinstance(buf, (bytes, bytearray, memoryview, buffer, np.generic)) or \
            hasattr(buf, "__buffer__") \
            or not (hasattr(buf, "__array_interface__") or hasattr(buf, "__dlpack__")):
        try:
            mv = memoryview(buf)
        except TypeError:
            raise mpi_error(NotABufferError, "ERR_BUFFER", f"{where}: {arg} must "
                            "support the buffer protocol (numpy array, bytes, bytearray, "
                            f"memoryview...), got {type(buf).__name__}") from None
        if not mv.contiguous:
            raise _buf_error(f"{where}: {arg} is a non-contiguous memoryview")
        if writable and mv.readonly:
            raise _buf_error(f"{where}: {arg} ({type(buf).__name__}) is read-only "
                                     "but this call writes it")
        own = None if mv.format in _BYTE_FORMATS else _np_format(mv)
        raw = np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv,
                            dtype=np.uint8)
        if not mv.readonly and not raw.flags.writeable:
            raw.flags.writeable = True
        return raw, own
    elif hasattr(buf, "__dlpack__"):
        try:
            arr = np.from_dlpack(buf)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise _buf_error(f"{where}: {arg}: cannot read {type(buf).__name__} "
                                     f"through DLPack ({exc}); only CPU memory can be sent")
    else:
        arr = np.asarray(buf)
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
    elif arr.flags.f_contiguous:
        flat = arr.ravel(order="F")
    else:
        raise _buf_error(f"{where}: {arg} is not contiguous (shape {arr.shape}, "
                                 f"strides {arr.strides}); pass np.ascontiguousarray(...) "
                                 "or describe the layout with a derived datatype")
    if writable and not flat.flags.writeable:
        raise _buf_error(f"{where}: {arg} is read-only but this call writes it")
    return flat.view(np.uint8), arr.dtype


def _np_format(mv: memoryview) -> np.dtype | None:
    """The numpy dtype of a memoryview's items (None when numpy has none), keeping an
    explicit byte order ('<', '>', '!') so that a foreign one is caught."""
    fmt = mv.format
    code = fmt.lstrip("@=<>!")
    try:
        # PEP 3118 writes complex items "Zf", "Zd", "Zg" (a numpy complex scalar's buffer);
        # numpy's own codes for them are "F", "D", "G"
        dt = np.dtype(_PEP3118_COMPLEX.get(code, code))
    except TypeError:
        return None
    if fmt[:1] in ("<", ">", "!") and dt.itemsize == mv.itemsize:
        dt = dt.newbyteorder(">" if fmt[0] == "!" else fmt[0])
    return dt


def _datatype(own: np.dtype | None, given, where: str) -> Datatype:
    if given is None:
        if own is not None and not own.isnative:
            # the buffer's own type decides the datatype, and MPI types are native
            raise BufferError(f"{where}: the buffer's items are of non-native byte order "
                              f"({own.str}); name a datatype ([buf, MPI.INT]) to send "
                              "its bytes as they are, or convert it with astype")
        return from_numpy(own) if own is not None else from_numpy(np.dtype(np.uint8))
    dt = to_datatype(given, where)
    # pycomm.ops' packed pair dtypes read as themselves under an MPI pair type: the pair
    # fields decide, so both layouts work with MAXLOC/MINLOC.
    if own is not None and own.names is not None and dt._predefined and \
            dt._dtypes and dt._dtypes[0].names is not None and own != dt._dtypes[0] and \
            [own.fields[n][0] for n in own.names] == \
            [dt._dtypes[0].fields[n][0] for n in dt._dtypes[0].names]:
        return from_numpy(own)
    return dt


def _is_typeish(x) -> bool:
    return isinstance(x, (Datatype, str, np.dtype, type))


def _split(spec, where: str, arg: str):
    """(buf, count, displ, datatype) of a one-buffer spec (None where not given)."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    n = len(spec)
    if n == 2:
        if _is_typeish(spec[1]) or spec[1] is None:
            return spec[0], None, None, spec[1]
        if isinstance(spec[1], (tuple, list)):
            return spec[0], spec[1][0], spec[1][1], None
        return spec[0], spec[1], None, None
    if n == 3:
        if isinstance(spec[1], (tuple, list)):
            if len(spec[1]) != 2:
                raise _arg_error(f"{where}: {arg}: [buf, (count, displ), datatype] "
                                    f"needs a pair, got {spec[1]!r}")
            return spec[0], spec[1][0], spec[1][1], spec[2]
        return spec[0], spec[1], None, spec[2]
    if n == 4:
        return spec[0], spec[1], spec[2], spec[3]
    raise _arg_error(f"{where}: {arg}: a message is buf, [buf, datatype], [buf, count, "
                        f"datatype] or [buf, count, displ, datatype]; got a {n}-item "
                        f"{type(spec).__name__}")


def message(spec, where: str, arg: str, *, writable: bool, blocks: int = 1) -> Msg:
    """Turn a one-buffer message spec into a :class:`Msg` (see the module docstring).

    Args:
        spec: the spec as the user passed it.
        where: ``"rank R: Call"`` for error messages.
        arg: the argument's name (``"buf"``, ``"sendbuf"``, ``"recvbuf"``).
        writable: the call writes the buffer (receive side).
        blocks: the buffer holds one block per rank (Gather's recvbuf, Scatter's sendbuf,
            Allgather's recvbuf, Alltoall's both): a count in the spec is per block, as
            MPI's sendcount/recvcount.

    Raises:
        InvalidBufferError: not a buffer, read-only when written, non-contiguous, too
            small for ``count`` items at ``displ``, or not a whole number of items.
        TypeError: a non-integral count/displacement or something that is not a datatype.
    """
    array = plain(spec, writable)
    if array is not None:
        return Msg(array)                       # the common case: zero-copy, no parsing
    if type(spec) in (list, tuple) and len(spec) == 3:
        fast = strided(spec, writable, blocks, where)
        if fast is not None:
            return fast
    buf, count, displ, given = _split(spec, where, arg)
    if buf is None or buf is BOTTOM:
        dt = to_datatype(given, where) if given is not None else from_numpy(np.dtype("u1"))
        c = as_int(count, "count", where) if count is not None else 0
        if c != 0 and buf is BOTTOM and given is not None:  # absolute addresses
            if not dt._committed:
                raise _arg_error(f"{where}: {arg}: derived datatype {dt!r} was not "
                                 "committed (call .Commit() first)")
            d = as_int(displ, "displ", where) if displ is not None else 0
            return bottom(dt, c * blocks, d * dt.extent, where, arg)
        if c != 0:
            raise _buf_error(f"{where}: {arg} is None with count {c}")
        return Msg(np.empty(0, dtype=dt.wire_dtype()))
    raw, own = _raw(buf, writable, where, arg)
    dt = _datatype(own, given, where)
    if not dt._committed:
        raise _arg_error(f"{where}: {arg}: derived datatype {dt!r} was not committed "
                            "(call .Commit() first)")
    extent = dt.extent
    d = as_int(displ, "displ", where) if displ is not None else 0
    if d < 0:
        raise _arg_error(f"{where}: {arg}: displacement {d} is negative")
    if d > 0 and (extent <= 0 or d * extent > raw.size):
        raise _buf_error(f"{where}: {arg}: displacement {d} x extent {extent} is beyond "
                         f"the buffer of {raw.size} bytes")
    if count is None:
        if extent <= 0:
            if raw.size:
                raise _arg_error(f"{where}: {arg}: a datatype of extent {extent} cannot "
                                 "measure the buffer; give a count")
            count_ = 0
        else:
            avail = raw.size - d * extent
            if avail % extent:
                raise _buf_error(f"{where}: {arg}: buffer of {raw.size} bytes is "
                                         f"not a whole number of {dt.Get_name() or 'datatype'}"
                                         f" items (extent {extent} bytes)")
            count_ = max(avail // extent, 0)
    else:
        count_ = as_int(count, "count", where)
        if count_ < 0:
            raise _arg_error(f"{where}: {arg}: count={count_} is negative")
        count_ *= blocks
    return _typed(raw, dt, count_, d * extent, where, arg)


def vector_message(spec, size: int, where: str, arg: str, *, writable: bool):
    """Turn a vector spec into ``(Msg, counts, displs)``, in wire-dtype elements.

    ``counts``/``displs`` in the spec count items of the datatype (displacements in
    extents); ``None`` counts split the buffer evenly, ``None`` displs are the running sum
    of the counts. A non-contiguous datatype packs each rank's block one after the other.

    Raises:
        InvalidBufferError / ArgumentError / TypeError as :func:`message`, and when
        ``counts`` or ``displs`` do not hold ``size`` non-negative integers.
    """
    if spec is None:
        return Msg(np.empty(0, np.uint8)), [0] * size, [0] * size
    fast = plain_vector(spec, size, writable)
    if fast is not None:
        return fast
    if not isinstance(spec, (list, tuple)):
        spec = [spec, None]                 # a bare buffer: split evenly
    if len(spec) < 2:
        raise _arg_error(f"{where}: {arg} must be [buf, counts], [buf, counts, displs],"
                         " [buf, (counts, displs), datatype] or [buf, counts, displs, "
                         "datatype]")
    buf, rest = spec[0], list(spec[1:])
    counts = displs = given = None
    if isinstance(rest[0], tuple) and len(rest[0]) == 2 and len(rest) <= 2:
        (counts, displs), rest = rest[0], rest[1:]  # mpi4py: a 2-tuple is (counts, displs)
    elif len(rest) == 1 and _is_typeish(rest[0]):
        given, rest = rest[0], []
    else:
        counts = rest.pop(0)
        if rest and not (_is_typeish(rest[0]) or (rest[0] is None and len(rest) == 1)):
            displs = rest.pop(0)
        elif rest and rest[0] is None and len(rest) == 2:
            rest.pop(0)
    if rest:
        given = rest.pop(0)
    if rest:
        raise _arg_error(f"{where}: {arg}: too many items in the vector message spec")
    if buf is None or buf is BOTTOM:
        raw, own = np.empty(0, np.uint8), None
    else:
        raw, own = _raw(buf, writable, where, arg)
    dt = _datatype(own, given, where)
    if not dt._committed:
        raise _arg_error(f"{where}: {arg}: derived datatype was not committed")
    extent = dt.extent
    if counts is None:
        if raw.size and (extent <= 0 or raw.size % extent or (raw.size // extent) % size):
            raise _buf_error(f"{where}: {arg}: buffer of {raw.size} bytes does not split "
                             f"into {size} equal blocks of items of extent {extent}; "
                             "give counts")
        per = raw.size // extent // size if extent > 0 else 0
        counts = [per] * size
    elif isinstance(counts, (int, float, np.integer)) or \
            (isinstance(counts, np.ndarray) and counts.ndim == 0):
        counts = [as_int(counts, "counts", where)] * size
    counts = _list(counts, size, "counts", where, arg)
    if isinstance(displs, (int, float, np.integer)) or \
            (isinstance(displs, np.ndarray) and displs.ndim == 0):  # block i at i * displs
        step = as_int(displs, "displs", where)
        displs = [i * step for i in range(size)]
    if displs is None:
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    else:
        displs = _list(displs, size, "displs", where, arg)
    n = dt.elements()
    if dt._contig and buf is not BOTTOM:
        whole = raw[:raw.size - raw.size % max(dt._dtypes[0].itemsize, 1)].view(
            dt.wire_dtype())
        for r, (c, d) in enumerate(zip(counts, displs)):
            if c and (d + c) * n > whole.size:
                raise _buf_error(f"{where}: {arg}: block {r} ({c} items at "
                                         f"displacement {d}) overruns the buffer of "
                                         f"{raw.size} bytes")
        return Msg(whole, None, n), [c * n for c in counts], [d * n for d in displs]
    if buf is BOTTOM:       # absolute addresses: each block maps the memory it names
        blocks = [bottom(dt, c, d * extent, where, f"{arg} block {r}")
                  for r, (c, d) in enumerate(zip(counts, displs))]
    else:
        blocks = [_typed(raw, dt, c, d * extent, where, f"{arg} block {r}")
                  for r, (c, d) in enumerate(zip(counts, displs))]
    packed = np.concatenate([b.array for b in blocks]) if blocks else \
        np.empty(0, dt.wire_dtype())
    sizes = [b.array.size for b in blocks]
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()

    def unpack() -> None:
        for b, o, s in zip(blocks, offs, sizes):
            b.array[...] = packed[o:o + s]
            b.finish()
    return Msg(packed, unpack, n, dt.homogeneous), sizes, offs


def _list(values, size: int, name: str, where: str, arg: str) -> list[int]:
    try:
        out = [as_int(v, name, where) for v in values]
    except TypeError:
        raise TypeError(f"{where}: {arg} {name} must be a sequence of integers, got "
                        f"{values!r}") from None
    if len(out) != size or any(v < 0 for v in out):
        raise _arg_error(f"{where}: {arg} {name} must hold {size} non-negative "
                            f"integers (one per rank), got {out}")
    return out


def _packed_region(buf, position, nbytes: int, where: str, writable: bool) -> np.ndarray:
    raw, _ = _raw(buf, writable, where, "packed buffer")
    position = as_int(position, "position", where)
    if position < 0 or position + nbytes > raw.size:
        raise _buf_error(f"{where}: {nbytes} packed bytes at position {position} do not fit "
                         f"in a buffer of {raw.size} bytes")
    return raw[position:position + nbytes]


def whole_items(dt: Datatype, buf, writable: bool, where: str, arg: str) -> list:
    """``[buf, count, dt]``: as many whole items of ``dt`` as ``buf``'s bytes hold (its
    bytes // the type's extent: mpi4py's count for Pack and Unpack; bytes past them are
    not touched)."""
    raw, _ = _raw(buf, writable, where, arg)
    extent = dt.Get_extent()[1]
    return [buf, raw.size // extent if extent > 0 else 0, dt]


def pack(dt: Datatype, inbuf, outbuf, position) -> int:
    """``Datatype.Pack``: the items of ``inbuf`` (its bytes // extent of them), read through
    ``dt``, written contiguously into ``outbuf`` from byte ``position``.

    Returns:
        The byte position after the packed data.

    Raises:
        MPI.Exception (ERR_BUFFER): ``outbuf`` is too small.
    """
    m = message(whole_items(dt, inbuf, False, "Datatype.Pack", "inbuf"), "Datatype.Pack",
                "inbuf", writable=False)
    data = m.array.view(np.uint8)
    _packed_region(outbuf, position, data.size, "Datatype.Pack", True)[:] = data
    return as_int(position, "position", "Datatype.Pack") + data.size


def unpack(dt: Datatype, inbuf, position, outbuf) -> int:
    """``Datatype.Unpack``: fill ``outbuf`` (its bytes // extent items of ``dt``) from the
    packed bytes of ``inbuf`` at byte ``position``; return the position after them."""
    m = message(whole_items(dt, outbuf, True, "Datatype.Unpack", "outbuf"),
                "Datatype.Unpack", "outbuf", writable=True)
    data = m.array.view(np.uint8)
    data[:] = _packed_region(inbuf, position, data.size, "Datatype.Unpack", False)
    m.finish()
    return as_int(position, "position", "Datatype.Unpack") + data.size
