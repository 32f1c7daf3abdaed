"""Where a typed message lies in a buffer: :class:`Region`, and the message made of it.

``count`` items of a datatype at a byte offset of a buffer cover either one contiguous
run of bytes, equal runs at a constant stride (a column, a face of a subarray: one numpy
view) or any set of elements (an index array). :func:`region` finds which and checks the
bounds once; :func:`typed` makes the message the point-to-point and collective calls move
(packed once for a send, unpacked by ``Msg.finish`` after a receive), and
:class:`Region` packs into and unpacks from a byte array the caller owns, in place:
``Alltoallw`` moves each peer's block that way, one copy in and one copy out, where a
packed message costs a copy more on each side. MPICH's datatype engine (Yaksa) likewise
packs each block straight into the outgoing buffer and unpacks from the incoming one.
"""

from __future__ import annotations

import ctypes

import numpy as np

from pycomm.errors import InvalidBufferError

from .datatypes import Datatype
from .exceptions import mpi_error
from .msg import Msg, block_view

__all__ = ["Region", "bottom", "bottom_region", "buf_error", "finish_all", "region",
           "typed"]


def buf_error(message: str):
    return mpi_error(InvalidBufferError, "ERR_BUFFER", message)


class Region:
    """``count`` items of a datatype at a byte offset of a buffer (see :func:`region`).

    Attributes:
        nbytes: bytes of the items' data (the wire message's size).
        flat: the bytes themselves, when they are one contiguous run; else None.
        view: the items as a ``(runs, run length)`` view of equal runs at a constant
            stride; else None.
        src, index: the buffer as wire elements (or bytes) and the indices of the items'
            elements in it, when neither of the above; else None.
    """

    __slots__ = ("flat", "index", "nbytes", "src", "view")

    def __init__(self, nbytes: int, flat=None, view=None, src=None, index=None):
        self.nbytes, self.flat, self.view, self.src, self.index = nbytes, flat, view, src, index

    def pack_into(self, out: np.ndarray) -> None:
        """Copy the items' data into ``out`` (``nbytes`` uint8), in typemap order."""
        if self.flat is not None:
            out[...] = self.flat
        elif self.view is not None:
            out.view(self.view.dtype).reshape(self.view.shape)[...] = self.view
        elif self.index is not None:
            np.take(self.src, self.index, out=out.view(self.src.dtype))

    def outgoing(self) -> np.ndarray:
        """The items' data as bytes to send: the buffer's own where they are one run,
        else packed now."""
        if self.flat is not None:
            return self.flat
        out = np.empty(self.nbytes, np.uint8)
        self.pack_into(out)
        return out

    def incoming(self) -> tuple:
        """``(bytes, finish)``: where to receive the items' data, and what to call once
        it is there (None: nothing, the bytes are the buffer's own). The bytes start as
        the items' current contents, so that a shorter message (a receive may take one)
        leaves the rest of them as they were."""
        if self.flat is not None:
            return self.flat, None
        data = self.outgoing()
        return data, lambda: self.unpack_from(data)

    def layout(self, raw: np.ndarray) -> tuple:
        """Where these items lie relative to ``raw``, the buffer they were found in, as a
        tuple that holds no reference to it: :meth:`at` finds them again in another
        buffer of ``raw``'s size (so within its bounds)."""
        if self.flat is not None:
            return self.nbytes, _address(self.flat) - _address(raw)
        if self.view is not None:
            v = self.view
            return self.nbytes, _address(v) - _address(raw), v.shape, v.strides, v.dtype
        return self.nbytes, None, self.src.dtype, self.index

    @classmethod
    def at(cls, raw: np.ndarray, layout: tuple) -> Region:
        """The items of ``layout`` (:meth:`layout`) in ``raw``, a buffer of the size of
        the one it was taken from."""
        if len(layout) == 2:
            nbytes, start = layout
            return cls(nbytes, flat=raw[start:start + nbytes])
        if layout[1] is None:
            nbytes, _, dtype, index = layout
            return cls(nbytes, src=raw[:raw.size - raw.size % dtype.itemsize].view(dtype),
                       index=index)
        nbytes, start, shape, strides, dtype = layout
        return cls(nbytes, view=np.ndarray(shape, dtype, raw, start, strides))

    def unpack_from(self, data: np.ndarray) -> None:
        """Copy ``data`` (``nbytes`` uint8, in typemap order) into the items' places."""
        if self.flat is not None:
            self.flat[...] = data
        elif self.view is not None:
            self.view[...] = data.view(self.view.dtype).reshape(self.view.shape)
        elif self.index is not None:
            self.src[self.index] = data.view(self.src.dtype)


def finish_all(incoming: list) -> None:
    """Unpack what arrived for each ``(bytes, finish)`` of :meth:`Region.incoming`."""
    for _, finish in incoming:
        if finish is not None:
            finish()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def region(raw: np.ndarray, dt: Datatype, count: int, start: int, where: str,
           arg: str) -> Region:
    """Where ``count`` items of ``dt`` at byte ``start`` of ``raw`` (uint8) lie.

    Raises:
        InvalidBufferError: the items reach outside ``raw``.
    """
    if count == 0 or dt._nitems == 0:
        return Region(0, flat=raw[:0])
    if dt._contig:
        end = start + count * dt.extent
        if start < 0 or end > raw.size:
            raise buf_error(f"{where}: {arg}: {count} x {dt.Get_name() or 'items'} at byte "
                            f"{start} need {end} bytes; the buffer has {raw.size}")
        return Region(end - start, flat=raw[start:end])
    index, by_element, lo, hi, blocks = dt.gather_index(count, start)
    isz = dt._dtypes[0].itemsize if by_element else 1
    if lo < 0 or hi * isz > raw.size:
        raise buf_error(f"{where}: {arg}: {count} item(s) of the datatype at byte {start} "
                        f"reach bytes {lo * isz}..{hi * isz - 1}; the buffer has {raw.size}")
    src = raw[:raw.size - raw.size % isz].view(dt.wire_dtype() if by_element else np.uint8)
    if blocks is not None:                  # equal runs at a constant stride: a view
        view = block_view(src, *blocks)
        return Region(view.size * isz, view=view)
    return Region(index.size * isz, src=src, index=index)


def typed(raw: np.ndarray, dt: Datatype, count: int, start: int, where: str,
          arg: str) -> Msg:
    """``count`` items of ``dt`` at byte ``start`` of ``raw`` as a wire-dtype message:
    a view where they are contiguous, else packed now and unpacked by ``finish``."""
    wire, per, ok = dt.wire_dtype(), dt.elements(), dt.homogeneous
    reg = region(raw, dt, count, start, where, arg)
    if reg.flat is not None:
        return Msg(reg.flat.view(wire), None, per, ok,
                   dt if dt.is_predefined and reg.nbytes else None)
    if reg.view is not None:
        view = reg.view
        packed = np.ascontiguousarray(view).reshape(-1)

        def unpack() -> None:
            if not np.may_share_memory(view, packed):   # a copy was packed
                view[...] = packed.reshape(view.shape)
    else:
        src, index = reg.src, reg.index
        packed = src[index]

        def unpack() -> None:
            src[index] = packed
    # (the closures above copy ``packed`` in bytes when not by element: a view of it in
    # the wire dtype, not a rebinding, is what travels)
    return Msg(packed.view(wire), unpack, per, ok)


def _bottom_raw(dt: Datatype, count: int, start: int, where: str, arg: str):
    """``(raw, start)``: the memory ``count`` items of ``dt`` at address ``start`` cover,
    and the items' offset in it."""
    if count == 0 or dt._nitems == 0:
        return np.empty(0, np.uint8), 0
    tlb, text = dt.Get_true_extent()
    lo = start + tlb
    n = (count - 1) * dt.extent + text if dt.extent >= 0 else text
    if lo <= 0 or n <= 0:
        raise buf_error(f"{where}: {arg}: MPI.BOTTOM with a datatype whose items start at "
                        f"address {lo}: build it from MPI.Get_address of the arrays")
    return np.frombuffer((ctypes.c_ubyte * n).from_address(lo), dtype=np.uint8), start - lo


def bottom(dt: Datatype, count: int, start: int, where: str, arg: str) -> Msg:
    """``count`` items of ``dt`` at byte ``start`` from ``MPI.BOTTOM``: the datatype's
    displacements are absolute addresses (``MPI.Get_address``), and the memory they cover
    is read or written in place, as in MPI. The arrays must stay alive meanwhile; a wrong
    address is the caller's, as in C.

    Raises:
        InvalidBufferError: the typemap reaches below address 1.
    """
    raw, at = _bottom_raw(dt, count, start, where, arg)
    return typed(raw, dt, count if raw.size else 0, at, where, arg)


def bottom_region(dt: Datatype, count: int, start: int, where: str, arg: str) -> Region:
    """:func:`bottom`'s items as a :class:`Region`."""
    raw, at = _bottom_raw(dt, count, start, where, arg)
    return region(raw, dt, count if raw.size else 0, at, where, arg)
