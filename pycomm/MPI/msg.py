"""A message ready for the communicator (:class:`Msg`), and the specs taken without the
general parse of :mod:`pycomm.MPI.msgspec`: a plain array (:func:`plain`) and the strided
plan, the halo idiom's message (:func:`strided`)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .datatypes import Datatype
from .predefined import from_numpy

__all__ = ["Msg", "block_view", "plain", "plain_vector", "strided"]


class Msg:
    """A message ready for the Communicator: ``array`` plus how to finish a receive."""

    __slots__ = ("_unpack", "array", "datatype", "per", "reducible")

    def __init__(self, array: np.ndarray, unpack=None, per: int = 1,
                 reducible: bool = True, datatype: Datatype | None = None):
        self.array = array
        self._unpack = unpack
        self.per = per                  # wire elements per item of the datatype
        self.reducible = reducible      # False: mixed-type datatype packed to bytes
        # the predefined datatype the spec named (MPI.BYTE, not the UNSIGNED_CHAR a
        # uint8 array would be taken for), handed to mpi4py-style user ops; else None
        self.datatype = datatype

    def finish(self) -> None:
        """Copy a packed receive into the user's buffer (no-op when zero-copy)."""
        if self._unpack is not None:
            self._unpack()


# numpy dtype (no fields) -> whether a C-contiguous array of it is its own message
_PLAIN: dict = {}


def plain(spec, writable: bool):
    """``spec`` as the 1-D array the Communicator moves, when it is the common case: a
    C-contiguous numpy array of a numeric dtype that has a predefined datatype (and
    writable where the call writes it); None for every other spec, which
    :func:`pycomm.MPI.msgspec.message` parses. The façade's small calls take this way
    first: it decides in a few attribute reads what the whole parse would (a spec's parse
    costs as much as an 8-byte collective's own work)."""
    if type(spec) is not np.ndarray:
        return None
    dtype = spec.dtype
    ok = _PLAIN.get(dtype)
    if ok is None:
        if dtype.fields is not None:        # (structured dtypes are not kept: unbounded)
            return None
        dt = from_numpy(dtype)
        ok = _PLAIN[dtype] = bool(dt._contig and dt._dtypes[0] == dtype
                                  and dtype.kind in "biufc")
    flags = spec.flags
    if not ok or not flags.c_contiguous or (writable and not flags.writeable):
        return None
    return spec if spec.ndim == 1 else spec.reshape(-1)


def plain_vector(spec, size: int, writable: bool):
    """``(Msg, counts, displs)`` of a vector spec in the common case, else None (the
    general parse, :func:`pycomm.MPI.msgspec.vector_message`, then takes it and raises
    where the spec is wrong): a plain array (:func:`plain`) with ``(counts, displs)``,
    ``counts, displs`` or either of those and its own predefined datatype, the counts and
    displacements lists or tuples of ``size`` non-negative ints whose blocks lie within
    the array. A small ``Alltoallv``'s general parse costs more than its whole exchange
    through the slots."""
    if type(spec) not in (list, tuple):
        return None
    n, dt = len(spec), None
    if n == 2 or (n == 3 and type(spec[2]) is Datatype):
        cd = spec[1]
        if type(cd) is not tuple or len(cd) != 2:
            return None
        counts, displs = cd
        if n == 3:
            dt = spec[2]
    elif (n == 3 and type(spec[1]) is not tuple) or n == 4:
        # ([buf, (counts, displs), datatype] has a tuple second: mpi4py unpacks any tuple
        # there as that pair, and so does the general parse, which takes it)
        counts, displs = spec[1], spec[2]
        if n == 4:
            dt = spec[3]
            if type(dt) is not Datatype:
                return None
    else:
        return None
    array = plain(spec[0], writable)
    if array is None or type(counts) not in (list, tuple) or \
            type(displs) not in (list, tuple) or len(counts) != size or len(displs) != size:
        return None
    if dt is not None and not (dt._predefined and dt._contig and not dt._freed
                               and dt._dtypes[0] == array.dtype):
        return None
    # A program passes the same counts call after call: the last accepted pair (per
    # direction) is kept with its furthest block end, and an equal pair of ints (one set
    # of their types, built in C) is not walked again.
    last = _VECTORS[writable]
    if last is not None and counts == last[0] and displs == last[1] and \
            array.size >= last[2] and {*map(type, counts), *map(type, displs)} == _INT:
        return Msg(array), last[0], last[1]
    end = 0
    for c, d in zip(counts, displs):
        if type(c) is not int or type(d) is not int or c < 0 or d < 0 or \
                (c and c + d > array.size):
            return None
        if c and c + d > end:
            end = c + d
    counts, displs = list(counts), list(displs)
    _VECTORS[writable] = (counts, displs, end)
    return Msg(array), counts, displs


_INT = {int}
_VECTORS: list = [None, None]   # [writable]: (counts, displs, furthest block end)


_PLAN = "strided"           # key prefix of the plans in a datatype's own cache
_PLANS_MAX = 8              # plans kept per datatype (distinct count/displ pairs)


def strided(spec, writable: bool, blocks: int, where: str) -> Msg | None:
    """The halo idiom's message, or None to take the general way.

    ``[array, (count, displ), vector_type]`` or ``[array, count, vector_type]`` where the
    array is C-contiguous, of the type's own basic dtype, and the type's items are equal
    runs at a constant stride (a column, a face of a 3-D grid, a strided vector): the
    same Msg the general path builds, from a plan kept per (datatype, count, displ),
    without viewing the buffer as bytes or reading the spec again. A halo exchange sends
    such a message every iteration, and the general path's work costs several times the
    copy at halo sizes (benchmarks/README.md, "Halo column"). Anything else (a float
    count, another dtype, a bound to report with a clear error) goes the general way,
    which checks and raises as it always did.
    """
    buf, cd, dt = spec
    if type(buf) is not np.ndarray or type(dt) is not Datatype or not buf.flags.c_contiguous \
            or (writable and not buf.flags.writeable) or dt._freed:
        return None
    if type(cd) is int:
        count, displ = cd, 0
    elif type(cd) in (tuple, list) and len(cd) == 2 and type(cd[0]) is int and \
            type(cd[1]) is int:
        count, displ = cd
    else:
        return None
    plan = dt._cache.get((_PLAN, count * blocks, displ))
    if plan is None:
        plan = _strided_plan(dt, count * blocks, displ)
        if plan is None:
            return None
    wire, hi, start, first, stop, stride, nb, bl, per, reducible = plan
    # the general path's bounds, so that both accept and refuse alike: it raises
    if buf.dtype != wire or buf.size < hi or start > buf.nbytes:
        return None
    flat = buf.ravel()
    if bl == 1:
        view = flat[first:stop:stride]
        packed = view.copy()

        def unpack() -> None:
            view[...] = packed
    else:
        view = block_view(flat, first, nb, stride, bl)
        packed = view.reshape(-1)           # a copy unless the runs touch
        if np.may_share_memory(view, packed):
            return Msg(packed, None, per, reducible)

        def unpack() -> None:
            view[...] = packed.reshape(nb, bl)
    return Msg(packed, unpack, per, reducible)


def _strided_plan(dt: Datatype, count: int, displ: int) -> tuple | None:
    """``(wire dtype, elements needed, start byte, first, stop, stride, runs, run length,
    elements per item, reducible)`` for :func:`strided`, kept in the datatype's own cache
    (it lives and goes with the type); None when the layout is not equal runs at a
    constant stride in the type's basic dtype."""
    if dt._contig or not dt._committed or count <= 0 or displ < 0 or \
            dt.Get_size() == 0 or dt.wire_dtype().fields is not None or \
            (displ and dt.extent <= 0):
        return None
    _, by_element, lo, hi, runs = dt.gather_index(count, displ * dt.extent)
    if not by_element or runs is None or lo < 0:
        return None
    first, nb, stride, bl = runs
    if bl != 1 and (bl > stride or stride <= 0):
        return None
    plan = (dt.wire_dtype(), hi, displ * dt.extent, first, first + (nb - 1) * stride + 1,
            stride, nb, bl, dt.elements(), dt.homogeneous)
    plans = [k for k in dt._cache if k[0] == _PLAN]
    if len(plans) >= _PLANS_MAX:
        del dt._cache[plans[0]]
    dt._cache[(_PLAN, count, displ)] = plan
    return plan


def block_view(src: np.ndarray, first: int, nb: int, stride: int, bl: int) -> np.ndarray:
    """The (nb, bl) view of ``nb`` runs of ``bl`` elements, ``stride`` apart, from element
    ``first`` of ``src``: plain slicing where it reaches (a column: one basic slice, ~20x
    cheaper than numpy's as_strided), as_strided for a last run that ends the buffer."""
    if bl == 1 and stride > 0:
        return src[first:first + (nb - 1) * stride + 1:stride].reshape(nb, 1)
    if 0 < bl <= stride and first + nb * stride <= src.size:
        return src[first:first + nb * stride].reshape(nb, stride)[:, :bl]
    return as_strided(src[first:], shape=(nb, bl),
                      strides=(stride * src.itemsize, src.itemsize), writeable=True)


