"""The ``external32`` data representation: ``Datatype.Pack_external``,
``Unpack_external`` and ``Pack_external_size`` (MPI-4.1 sections 5.2.5 and 14.5.2).

external32 is MPI's portable byte format: every basic item big-endian, integers two's
complement and floating point IEEE 754, with a size fixed per MPI type whatever the
machine (MPI-4.1 Table 14.2, as MPICH's ``typerep`` table has it): ``LONG`` and
``UNSIGNED_LONG`` are 4 bytes (8 in this process's memory), ``WCHAR`` 2 (a UCS-2 code
unit; 4 in memory), ``LONG_DOUBLE`` 16 (IEEE binary128; the x87 80-bit format in memory),
the others their size here. A value/index pair type (``DOUBLE_INT``...) is its two
members back to back, without the C struct's padding (MPICH 5.0.2 sizes these types 0 or 1
byte: it does not convert them).

How. A datatype's items are first packed in this process's representation (the same
gather as :meth:`Datatype.Pack`), then converted item by item with numpy: one item of the
type is a run-length list of basic dtypes, which becomes a pair of numpy structured dtypes
(native and external, one field per run) so that a whole buffer converts in one
assignment per run. Values outside the external size wrap (a ``LONG`` of 2**40 + 3 packs
as 3, as MPICH's does).
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError

from .exceptions import mpi_error
from .msgspec import _packed_region, as_int, message, whole_items

__all__ = ["EXTERNAL32", "install", "item_dtypes"]

EXTERNAL32 = "external32"
# numpy dtype metadata key naming a basic type whose external32 size differs from its
# size in memory although its numpy dtype is that of another MPI type (LONG is int64,
# as LONG_LONG is, but 4 bytes in external32)
SIZE_KEY = "external32"
_LONG_DOUBLE = np.dtype(np.longdouble)
_QUAD = np.dtype((np.void, 16))             # an IEEE binary128 value, big-endian bytes


def _check_datarep(datarep, where: str) -> None:
    if datarep != EXTERNAL32:
        raise mpi_error(ArgumentError, "ERR_ARG",
                        f"{where}: datarep={datarep!r}; the only data representation for "
                        "packing is 'external32' (MPI-4.1 section 5.2.5)")


def _external(dt: np.dtype) -> np.dtype:
    """The external32 dtype of one basic (or pair) numpy dtype."""
    if dt.fields is not None:               # a value/index pair: members back to back
        names = list(dt.names)
        subs = [_external(dt.fields[n][0]) for n in names]
        if names[0] == "val" and dt.fields["val"][0].kind == "i" and \
                dt.fields["val"][0].itemsize == 8:
            subs[0] = np.dtype(">i4")        # LONG_INT's value is a C long: 4 bytes
        return np.dtype({"names": names, "formats": subs})
    meta = dt.metadata or {}
    if dt.kind in "iu":
        return np.dtype(f">{dt.kind}{meta.get(SIZE_KEY, dt.itemsize)}")
    if dt.kind in "fc" and dt.itemsize in (2, 4, 8, 16) and dt != _LONG_DOUBLE and \
            not (dt.kind == "c" and dt.itemsize == 2 * _LONG_DOUBLE.itemsize):
        return dt.newbyteorder(">")
    if dt == _LONG_DOUBLE:
        return _QUAD
    if dt.kind == "c":                      # complex long double: two binary128 values
        return np.dtype((_QUAD, (2,)))
    if dt.kind == "U":                      # WCHAR: one UCS-2 code unit
        return np.dtype(">u2")
    return dt                               # bool, CHAR (S1), bytes: as they are


def _runs(tmap) -> list[tuple[np.dtype, int]]:
    """``[(dtype, count)]``: one item of the type map as runs of equal basic dtypes."""
    codes = tmap.flatten()[1]
    if not len(codes):
        return []
    cuts = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(codes)]))
    return [(tmap.dtypes[int(codes[s])], int(e - s)) for s, e in zip(starts, ends)]


def item_dtypes(dt) -> tuple[np.dtype, np.dtype]:
    """``(native, external)`` structured dtypes of one packed item of datatype ``dt``: the
    packed bytes of one item in this process's representation (as ``Datatype.Pack``
    writes them) and in external32, one field ``f<i>`` per run of equal basic dtypes."""
    cached = dt._cache.get(EXTERNAL32)
    if cached is None:
        runs = _runs(dt._data)
        names = [f"f{i}" for i in range(len(runs))]
        native = np.dtype({"names": names, "formats": [(t, (n,)) for t, n in runs]})
        external = np.dtype({"names": names,
                             "formats": [(_external(t), (n,)) for t, n in runs]})
        cached = dt._cache[EXTERNAL32] = (native, external)
    return cached


def _to_quad(x: np.ndarray) -> np.ndarray:
    """x87 80-bit long doubles -> big-endian binary128 bytes (same sign, exponent and
    bias; the explicit integer bit dropped, the 63 fraction bits at the top)."""
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(-1, 16)
    mant = raw[:, :8].copy().view("<u8")[:, 0]
    se = raw[:, 8:10].copy().view("<u2")[:, 0]
    frac = mant & np.uint64(0x7FFFFFFFFFFFFFFF)
    out = np.empty((len(raw), 16), np.uint8)
    out[:, 0:2] = se.astype(">u2").view(np.uint8).reshape(-1, 2)
    hi = (frac >> np.uint64(15)).astype(">u8").view(np.uint8).reshape(-1, 8)
    out[:, 2:8] = hi[:, 2:]                 # the top 48 of the 112 fraction bits
    out[:, 8:16] = (frac << np.uint64(49)).astype(">u8").view(np.uint8).reshape(-1, 8)
    return out.reshape(x.shape + (16,))


def _from_quad(q: np.ndarray, shape) -> np.ndarray:
    """Big-endian binary128 bytes -> x87 long doubles (fraction bits past 63 dropped)."""
    raw = np.ascontiguousarray(q).view(np.uint8).reshape(-1, 16)
    se = raw[:, 0:2].copy().view(">u2")[:, 0].astype("<u2")
    hi = np.zeros((len(raw), 8), np.uint8)
    hi[:, 2:] = raw[:, 2:8]
    frac = (hi.view(">u8")[:, 0].astype(np.uint64) << np.uint64(15)) | \
        (raw[:, 8:16].copy().view(">u8")[:, 0].astype(np.uint64) >> np.uint64(49))
    integer_bit = np.where(se & np.uint16(0x7FFF), np.uint64(1 << 63), np.uint64(0))
    out = np.zeros((len(raw), 16), np.uint8)
    out[:, :8] = (frac | integer_bit).astype("<u8").view(np.uint8).reshape(-1, 8)
    out[:, 8:10] = se.view(np.uint8).reshape(-1, 2)
    return out.view(_LONG_DOUBLE).reshape(shape)


def _convert(src: np.ndarray, dst: np.ndarray, to_external: bool) -> None:
    """Assign ``src`` to ``dst`` (one run's field), each in its own representation."""
    if src.dtype.fields is not None:        # pair: member by member
        for name in src.dtype.names:
            _convert(src[name], dst[name], to_external)
    elif (src.dtype if to_external else dst.dtype).kind == "U":
        if to_external:
            dst[...] = src.view("<u4").reshape(dst.shape)   # (a code point past 0xFFFF wraps)
        else:
            dst.view("<u4").reshape(src.shape)[...] = src
    elif (src.dtype if to_external else dst.dtype) in (_LONG_DOUBLE, np.clongdouble):
        if to_external:
            parts = src if src.dtype == _LONG_DOUBLE else \
                np.stack([src.real, src.imag], axis=-1)
            dst.view(np.uint8).reshape(parts.shape + (16,))[...] = _to_quad(parts)
        elif dst.dtype == _LONG_DOUBLE:
            dst[...] = _from_quad(src, dst.shape)
        else:
            pairs = _from_quad(src, dst.shape + (2,))
            dst.real, dst.imag = pairs[..., 0], pairs[..., 1]
    else:
        dst[...] = src                      # numpy's cast: byte order, size (wraps)


def _transfer(dt, datarep, items, packed, position, to_external: bool, where: str) -> int:
    """Convert between ``items`` (whole items of ``dt``: its bytes // extent of them) and
    the external32 bytes of ``packed`` from byte ``position``, in the direction
    ``to_external``; return the position after them."""
    _check_datarep(datarep, where)
    native, external = item_dtypes(dt)
    arg = "outbuf" if not to_external else "inbuf"
    m = message(whole_items(dt, items, not to_external, where, arg), where, arg,
                writable=not to_external)
    data = m.array.view(np.uint8)
    count = data.size // native.itemsize if native.itemsize else 0
    region = _packed_region(packed, position, count * external.itemsize, where,
                            to_external)
    mine = data[:count * native.itemsize].view(native)
    theirs = region.view(external)
    for name in native.names:
        if to_external:
            _convert(mine[name], theirs[name], True)
        else:
            _convert(theirs[name], mine[name], False)
    if not to_external:
        m.finish()
    return as_int(position, "position", where) + region.size


def pack_external(dt, datarep, inbuf, outbuf, position) -> int:
    """``Datatype.Pack_external``: the items of ``inbuf`` (its bytes // extent of them),
    read through ``dt``, written in external32 into ``outbuf`` from byte ``position``.

    Returns:
        The byte position after the packed data.

    Raises:
        MPI.Exception: ERR_ARG (``datarep`` is not ``"external32"``), ERR_BUFFER
            (``outbuf`` is too small).
    """
    return _transfer(dt, datarep, inbuf, outbuf, position, True, "Datatype.Pack_external")


def unpack_external(dt, datarep, inbuf, position, outbuf) -> int:
    """``Datatype.Unpack_external``: fill ``outbuf`` (its bytes // extent items of ``dt``)
    from the external32 bytes of ``inbuf`` at byte ``position``; return the position
    after them.

    Raises:
        MPI.Exception: ERR_ARG (``datarep``), ERR_BUFFER (``inbuf`` holds too few bytes).
    """
    return _transfer(dt, datarep, outbuf, inbuf, position, False,
                     "Datatype.Unpack_external")


def pack_external_size(dt, datarep, count) -> int:
    """``Datatype.Pack_external_size``: bytes that ``count`` items take in external32.

    Raises:
        MPI.Exception (ERR_ARG): ``datarep`` is not ``"external32"``, or ``count`` < 0.
    """
    where = "Datatype.Pack_external_size"
    _check_datarep(datarep, where)
    count = as_int(count, "count", where)
    if count < 0:
        raise mpi_error(ArgumentError, "ERR_COUNT", f"{where}: count={count} is negative")
    return count * item_dtypes(dt)[1].itemsize


def install(cls) -> None:
    """Give ``cls`` (``Datatype``) its external32 methods."""
    def Pack_external(self, datarep, inbuf, outbuf, position) -> int:
        return pack_external(self, datarep, inbuf, outbuf, position)

    def Unpack_external(self, datarep, inbuf, position, outbuf) -> int:
        return unpack_external(self, datarep, inbuf, position, outbuf)

    def Pack_external_size(self, datarep, count) -> int:
        return pack_external_size(self, datarep, count)

    for fn, impl in ((Pack_external, pack_external), (Unpack_external, unpack_external),
                     (Pack_external_size, pack_external_size)):
        fn.__doc__ = impl.__doc__
        setattr(cls, fn.__name__, fn)
