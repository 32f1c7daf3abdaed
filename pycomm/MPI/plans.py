"""Gather plans: how the items of a datatype are read out of, and written back into, a
buffer (:mod:`pycomm.MPI.msgspec` packs and unpacks with them).

A plan holds the element (or byte) index of every basic element of ``count`` items, its
bounds, and, when the index is equal-length runs at a constant stride (a vector column, a
1-D subarray), that run structure, which packs as one strided numpy view (a copy loop over
memory, no index array read) instead of a fancy-indexing gather. The integer-argument
checks the datatype constructors share live here too.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gather_plan"]


def gather_plan(dt, count: int, start: int) -> tuple:
    """How to gather ``count`` items placed at byte ``start`` of a buffer.

    Returns ``(index, by_element, lo, hi, blocks)``: ``index`` is in units of the basic
    dtype's itemsize when ``by_element`` (the buffer is viewed in that dtype), else in
    bytes (heterogeneous or misaligned layouts); ``lo``/``hi`` bound it (``hi``
    exclusive); ``blocks`` is ``(first, nblocks, stride, blocklength)`` when the index
    is equal-length runs at a constant positive stride (vectors, columns, subarrays of
    one dimension...), which packs as a strided view (a copy loop, no index array).
    """
    item_offs = start + np.arange(count, dtype=np.int64) * dt.extent
    leaf = (item_offs[:, None] + dt._disps[None, :]).reshape(-1)
    isz = dt._dtypes[0].itemsize if len(dt._dtypes) == 1 else 0
    if isz and not (leaf % isz).any():
        index, by_element = leaf // isz, True
    else:
        lens = np.array([d.itemsize for d in dt._dtypes],
                        dtype=np.int64)[np.tile(dt._codes, count)]
        first = np.cumsum(lens) - lens
        index = np.repeat(leaf - first, lens) + np.arange(int(lens.sum()))
        by_element = False
    return (index, by_element, int(index.min()), int(index.max()) + 1, _runs(index))


def _runs(index: np.ndarray) -> tuple[int, int, int, int] | None:
    """``(first, nblocks, stride, blocklength)`` when ``index`` is ``nblocks`` runs of
    ``blocklength`` consecutive values whose starts lie ``stride >= blocklength`` apart."""
    breaks = np.flatnonzero(np.diff(index) != 1)
    bl = int(breaks[0]) + 1 if breaks.size else index.size
    if index.size % bl:
        return None
    rows = index.reshape(-1, bl)
    if bl > 1 and not (np.diff(rows, axis=1) == 1).all():
        return None
    starts = rows[:, 0]
    stride = int(starts[1] - starts[0]) if starts.size > 1 else bl
    if stride < bl or (starts.size > 1 and (np.diff(starts) != stride).any()):
        return None
    return int(starts[0]), int(starts.size), stride, bl


def _int(value, arg: str, what: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TypeError(f"{what}: {arg}={value!r} is not an integer")


def _nonneg(value, arg: str, what: str) -> int:
    v = _int(value, arg, what)
    if v < 0:
        from pycomm.errors import ArgumentError

        from .exceptions import mpi_error
        raise mpi_error(ArgumentError, "ERR_ARG", f"{what}: {arg}={v} must be >= 0")
    return v


def _ints(values, arg: str, what: str) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iu":
        return values.astype(np.int64)
    try:
        return np.array([_int(v, arg, what) for v in values], dtype=np.int64)
    except TypeError:
        raise TypeError(f"{what}: {arg} must be a sequence of integers, got "
                        f"{values!r}") from None
