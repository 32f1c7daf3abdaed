"""The message specs of the buffer collectives, between :mod:`pycomm.MPI.msgspec` (one
buffer's spec) and :class:`pycomm.MPI.coll.Intracomm` (the calls): a root's unused
buffer, per-peer blocks of ``Alltoallw``, the plain-array pair of the common call, empty
messages that take their peer's dtype, and reductions over derived datatypes (whole items
kept together, a user op told the named datatype).
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError

from .exceptions import mpi_error
from .msg import plain
from .datatypes import Datatype
from .msgspec import BOTTOM, Msg, _raw, as_int
from .ops import whole_items, with_datatype
from .regions import Region, bottom_region, region

__all__ = ["item_array", "match_empty", "plain_pair", "reducible", "root_none",
           "starts", "wregions"]


def root_none(at_root: bool, gather: bool, sendbuf, recvbuf):
    """At the root of a gather (scatter), a None send (receive) buffer moves nothing and
    leaves the root's own block as it is (MPI: a zero count), which is IN_PLACE here."""
    if at_root and gather and sendbuf is None:
        return IN_PLACE, recvbuf
    if at_root and not gather and recvbuf is None:
        return sendbuf, IN_PLACE
    return sendbuf, recvbuf


def starts(counts: list[int]) -> list[int]:
    """Where each of blocks of ``counts`` starts when they lie back to back."""
    return [0, *accumulate(counts[:-1])] if counts else []


def _wparts(spec, size: int, w: str, arg: str, writable: bool):
    """``(raw or None for MPI.BOTTOM, counts, displs, datatypes)`` of an Alltoallw spec."""
    from .predefined import to_datatype
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: {arg} must be [buf, datatypes], "
                        "[buf, (counts, displs), datatypes] or [buf, counts, displs, "
                        "datatypes]")
    if len(spec) == 2:
        (buf, types), counts, displs = spec, None, None
    elif len(spec) == 3:
        buf, (counts, displs), types = spec
    else:
        buf, counts, displs, types = spec
    if buf is BOTTOM and (counts is None or displs is None):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: {arg}: MPI.BOTTOM needs counts "
                        "and displacements (absolute addresses)")
    if counts is None and displs is None:   # mpi4py: one item of each type at byte 0
        counts, displs = [1] * size, [0] * size
    raw = None if buf is BOTTOM else _raw(buf, writable, w, arg)[0]
    counts = [as_int(x, "counts", w) for x in counts]
    displs = [as_int(x, "displs", w) for x in displs]
    types = [to_datatype(t, w) for t in types]
    if not len(counts) == len(displs) == len(types) == size:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: {arg} needs {size} counts, "
                        f"displacements and datatypes")
    return raw, counts, displs, types


_LAYOUTS: dict = {}     # an Alltoallw spec's shape -> its blocks' layouts (wregions)
_LAYOUTS_MAX = 16


def wregions(spec, size: int, w: str, arg: str, writable: bool) -> list[Region]:
    """The per-peer blocks of an Alltoallw spec (byte displacements, one datatype each)
    as :class:`~pycomm.MPI.regions.Region` s, which pack into and unpack from the caller's
    buffer in place.

    A spec's parse and its blocks' bounds are found once per (buffer size, counts,
    displacements, datatype handles), and kept as layouts that hold no reference to the
    buffer (:meth:`~pycomm.MPI.regions.Region.layout`): a transpose that runs every step
    with the same arrays and types costs one view per block, not a parse.
    """
    key = _layout_key(spec, size, writable)
    if key is not None:
        raw = _raw(spec[0], writable, w, arg)[0]
        hit = _LAYOUTS.get((raw.size, key))
        # (the entry holds its datatypes, so their ids in the key are theirs; one freed
        # since takes the parse, which refuses it)
        if hit is not None and not any(t._freed for t in hit[0]):
            return [Region.at(raw, layout) for layout in hit[1]]
    raw, counts, displs, types = _wparts(spec, size, w, arg, writable)
    if raw is None:
        return [bottom_region(t, n, d, w, f"{arg} block {i}")
                for i, (n, d, t) in enumerate(zip(counts, displs, types))]
    regions = [region(raw, t, n, d, w, f"{arg} block {i}")
               for i, (n, d, t) in enumerate(zip(counts, displs, types))]
    if key is not None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[(raw.size, key)] = (types, [r.layout(raw) for r in regions])
    return regions


def _layout_key(spec, size: int, writable: bool):
    """The hashable shape of ``[buf, (counts, displs), datatypes]`` (or ``[buf, counts,
    displs, datatypes]``) with lists or tuples of ints and datatypes, the buffer a numpy
    array; None for any other spec (it takes the parse)."""
    if type(spec) not in (list, tuple) or len(spec) not in (3, 4) or \
            type(spec[0]) is not np.ndarray:
        return None
    if len(spec) == 3 and type(spec[1]) in (list, tuple) and len(spec[1]) == 2:
        (counts, displs), types = spec[1], spec[2]
    elif len(spec) == 4:
        counts, displs, types = spec[1], spec[2], spec[3]
    else:
        return None
    if not (type(counts) in (list, tuple) and type(displs) in (list, tuple)
            and type(types) in (list, tuple)):
        return None
    if not all(type(t) is Datatype for t in types):
        return None
    key = (writable, tuple(counts), tuple(displs), tuple(map(id, types)))
    if not all(type(x) is int for x in key[1]) or not all(type(x) is int for x in key[2]) \
            or len(types) != size:
        return None
    return key


def plain_pair(sendbuf, recvbuf):
    """``(send, recv)``: the arrays of a call whose buffers are plain arrays
    (:func:`pycomm.MPI.msg.plain`) of one dtype, the send one possibly ``IN_PLACE``;
    None otherwise. Such a call needs nothing of the general way (no counts, no unpack,
    no empty message to retype, no datatype to name to a user op): the façade's small
    calls hand them straight to the Communicator."""
    r = plain(recvbuf, True)
    if r is None:
        return None
    if sendbuf is IN_PLACE:
        return IN_PLACE, r
    s = plain(sendbuf, False)
    return None if s is None or s.dtype != r.dtype else (s, r)


def plain_to_root(at_root: bool, sendbuf, recvbuf):
    """:func:`plain_pair` of a call whose root receives (Reduce, Gather) at the root;
    elsewhere ``(send, None)`` for a plain send array (the receive buffer is not used
    there: not parsed); None otherwise."""
    if at_root:
        return plain_pair(sendbuf, recvbuf)
    s = plain(sendbuf, False)
    return None if s is None else (s, None)


def match_empty(*msgs) -> None:
    """An empty message (None, or zero items) takes the dtype of the other side's (of the
    first one when all are empty), so that the Communicator's dtype checks do not refuse
    a rank that passes nothing: a zero count matches any datatype in MPI."""
    given = [m for m in msgs if isinstance(m, Msg)]
    typed = [m for m in given if m.array.size] or given[:1]
    for m in given:
        if not m.array.size and typed and m.array.dtype != typed[0].array.dtype:
            m.array = np.empty(0, typed[0].array.dtype)


def reducible(where: str, op, *msgs):
    """Reject OP_NULL and a reduction over a mixed-type datatype (it travels as bytes);
    return ``(op, per)``: the op to run (a user op told the messages' named datatype, see
    :func:`pycomm.MPI.ops.with_datatype`) and the basic elements per datatype item that
    the schedules must keep together (see :func:`item_array`)."""
    if getattr(op, "name", None) == "OP_NULL":
        raise mpi_error(ArgumentError, "ERR_OP", f"{where}: OP_NULL is not an operation")
    named = None
    for m in msgs:
        if isinstance(m, Msg):
            if not m.reducible:
                raise mpi_error(ArgumentError, "ERR_TYPE", f"{where}: a datatype of mixed "
                                f"basic types cannot be reduced with {op}")
            named = named or m.datatype
    op = with_datatype(op, named)
    pers = {m.per for m in msgs if isinstance(m, Msg)}
    per = pers.pop() if len(pers) == 1 and op.__dict__.get("_function") is not None else 1
    basics = {m.array.dtype for m in msgs if isinstance(m, Msg)}
    if per == 1 or len(basics) != 1:    # differing dtypes: the Communicator refuses them
        return op, 1
    return whole_items(op, basics.pop()), per


def item_array(m, per: int):
    """The Communicator's array of ``m``: for a user op on a derived datatype of ``per``
    basic elements an item (``per`` > 1), viewed as one opaque item (a plain void dtype
    of the item's size) per datatype item, so that the schedules, which split a buffer
    between ranks and into segments anywhere, never hand the op part of an item (MPI
    calls it on whole items). A void dtype rather than a record of ``per`` fields: numpy
    copies records field by field, and the schedules copy buffers whole (the send buffer
    into the receive buffer, a partial result after the op), which then cost several
    times the flat copy. :func:`pycomm.MPI.ops.whole_items` gives the op the flat
    elements back."""
    if m is IN_PLACE or m is None:
        return m
    a = m.array
    if per == 1:
        return a
    size = per * a.dtype.itemsize
    item = VOID.get(size)
    if item is None:
        item = VOID[size] = np.dtype((np.void, size))
    return a.view(item)


VOID: dict = {}        # item size in bytes -> its void dtype (one per size, made once)
