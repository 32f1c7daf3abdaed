"""MPI datatypes for the :mod:`pycomm.MPI` façade: predefined types and derived layouts.

A :class:`Datatype` is a *typemap*: the byte displacement and numpy dtype of every basic
element of one item, plus the item's lower bound and extent (MPI-4.0 section 5.1). Items
of a message lie ``extent`` bytes apart. The typemap is a
:class:`~pycomm.MPI.typemap.TypeMap`, the tree of constructor calls: size, extent, true
extent, element count, homogeneity and contiguity are computed from the constructor's
blocks when the type is made, so a type of any size (``BYTE.Create_contiguous(2**31 -
1)``, MPI 4's large counts) is made and queried in time and memory proportional to its
blocks (one displacement per basic element would take GiB for such a type). The flat
arrays (``_disps``: int64 byte displacements, ``_codes``: an index into ``_dtypes``) are
built only when data moves; packing ``count`` items is then array operations, never a
Python loop over elements.

Moving a message (see :mod:`pycomm.MPI.msgspec`): the datatype decides how the buffer's
bytes are read. A *contiguous* type (its elements back to back from byte 0, extent equal
to size: every predefined type, ``Create_contiguous`` of one) reads ``count`` items as a
zero-copy numpy view of the buffer in the type's numpy dtype. Any other type is packed
into a contiguous array with one fancy-indexing gather (and unpacked with one scatter) on
precomputed indices; a homogeneous type (one basic dtype) packs into that dtype, so
reductions work on it, a heterogeneous one (``Create_struct`` of mixed types) into bytes.

The numpy dtypes that travel ("wire" dtypes) are always numeric: ``CHAR`` travels as
uint8, ``WCHAR`` as uint32, the pair types (``DOUBLE_INT``, ...) as the C-layout
structured dtypes that :data:`pycomm.ops.MAXLOC` accepts.
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError

from .exceptions import mpi_error, translate_methods
from .keyvals import copy_attrs, free_attrs, type_attrs
from .plans import _int, _ints, _nonneg
from .typemap import Offsets, TypeMap, data_size, struct_bounds

__all__ = ["COMBINER_NAMED", "DATATYPE_NULL", "ORDER_C", "ORDER_F", "ORDER_FORTRAN",
           "Datatype"]

ORDER_C, ORDER_FORTRAN = 0, 1
ORDER_F = ORDER_FORTRAN
(COMBINER_NAMED, COMBINER_DUP, COMBINER_CONTIGUOUS, COMBINER_VECTOR, COMBINER_HVECTOR,
 COMBINER_INDEXED, COMBINER_HINDEXED, COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK,
 COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_RESIZED) = range(12)
COMBINER_DARRAY, COMBINER_F90_REAL, COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER = range(12, 16)
COMBINER_VALUE_INDEX = 20
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4

_WIRE = {"S": np.dtype(np.uint8), "U": np.dtype(np.uint32)}   # non-numeric basic dtypes
_data_size = data_size    # predefined.py's name for it
_INDEX_CACHE = 8          # index arrays kept per datatype (one per distinct count/offset)


def _err(message: str):
    """A datatype error: ``MPI.Exception`` of class ERR_TYPE, a pycomm ArgumentError."""
    return mpi_error(ArgumentError, "ERR_TYPE", message)


@translate_methods
class Datatype:
    """An MPI datatype (mpi4py's ``MPI.Datatype``): a typemap over numpy dtypes.

    Users get predefined types as module constants (``MPI.DOUBLE``) and derive new ones
    with the ``Create_*`` methods; a derived type must be ``Commit()``-ed before use.

    Attributes (read-only, mpi4py's properties): ``size`` (bytes of data in one item),
    ``extent``/``lb``/``ub`` (bytes), ``true_lb``/``true_extent``/``true_ub``, ``name``,
    ``typechar``/``typestr`` (numpy codes, "" when none), ``is_predefined``.
    """

    # _data: the TypeMap, and the handle's identity (Datatype(other) copies share it)
    __slots__ = ("__weakref__", "_cache", "_code", "_combiner", "_committed", "_contig",
                 "_ctor", "_data", "_dtypes", "_freed", "_lb", "_name", "_predefined",
                 "_size", "_ub")

    def __init__(self, datatype: Datatype | None = None):
        src = DATATYPE_NULL if datatype is None else datatype
        if not isinstance(src, Datatype):
            raise TypeError(f"Datatype({datatype!r}): expected a Datatype")
        for slot in Datatype.__slots__:
            if slot == "__weakref__":
                continue
            object.__setattr__(self, slot, getattr(src, slot, None))

    # -- construction (internal) --------------------------------------------------------
    @classmethod
    def _make(cls, tmap: TypeMap, lb: int, ub: int, *, name: str = "",
              predefined: bool = False, combiner: int = COMBINER_NAMED,
              code: str | None = None, size: int | None = None) -> Datatype:
        self = object.__new__(cls)
        self._name = name
        self._data = tmap
        self._dtypes = tmap.dtypes
        self._lb, self._ub = int(lb), int(ub)
        self._size = tmap.size if size is None else size
        self._predefined = predefined
        self._committed = predefined
        self._freed = False
        self._combiner = combiner
        self._code = code
        # contiguous: one dtype, items back to back from byte 0, extent = their bytes
        self._contig = bool(len(tmap.dtypes) == 1 and tmap.run == 0 and self._lb == 0 and
                            self._ub == tmap.n * tmap.dtypes[0].itemsize)
        self._cache = {}
        self._ctor = None           # (combiner name, old type, arguments): decode.py
        return self

    @classmethod
    def _basic(cls, name: str, dtype, code: str | None, size: int | None = None):
        dt = np.dtype(dtype)
        return cls._make(TypeMap.leaf([dt], [0], [0]), 0, dt.itemsize, name=name,
                         predefined=True, code=code, size=size)

    @classmethod
    def _compose(cls, parts, combiner: int) -> Datatype:
        """The type whose items are ``parts``: (:class:`Offsets`, Datatype) pairs, each
        offset placing one whole item of that datatype (MPI's typemap concatenation);
        its bounds and sizes come from the parts' (see :meth:`TypeMap.compose`)."""
        for _, dt in parts:
            dt._check_usable("a type constructor")
        tmap, lb, ub = TypeMap.compose([(offs, dt._data, dt._lb, dt._ub)
                                        for offs, dt in parts])
        return cls._make(tmap, lb, ub, combiner=combiner)

    def _check_usable(self, what: str) -> None:
        if self._freed:
            raise _err(f"{what}: datatype {self._name or 'derived'} has been freed")
        if self._data is DATATYPE_NULL._data:
            raise _err(f"{what}: DATATYPE_NULL cannot be used")

    # -- the flat type map, built when data moves (pack, gather plans, to_numpy) --------
    _disps = property(lambda self: self._data.flatten()[0],
                      doc="int64 byte displacement of every basic element (built on use)")
    _codes = property(lambda self: self._data.flatten()[1],
                      doc="index into ``_dtypes`` of every basic element (built on use)")
    _nitems = property(lambda self: self._data.n,
                       doc="basic elements of one item (``_disps.size``, not built)")

    # -- accessors ----------------------------------------------------------------------
    def Get_size(self) -> int:
        """Bytes of data in one item (padding and gaps excluded)."""
        return self._size

    def Get_extent(self) -> tuple[int, int]:
        """``(lb, extent)`` in bytes: items of a message lie ``extent`` bytes apart."""
        return self._lb, self._ub - self._lb

    def Get_true_extent(self) -> tuple[int, int]:
        """``(true_lb, true_extent)`` in bytes: the span the data really covers."""
        return self._data.tlb, self._data.tub - self._data.tlb

    def Get_name(self) -> str:
        """The type's name (``"MPI_DOUBLE"`` ...; "" for an unnamed derived type)."""
        return self._name

    def Set_name(self, name: str) -> None:
        """Set the name returned by :meth:`Get_name`."""
        self._name = str(name)

    def Get_envelope(self) -> tuple[int, int, int, int, int]:
        """``(n_integers, n_addresses, n_large_counts, n_datatypes, combiner)``."""
        return _decode.envelope(self)

    def Get_contents(self) -> tuple[list, list, list, list]:
        """The constructor's ``(integers, addresses, large_counts, datatypes)``."""
        return _decode.contents(self)

    def decode(self) -> tuple:
        """``(oldtype, "VECTOR", {"count": ...})``: what rebuilds this type."""
        return _decode.decode(self)

    envelope = property(lambda self: self.Get_envelope())
    contents = property(lambda self: self.Get_contents())
    combiner = property(lambda self: _decode.combiner(self))

    size = property(Get_size)
    name = property(Get_name, Set_name)
    lb = property(lambda self: self._lb)
    ub = property(lambda self: self._ub)
    extent = property(lambda self: self._ub - self._lb)
    true_lb = property(lambda self: self.Get_true_extent()[0])
    true_extent = property(lambda self: self.Get_true_extent()[1])
    true_ub = property(lambda self: sum(self.Get_true_extent()))
    is_predefined = property(lambda self: self._predefined)
    is_named = property(lambda self: self._predefined and self._ctor is None)

    @property
    def typechar(self) -> str:
        """numpy character code of a predefined type or its ``Dup`` (``"l"`` for
        ``INT64_T``, as mpi4py's ``DatatypeChar``: a type string's size, numpy's character
        for it); ``"V"`` for pair and derived types, ``""`` for DATATYPE_NULL."""
        code = self._code
        if not code:
            return "V" if self is not DATATYPE_NULL else ""
        return np.dtype(code).char if code[1:].isdigit() else code

    @property
    def typestr(self) -> str:
        """numpy type string (``"f8"``, ``"S1"``, ``"U1"``...) of a basic type or its
        ``Dup``; ``"V<extent>"`` otherwise."""
        if self._code and len(self._dtypes) == 1 and self._dtypes[0].fields is None:
            dt = self._dtypes[0]        # ("S1", "U1": one character, of any width)
            return f"{dt.kind}{dt.itemsize if dt.kind not in 'SU' else 1}" \
                if dt.kind != "b" else "b1"
        return f"V{self.extent}" if self is not DATATYPE_NULL else ""

    def tocode(self) -> str:
        """The code of a predefined type: its numpy character code for C's named types
        (``MPI.DOUBLE.tocode() == "d"``), its type string for the fixed-size ones
        (``MPI.INT64_T.tocode() == "i8"``, ``MPI.REAL4.tocode() == "f4"``), as mpi4py's.

        Raises:
            ValueError: a derived or pair type (no code maps to it).
        """
        if not self._code:
            raise ValueError(f"cannot map {self._name or 'a derived datatype'} to a "
                             "character code or type string")
        return self._code

    def to_numpy(self) -> np.dtype:
        """The numpy dtype of one item: the basic dtype for a predefined type, otherwise a
        structured dtype with one field per basic element at its displacement."""
        if self._predefined:
            return self._dtypes[0]
        return np.dtype({"names": [f"f{i}" for i in range(self._disps.size)],
                         "formats": [self._dtypes[c] for c in self._codes],
                         "offsets": (self._disps - self._lb).tolist(),
                         "itemsize": self.extent})

    # -- life cycle ---------------------------------------------------------------------
    def Commit(self) -> Datatype:
        """Mark the type ready for communication; returns ``self`` (mpi4py)."""
        self._check_usable("Commit")
        self._committed = True
        return self

    def Free(self) -> None:
        """Release a derived type; using it afterwards raises. Its attributes are deleted
        first (their keys' delete callbacks run: :mod:`pycomm.MPI.keyvals`).

        Raises:
            MPI.Exception: ERR_TYPE (a predefined type cannot be freed), ERR_OTHER (an
                attribute callback raised; the type is freed all the same).
        """
        if self._predefined:
            raise _err(f"Datatype.Free: {self._name} is predefined and cannot be "
                                "freed")
        try:                            # the callbacks see the type still alive
            free_attrs(self, type_attrs(self), "Datatype.Free")
        finally:
            self._freed = True

    def Dup(self) -> Datatype:
        """A committed copy with the same typemap (``MPI_Type_dup``), with the attributes
        the keys' copy callbacks give it.

        Raises:
            MPI.Exception: ERR_TYPE (freed or null), ERR_OTHER (a copy callback raised).
        """
        self._check_usable("Dup")
        attrs = copy_attrs(self, type_attrs(self), "Datatype.Dup")
        out = Datatype._make(self._data.alias(), self._lb, self._ub, combiner=COMBINER_DUP,
                             code=self._code, size=self._size)
        out._committed, out._name = self._committed, self._name
        type_attrs(out).update(attrs)
        return out

    Create_dup = Dup

    def __eq__(self, other) -> bool:
        """Same handle: the same object or a ``Datatype(other)`` copy of it (``Dup``
        makes a new handle); a freed handle is ``DATATYPE_NULL``, as in mpi4py."""
        if not isinstance(other, Datatype):
            return NotImplemented
        return self is other or self._data is other._data or (not self and not other)

    def __hash__(self) -> int:
        return id(self._data if self else DATATYPE_NULL._data)

    def __bool__(self) -> bool:
        return self._data is not DATATYPE_NULL._data and not self._freed

    def __repr__(self) -> str:
        if self._name:
            return f"<pycomm.MPI.Datatype {self._name}>"
        return (f"<pycomm.MPI.Datatype derived: {self._data.n} elements, size "
                f"{self._size}, lb {self._lb}, extent {self.extent}>")

    def __reduce__(self):
        if self._predefined and self._ctor is None:
            from .predefined import _KEY_OF, _copy_of, _predefined
            key = _KEY_OF[id(self._disps)]
            return (_predefined, (key,)) if self is _predefined(key) else \
                (_copy_of, (key, type(self)))       # a copy: a new one of its class
        if self._ctor is not None:            # made by a constructor: made again by it
            from .decode import recreate
            return recreate, (*self._ctor, self._committed)
        return _rebuild, (self._data, self._lb, self._ub, self._combiner, self._committed,
                          self._size)

    # -- derived types (MPI-4.0 section 5.1.2) ------------------------------------------
    def Create_contiguous(self, count: int) -> Datatype:
        """``count`` items of this type back to back."""
        count = _nonneg(count, "count", "Create_contiguous")
        return Datatype._compose([(Offsets([0], [count], self.extent), self)],
                                 COMBINER_CONTIGUOUS)

    def Create_vector(self, count: int, blocklength: int, stride: int) -> Datatype:
        """``count`` blocks of ``blocklength`` items, block starts ``stride`` items apart."""
        return self._hvector(count, blocklength, _int(stride, "stride", "Create_vector")
                             * self.extent, "Create_vector", COMBINER_VECTOR)

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> Datatype:
        """As :meth:`Create_vector` with ``stride`` in bytes."""
        return self._hvector(count, blocklength, _int(stride, "stride", "Create_hvector"),
                             "Create_hvector", COMBINER_HVECTOR)

    def _hvector(self, count, blocklength, stride_bytes, what, combiner):
        count = _nonneg(count, "count", what)
        blen = _nonneg(blocklength, "blocklength", what)
        offs = Offsets([0], [blen], self.extent, outer=[(count, stride_bytes)])
        return Datatype._compose([(offs, self)], combiner)

    def Create_indexed(self, blocklengths, displacements) -> Datatype:
        """Blocks of ``blocklengths[i]`` items at ``displacements[i]`` items."""
        d = _ints(displacements, "displacements", "Create_indexed")
        return self._hindexed(blocklengths, d * self.extent, "Create_indexed",
                              COMBINER_INDEXED)

    def Create_hindexed(self, blocklengths, displacements) -> Datatype:
        """Blocks of ``blocklengths[i]`` items at ``displacements[i]`` bytes."""
        d = _ints(displacements, "displacements", "Create_hindexed")
        return self._hindexed(blocklengths, d, "Create_hindexed", COMBINER_HINDEXED)

    def Create_indexed_block(self, blocklength: int, displacements) -> Datatype:
        """Blocks of ``blocklength`` items at ``displacements[i]`` items."""
        d = _ints(displacements, "displacements", "Create_indexed_block")
        blen = _nonneg(blocklength, "blocklength", "Create_indexed_block")
        return self._hindexed(np.full(d.size, blen), d * self.extent,
                              "Create_indexed_block", COMBINER_INDEXED_BLOCK)

    def Create_hindexed_block(self, blocklength: int, displacements) -> Datatype:
        """Blocks of ``blocklength`` items at ``displacements[i]`` bytes."""
        d = _ints(displacements, "displacements", "Create_hindexed_block")
        blen = _nonneg(blocklength, "blocklength", "Create_hindexed_block")
        return self._hindexed(np.full(d.size, blen), d, "Create_hindexed_block",
                              COMBINER_HINDEXED_BLOCK)

    def _hindexed(self, blocklengths, byte_disps, what, combiner):
        blens = _ints(blocklengths, "blocklengths", what)
        if blens.size != byte_disps.size:
            raise _err(f"{what}: {blens.size} blocklengths but {byte_disps.size} "
                                "displacements")
        if (blens < 0).any():
            raise _err(f"{what}: blocklengths must be >= 0, got {blens.tolist()}")
        return Datatype._compose([(Offsets(byte_disps, blens, self.extent), self)],
                                 combiner)

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes) -> Datatype:
        """Blocks of ``blocklengths[i]`` items of ``datatypes[i]`` at ``displacements[i]``
        bytes (mixed types: such a type packs to bytes and supports no reduction); the
        extent is padded to the strictest alignment of its basic types, as in MPICH."""
        blens = _ints(blocklengths, "blocklengths", "Create_struct")
        disps = _ints(displacements, "displacements", "Create_struct")
        from .predefined import to_datatype
        types = [to_datatype(t, "Create_struct") for t in datatypes]
        if not blens.size == disps.size == len(types):
            raise _err(f"Create_struct: {blens.size} blocklengths, {disps.size} "
                                f"displacements and {len(types)} datatypes differ in length")
        if (blens < 0).any():
            raise _err(f"Create_struct: blocklengths must be >= 0, got {blens.tolist()}")
        parts = [(Offsets([d], [b], t.extent), t) for b, d, t in zip(blens, disps, types)]
        out = cls._compose(parts, COMBINER_STRUCT)
        lb, ub = struct_bounds(out._data, out._lb, out._ub,
                               [(b, d, t._data.n, t._lb, t._ub) for b, d, t in
                                zip(blens.tolist(), disps.tolist(), types)])
        if (lb, ub) != (out._lb, out._ub):
            out = out._resized(lb, ub - lb, COMBINER_STRUCT)
        return out

    def Create_subarray(self, sizes, subsizes, starts, order: int = ORDER_C) -> Datatype:
        """The ``subsizes`` block at ``starts`` of a ``sizes`` array of this type, in C
        (row-major, ``ORDER_C``) or Fortran order; extent: the whole array."""
        what = "Create_subarray"
        sizes, subs = _ints(sizes, "sizes", what), _ints(subsizes, "subsizes", what)
        starts = _ints(starts, "starts", what)
        if not sizes.size == subs.size == starts.size or sizes.size == 0:
            raise _err(f"{what}: sizes {sizes.tolist()}, subsizes {subs.tolist()}"
                                f" and starts {starts.tolist()} must have one equal length")
        if (subs < 0).any() or (starts < 0).any() or (starts + subs > sizes).any():
            raise _err(f"{what}: block {subs.tolist()} at {starts.tolist()} does "
                                f"not fit in {sizes.tolist()}")
        if order not in (ORDER_C, ORDER_FORTRAN):
            raise _err(f"{what}: order={order!r} is not ORDER_C or ORDER_FORTRAN")
        axes = list(range(sizes.size))
        if order == ORDER_FORTRAN:
            axes.reverse()
        ext, base, outer = self.extent, 0, []
        for a in axes:                        # slowest axis first: offsets in type order
            stride = _prod(sizes[a + 1:] if order == ORDER_C else sizes[:a]) * ext
            base += int(starts[a]) * stride
            outer.append((int(subs[a]), stride))
        count, step = outer.pop()             # the fastest axis: the blocks themselves
        inner = Datatype._compose([(Offsets([base], [count], step, outer), self)],
                                  COMBINER_SUBARRAY)
        return inner._resized(0, _prod(sizes) * ext, COMBINER_SUBARRAY)

    def Create_resized(self, lb: int, extent: int) -> Datatype:
        """This typemap with lower bound ``lb`` and extent ``extent`` (bytes)."""
        return self._resized(_int(lb, "lb", "Create_resized"),
                             _int(extent, "extent", "Create_resized"), COMBINER_RESIZED)

    def _resized(self, lb: int, extent: int, combiner: int) -> Datatype:
        self._check_usable("Create_resized")
        return Datatype._make(self._data.alias(), lb, lb + extent, combiner=combiner,
                              size=self._size)

    # -- packing ------------------------------------------------------------------------
    def Pack(self, inbuf, outbuf, position: int, comm=None) -> int:
        """Pack ``inbuf`` (whole items of this type) into the bytes of ``outbuf`` at byte
        ``position``; return the position after them. See :func:`msgspec.pack`."""
        from .msgspec import pack
        return pack(self, inbuf, outbuf, position)

    def Unpack(self, inbuf, position: int, outbuf, comm=None) -> int:
        """Unpack items of this type filling ``outbuf`` from the bytes of ``inbuf`` at
        byte ``position``; return the position after them."""
        from .msgspec import unpack
        return unpack(self, inbuf, position, outbuf)

    def Pack_size(self, count: int, comm=None) -> int:
        """Bytes that ``count`` packed items take."""
        return int(count) * self.elements() * self.wire_dtype().itemsize

    @property
    def homogeneous(self) -> bool:
        """Whether every basic element has the same numpy dtype (such a type packs to that
        dtype and can be reduced)."""
        return len(self._dtypes) == 1

    def wire_dtype(self) -> np.dtype:
        """numpy dtype of the packed message: the basic dtype (non-numeric ones as
        unsigned ints of their size) for a homogeneous type, uint8 otherwise."""
        if len(self._dtypes) != 1:
            return np.dtype(np.uint8)
        dt = self._dtypes[0]
        return _WIRE.get(dt.kind, dt)

    def elements(self) -> int:
        """Wire-dtype elements that one item packs to."""
        return self._data.n if len(self._dtypes) == 1 else self._data.nbytes

    def gather_index(self, count: int, start: int) -> tuple:
        """The plan that gathers ``count`` items at byte ``start`` of a buffer, cached per
        (count, start): see :func:`pycomm.MPI.plans.gather_plan`."""
        key = (count, start)
        hit = self._cache.get(key)
        if hit is None:
            from .plans import gather_plan
            hit = gather_plan(self, count, start)
            if len(self._cache) >= _INDEX_CACHE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = hit
        return hit


def _prod(values) -> int:
    """The product as a Python int (numpy's int64 product would wrap silently)."""
    out = 1
    for v in values:
        out *= int(v)
    return out


def _rebuild(tmap, lb, ub, combiner, committed, size) -> Datatype:
    dt = Datatype._make(tmap, lb, ub, combiner=combiner, size=size)
    dt._committed = committed
    return dt


DATATYPE_NULL = Datatype._make(TypeMap.leaf([], [], []), 0, 0, name="MPI_DATATYPE_NULL",
                               predefined=True)

from . import decode as _decode  # noqa: E402  (its constructors wrap this class's)

_decode.install(Datatype)
