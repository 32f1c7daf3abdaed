"""``mpi4py.util.dtlib`` for pycomm: conversion between NumPy dtypes and MPI datatypes.

``from_numpy_dtype(dtype)`` builds a new (uncommitted) MPI datatype: a duplicate of the
predefined type for a scalar dtype, a contiguous type (1-d) or a full subarray type
(n-d, C order) for a subarray dtype, and a struct type resized to ``itemsize`` for a
structured dtype (its padding and alignment kept by the offsets and the extent).

``to_numpy_dtype(datatype)`` goes the other way for the named types (the ``*_INT`` pair
types give ``align=True`` two-field dtypes) and the duplicate, contiguous, full
subarray, struct, resized struct, (h)vector and (h)indexed(_block) constructors; the
struct-like results get field names ``f0``, ``f1``, ... and are marked ``aligned`` when
every member sits at an offset that is a multiple of its alignment.
"""

from .. import MPI

try:
    from numpy import dtype as _np_dtype
except ImportError:                                 # pragma: no cover
    _np_dtype = None
# ``_np_dtype`` (the converter of the results, None: plain specs) may be replaced, as in
# mpi4py

__all__ = ["from_numpy_dtype", "to_numpy_dtype"]

# the pair types of MINLOC/MAXLOC and the scalar type of their first member
_PAIRS = (("SHORT_INT", "SHORT"), ("INT_INT", "INT"), ("LONG_INT", "LONG"),
          ("FLOAT_INT", "FLOAT"), ("DOUBLE_INT", "DOUBLE"),
          ("LONG_DOUBLE_INT", "LONG_DOUBLE"))


def _code(datatype):
    """The NumPy character code or type string of a predefined datatype, or None."""
    try:
        return datatype.tocode()
    except Exception:                               # noqa: BLE001  (no code: a pair type)
        return None


def _pair_of(datatype):
    """The name of the first member's type when ``datatype`` is a pair type, else None."""
    for pair, first in _PAIRS:
        if datatype == getattr(MPI, pair):
            return first
    return None


def _alignment(datatype):
    """The alignment of a predefined datatype in bytes (None when unknown)."""
    return MPI._typealign(datatype)                 # noqa: SLF001  (as mpi4py's dtlib)


def _aligned(datatype, offset=0):
    """Whether every predefined member of ``datatype``, placed at ``offset``, is aligned."""
    if datatype.is_predefined:
        if offset == 0:
            return True
        align = _alignment(datatype) or 0
        return align > 0 and offset % align == 0
    combiner = datatype.combiner
    base, _, info = datatype.decode()
    members = [(base, 0)]
    if combiner == MPI.COMBINER_RESIZED:
        members = [(base, info["extent"])]
    elif combiner == MPI.COMBINER_STRUCT:
        members = list(zip(info["datatypes"], info["displacements"]))
    elif combiner == MPI.COMBINER_HVECTOR:
        members = [(base, info["stride"] if info["count"] > 1 else 0)]
    elif combiner in (MPI.COMBINER_HINDEXED, MPI.COMBINER_HINDEXED_BLOCK):
        members = [(base, disp) for disp in info["displacements"]]
    return all(_aligned(member, offset + disp) for member, disp in members)


def from_numpy_dtype(dtype):
    """Convert a NumPy datatype to a new MPI datatype (to be committed and freed)."""
    if _np_dtype is None:
        raise RuntimeError("NumPy is not available")
    dtype = _np_dtype(dtype)
    if dtype.hasobject:
        raise ValueError("NumPy datatype with object entries")
    if not dtype.isnative:
        raise ValueError("NumPy datatype with non-native byteorder")

    if dtype.fields:                                # structured: struct resized to itemsize
        members = []
        try:
            offsets = []
            for name in dtype.names or ():
                field = dtype.fields[name]
                members.append(from_numpy_dtype(field[0]))
                offsets.append(field[1])
            struct = MPI.Datatype.Create_struct([1] * len(members), offsets, members)
        finally:
            for member in members:
                member.Free()
        try:
            return struct.Create_resized(0, dtype.itemsize)
        finally:
            struct.Free()

    if dtype.subdtype:                              # subarray: contiguous or C subarray
        base, shape = dtype.subdtype
        element = from_numpy_dtype(base)
        try:
            if len(shape) == 1:
                return element.Create_contiguous(shape[0])
            return element.Create_subarray(shape, shape, [0] * len(shape))
        finally:
            element.Free()

    return MPI.Datatype.fromcode(dtype.char).Dup()


def _make(spec, **kwargs):
    """``numpy.dtype(spec, **kwargs)``, or the spec itself without NumPy."""
    if _np_dtype is None:
        return spec if not kwargs else (spec, kwargs)
    return _np_dtype(spec, **kwargs)


def _fields(formats, offsets, itemsize, aligned):
    spec = {"names": [f"f{i}" for i in range(len(formats))],
            "formats": formats, "offsets": list(offsets), "aligned": aligned}
    if itemsize is not None:
        spec["itemsize"] = itemsize
    return _make(spec)


def _block(dtype, count):
    return dtype if count == 1 else (dtype, count)


def to_numpy_dtype(datatype):
    """Convert an MPI datatype to a NumPy datatype."""
    if datatype == MPI.DATATYPE_NULL:
        raise ValueError("cannot convert null MPI datatype to NumPy")
    combiner = datatype.combiner

    if combiner == MPI.COMBINER_NAMED:
        code = _code(datatype)
        if code is not None:
            return _make(code)
        first = _pair_of(datatype)
        if first is None:
            raise ValueError(f"cannot convert MPI datatype {datatype} to NumPy")
        return _make(f"{_code(getattr(MPI, first))},i", align=True)

    if combiner in (MPI.COMBINER_F90_INTEGER, MPI.COMBINER_F90_REAL,
                    MPI.COMBINER_F90_COMPLEX):
        return _make(_code(datatype))

    base, _, info = datatype.decode()

    if combiner == MPI.COMBINER_DUP:
        return to_numpy_dtype(base)

    if combiner == MPI.COMBINER_CONTIGUOUS:
        return _make((to_numpy_dtype(base), (info["count"],)))

    if combiner == MPI.COMBINER_SUBARRAY:
        sizes = list(info["sizes"])
        if list(info["subsizes"]) != sizes or any(info["starts"]):
            raise ValueError("cannot convert subarray MPI datatype to NumPy")
        if info["order"] == MPI.ORDER_FORTRAN:
            sizes.reverse()
        return _make((to_numpy_dtype(base), tuple(sizes)))

    if combiner == MPI.COMBINER_VALUE_INDEX:        # pragma: no cover
        return _make([("f0", to_numpy_dtype(info["value"])),
                      ("f1", to_numpy_dtype(info["index"]))], align=True)

    aligned = True
    itemsize = datatype.extent
    if combiner == MPI.COMBINER_RESIZED and base.combiner == MPI.COMBINER_STRUCT:
        aligned = _aligned(base, info["extent"])
        combiner = MPI.COMBINER_STRUCT
        _, _, info = base.decode()

    if combiner == MPI.COMBINER_STRUCT:
        members = info["datatypes"]
        offsets = info["displacements"]
        formats = [_block(to_numpy_dtype(member), count)
                   for member, count in zip(members, info["blocklengths"])]
        aligned = aligned and all(map(_aligned, members, offsets))
        return _fields(formats, offsets, itemsize, aligned)

    if combiner in (MPI.COMBINER_VECTOR, MPI.COMBINER_HVECTOR):
        count = info["count"]
        stride = info["stride"]
        if combiner == MPI.COMBINER_VECTOR:
            stride *= base.extent
            aligned = _aligned(base)
        else:
            stride = stride if count > 1 else 0
            aligned = _aligned(base, stride)
        formats = [(to_numpy_dtype(base), (info["blocklength"],))] * count
        return _fields(formats, [stride * i for i in range(count)], datatype.extent,
                       aligned)

    if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_HINDEXED,
                    MPI.COMBINER_INDEXED_BLOCK, MPI.COMBINER_HINDEXED_BLOCK):
        disps = info["displacements"]
        if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_HINDEXED):
            lengths = info["blocklengths"]
        else:
            lengths = [info["blocklength"]] * len(disps)
        aligned = _aligned(base)
        if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_INDEXED_BLOCK):
            offsets = [disp * base.extent for disp in disps]
        else:
            offsets = list(disps)
            aligned = aligned and all(_aligned(base, disp) for disp in disps)
        element = to_numpy_dtype(base)
        formats = [(element, (length,)) for length in lengths]
        return _fields(formats, offsets, None, aligned)

    raise ValueError(f"cannot convert MPI datatype {datatype} to NumPy")
