"""Type maps held by their algebra: what a :class:`~pycomm.MPI.datatypes.Datatype` knows
about its basic items without listing them.

MPI's type map of a derived type is the list of (basic type, byte displacement) of every
basic item of one item of the type (MPI-4.0 section 5.1). Listing it costs 10 bytes per
item (an int64 displacement and an int16 dtype code), so a type of 2**31 bytes
(``BYTE.Create_contiguous(2**31 - 1)``, which mpi4py's tests and MPI 4's large counts
expect to work) would need 20 GiB before anything is sent. A :class:`TypeMap` is instead
the tree of constructor calls: a leaf holds its items as arrays (the predefined types), a
composite node holds, for each part of the constructor, the :class:`Offsets` at which the
items of one old type are placed. Everything the queries need (item count, data size,
packed bytes, true bounds, whether the items are back to back in one dtype) is computed
from the parts' counts and bounds when the node is made, with work proportional to the
number of blocks the constructor was given, not to the number of items. The flat arrays
are built by :meth:`TypeMap.flatten` only when data moves (packing, gather plans,
``to_numpy``), where the buffer bounds them, and are then kept.
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError

from .exceptions import mpi_error

__all__ = ["MAX_ENTRIES", "Offsets", "TypeMap", "data_size", "struct_bounds"]

MAX_ENTRIES = 1 << 28   # basic items a flattened map may have (its arrays: 2.5 GiB)


def data_size(dt: np.dtype) -> int:
    """Bytes of data in one element of ``dt`` (a structured dtype's padding excluded)."""
    if dt.fields is None:
        return dt.itemsize
    return sum(f[0].itemsize for f in dt.fields.values())


class Offsets:
    """The byte offsets of the old-type items of one constructor part, in type order.

    Block ``i`` is ``lens[i]`` items ``step`` bytes apart from ``starts[i]``; the blocks
    are repeated over the ``outer`` axes ``(count, stride)`` (slowest first), which is
    how a vector (one axis) or a subarray (one axis per dimension but the fastest) place
    their blocks without listing them. An offset is ``sum(a_k * stride_k) + starts[i] +
    j * step``.
    """

    __slots__ = ("lens", "outer", "starts", "step")

    def __init__(self, starts, lens, step: int, outer=()):
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        self.lens = np.asarray(lens, dtype=np.int64).reshape(-1)
        self.step = int(step)
        self.outer = tuple((int(c), int(s)) for c, s in outer)

    def count(self) -> int:
        n = int(self.lens.sum())
        for c, _ in self.outer:
            n *= c
        return n

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        keep = self.lens > 0
        return self.starts[keep], self.lens[keep]

    def bounds(self) -> tuple[int, int]:
        """The smallest and the largest offset (of a part with at least one item)."""
        if self.lens.size <= _FEW:
            step, lows, highs = self.step, [], []
            for start, n in zip(self.starts.tolist(), self.lens.tolist()):
                if n > 0:
                    span = (n - 1) * step
                    lows.append(start + min(span, 0))
                    highs.append(start + max(span, 0))
            lo, hi = min(lows), max(highs)
        else:
            starts, lens = self._live()
            span = (lens - 1) * self.step
            lo = int((starts + np.minimum(span, 0)).min())
            hi = int((starts + np.maximum(span, 0)).max())
        for c, s in self.outer:
            lo += min(0, (c - 1) * s)
            hi += max(0, (c - 1) * s)
        return lo, hi

    def progression(self, q: int) -> int | None:
        """The first offset when the offsets run ``q`` bytes apart in type order (each
        item right after the previous one's ``q`` bytes), else None."""
        starts, lens = self._live()
        if (lens > 1).any() and self.step != q:
            return None
        if lens.size > 1 and (starts[1:] != starts[:-1] + lens[:-1] * q).any():
            return None
        span = int(lens.sum()) * q
        for c, s in reversed(self.outer):
            if c > 1 and s != span:
                return None
            span *= c
        return int(starts[0])

    def flatten(self) -> np.ndarray:
        lens = self.lens
        first = np.repeat(self.starts, lens)
        within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lens) - lens, lens)
        offs = first + within * self.step
        for c, s in reversed(self.outer):
            offs = (np.arange(c, dtype=np.int64)[:, None] * s + offs[None, :]).reshape(-1)
        return offs


# Parts of at most this many blocks are measured with Python's ints: numpy's cost per
# call outweighs the work on a few values (a struct's members, a vector's one block).
_FEW = 8


class TypeMap:
    """A type map as a tree (see the module docstring), with its algebraic summary.

    ``dtypes``: the basic numpy dtypes (a code indexes them); ``n``: basic items;
    ``nbytes``: their itemsizes summed (what a heterogeneous item packs to); ``size``:
    their data bytes (``Get_size``); ``tlb``/``tub``: the true bounds (lowest
    displacement, highest displacement + itemsize; 0, 0 when empty); ``run``: ``d`` when
    the items are one dtype at displacements ``d, d + itemsize, d + 2*itemsize...`` (0 for
    an empty map), else None. A node is also the identity of a datatype handle (copies
    made with ``Datatype(other)`` share it), so ``alias`` makes an equal map that is a
    new handle.
    """

    __slots__ = ("dtypes", "flat", "n", "nbytes", "parts", "run", "size", "tlb", "tub")

    @classmethod
    def leaf(cls, dtypes, disps, codes) -> TypeMap:
        """A map given by its arrays (a basic type: one item at displacement 0)."""
        self = object.__new__(cls)
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        disps = np.asarray(disps, dtype=np.int64).reshape(-1)
        codes = np.asarray(codes, dtype=np.int16).reshape(-1)
        self.flat, self.parts, self.n = (disps, codes), None, int(disps.size)
        isz = np.array([d.itemsize for d in self.dtypes] or [0], dtype=np.int64)[codes]
        dsz = np.array([data_size(d) for d in self.dtypes] or [0], dtype=np.int64)[codes]
        self.nbytes, self.size = int(isz.sum()), int(dsz.sum())
        self.tlb = int(disps.min()) if self.n else 0
        self.tub = int((disps + isz).max()) if self.n else 0
        self.run = 0 if not self.n else None
        if self.n and len(self.dtypes) == 1:
            isz1 = self.dtypes[0].itemsize
            if np.array_equal(disps, disps[0] + np.arange(self.n, dtype=np.int64) * isz1):
                self.run = int(disps[0])
        return self

    @classmethod
    def compose(cls, parts) -> tuple[TypeMap, int, int]:
        """The map whose items are the items of ``parts``, ``(Offsets, map, lb, ub)``
        (``lb``/``ub``: the old type's bounds), concatenated in order (MPI's type map
        concatenation); returns it with its ``lb`` and ``ub`` (0, 0 when empty)."""
        self = object.__new__(cls)
        dtypes: list[np.dtype] = []
        self.parts, self.flat = [], None
        self.n = self.nbytes = self.size = 0
        lows, highs, tlows, thighs, runs = [], [], [], [], []
        for offs, child, lb, ub in parts:
            # every part's dtypes count, even an empty part's: they decide the wire dtype
            remap = np.array([_index_of(dtypes, d) for d in child.dtypes] or [0],
                             dtype=np.int16)
            k = offs.count()
            if k == 0 or child.n == 0:
                continue
            self.parts.append((offs, child, remap))
            self.n += k * child.n
            self.nbytes += k * child.nbytes
            self.size += k * child.size
            lo, hi = offs.bounds()
            lows.append(lo + lb)
            highs.append(hi + ub)
            tlows.append(lo + child.tlb)
            thighs.append(hi + child.tub)
            runs.append((offs, child, k))
        self.dtypes = tuple(dtypes)
        self.tlb, self.tub = (min(tlows), max(thighs)) if lows else (0, 0)
        self.run = self._run(runs)
        return self, (min(lows) if lows else 0), (max(highs) if highs else 0)

    def _run(self, parts) -> int | None:
        if len(self.dtypes) != 1:
            return None if self.n else 0
        isz, expect, first = self.dtypes[0].itemsize, None, 0
        for offs, child, k in parts:
            if child.run is None:
                return None
            q = child.n * isz
            f = offs.progression(q)
            if f is None or (expect is not None and f + child.run != expect):
                return None
            if expect is None:
                first = f + child.run
            expect = f + child.run + k * q
        return first

    def alias(self) -> TypeMap:
        """The same map as a new object (a new handle's identity)."""
        out = object.__new__(TypeMap)
        for slot in TypeMap.__slots__:
            setattr(out, slot, getattr(self, slot))
        if self.parts is None:     # a leaf's arrays are a predefined handle's key
            out.flat = (self.flat[0].copy(), self.flat[1])
        return out

    def flatten(self) -> tuple[np.ndarray, np.ndarray]:
        """``(disps, codes)``: every basic item's byte displacement and dtype code, built
        on first use and kept.

        Raises:
            MPI.Exception (ERR_TYPE): the map has more than ``MAX_ENTRIES`` items.
        """
        if self.flat is not None:
            return self.flat
        if self.n > MAX_ENTRIES:
            raise mpi_error(ArgumentError, "ERR_TYPE", f"datatype of {self.n} basic items: "
                            f"moving data with it needs its type map, one displacement "
                            f"per item ({self.n * 10 / 2**30:.1f} GiB), and pycomm builds "
                            f"one of at most {MAX_ENTRIES} items; split the message into "
                            "more items of a smaller datatype")
        disps, codes = [np.empty(0, np.int64)], [np.empty(0, np.int16)]
        for offs, child, remap in self.parts:
            cd, cc = child.flatten()
            o = offs.flatten()
            disps.append((o[:, None] + cd[None, :]).reshape(-1))
            codes.append(np.broadcast_to(remap[cc][None, :], (o.size, cc.size)).reshape(-1))
        self.flat = (np.concatenate(disps), np.concatenate(codes))
        return self.flat

    def __getstate__(self):
        # a composite pickles as its tree: its flat arrays may be large and are rebuilt
        state = {s: getattr(self, s) for s in TypeMap.__slots__}
        if self.parts is not None:
            state["flat"] = None
        return state

    def __setstate__(self, state) -> None:
        for slot, value in state.items():
            setattr(self, slot, value)


def _index_of(dtypes: list, dt: np.dtype) -> int:
    for i, d in enumerate(dtypes):
        if d == dt and d.fields == dt.fields and d.itemsize == dt.itemsize and \
                d.metadata == dt.metadata:      # (LONG and LONG_LONG: see _long)
            return i
    dtypes.append(dt)
    return len(dtypes) - 1


def struct_bounds(tmap: TypeMap, lb: int, ub: int, blocks) -> tuple[int, int]:
    """The bounds of a struct type as MPICH computes them, from the composed map
    ``tmap`` and its ``lb``/``ub`` and the ``(blocklength, displacement, old type's item
    count, old lb, old ub)`` of each block (MPI-4.1 section 5.1.2 and 5.1.6).

    With no data at all the bounds stay (0, 0). Otherwise blocks of a type with no data but
    bounds (``Create_resized`` of an empty type) widen them, and the extent rounds up to the
    strictest alignment of the basic types of the parts with data (the standard's epsilon:
    items then lie as a C compiler lays out an array of the struct; MPICH and Open MPI do
    so, and mpi4py's dtlib relies on it).
    """
    if not tmap.parts:
        return lb, ub
    for count, disp, n, old_lb, old_ub in blocks:
        if count and n == 0:
            last = disp + (count - 1) * (old_ub - old_lb)
            lb, ub = min(lb, disp + old_lb, last + old_lb), max(ub, disp + old_ub, last + old_ub)
    align = max(d.alignment for _, child, _ in tmap.parts for d in child.dtypes)
    return lb, ub + (lb - ub) % align
