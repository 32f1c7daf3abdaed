"""pycomm.MPI datatypes and message specs, in one process (no world needed).

Predefined types against numpy and mpi4py's documented sizes, codes and names; derived
types (vector, hvector, indexed, hindexed, indexed_block, struct, subarray, resized,
contiguous) against MPI's extent rules and against a numpy reference of the bytes they
select (a hypothesis test draws random layouts); every mpi4py message-spec form and
buffer kind; the errors raised before any byte moves. Pack/Unpack, ops, envelopes, MPI 4.1
queries and the strided-spec plan: test_mpi_datatype_api.py.
"""

from __future__ import annotations

import array
import ctypes
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm
from pycomm import MPI
from pycomm.MPI.msgspec import message, vector_message
from pycomm.ops import DOUBLE_INT as PACKED_DOUBLE_INT
from pycomm.ops import MAXLOC, MINLOC

# name -> (numpy dtype, mpi4py's tocode()) on LP64 Linux
BASIC = {
    "SIGNED_CHAR": ("i1", "b"), "UNSIGNED_CHAR": ("u1", "B"), "SHORT": ("i2", "h"),
    "UNSIGNED_SHORT": ("u2", "H"), "INT": ("i4", "i"), "UNSIGNED": ("u4", "I"),
    "LONG": ("i8", "l"), "UNSIGNED_LONG": ("u8", "L"), "LONG_LONG": ("i8", "q"),
    "UNSIGNED_LONG_LONG": ("u8", "Q"), "FLOAT": ("f4", "f"), "DOUBLE": ("f8", "d"),
    "LONG_DOUBLE": ("g", "g"), "C_BOOL": ("?", "b1"), "INT8_T": ("i1", "i1"),
    "INT16_T": ("i2", "i2"), "INT32_T": ("i4", "i4"), "INT64_T": ("i8", "i8"),
    "UINT8_T": ("u1", "u1"), "UINT16_T": ("u2", "u2"), "UINT32_T": ("u4", "u4"),
    "UINT64_T": ("u8", "u8"), "C_FLOAT_COMPLEX": ("c8", "F"),
    "C_DOUBLE_COMPLEX": ("c16", "D"), "COMPLEX": ("c8", "F"),
    "DOUBLE_COMPLEX": ("c16", "D"), "BYTE": ("u1", "B"), "PACKED": ("u1", "B"),
    "CHAR": ("S1", "c"), "WCHAR": ("U1", "U"), "AINT": ("i8", "p"), "OFFSET": ("i8", "p"),
    "COUNT": ("i8", "p"),
}
# name -> (tocode(), typechar, typestr) as mpi4py 4.1.2 on MPICH 5.0.2 answers (LP64 Linux)
MPI4PY_CODES = {
    "SIGNED_CHAR": ("b", "b", "i1"), "UNSIGNED_CHAR": ("B", "B", "u1"),
    "SHORT": ("h", "h", "i2"), "INT": ("i", "i", "i4"), "LONG": ("l", "l", "i8"),
    "LONG_LONG": ("q", "q", "i8"), "FLOAT": ("f", "f", "f4"), "DOUBLE": ("d", "d", "f8"),
    "LONG_DOUBLE": ("g", "g", "f16"), "C_BOOL": ("b1", "?", "b1"),
    "CXX_BOOL": ("?", "?", "b1"), "INT8_T": ("i1", "b", "i1"),
    "INT16_T": ("i2", "h", "i2"), "INT32_T": ("i4", "i", "i4"),
    "INT64_T": ("i8", "l", "i8"), "UINT8_T": ("u1", "B", "u1"),
    "UINT16_T": ("u2", "H", "u2"), "UINT32_T": ("u4", "I", "u4"),
    "UINT64_T": ("u8", "L", "u8"), "FLOAT16_T": ("e", "e", "f2"),
    "C_FLOAT_COMPLEX": ("F", "F", "c8"), "C_DOUBLE_COMPLEX": ("D", "D", "c16"),
    "CHAR": ("c", "c", "S1"), "WCHAR": ("U", "U", "U1"), "BYTE": ("B", "B", "u1"),
    "AINT": ("p", "p", "i8"), "COUNT": ("p", "p", "i8"), "INTEGER": ("i", "i", "i4"),
    "REAL": ("f", "f", "f4"), "DOUBLE_PRECISION": ("d", "d", "f8"),
    "COMPLEX": ("F", "F", "c8"), "DOUBLE_COMPLEX": ("D", "D", "c16"),
    "LOGICAL": ("i", "i", "i4"), "INTEGER1": ("i1", "b", "i1"),
    "INTEGER2": ("i2", "h", "i2"), "INTEGER4": ("i4", "i", "i4"),
    "INTEGER8": ("i8", "l", "i8"), "REAL4": ("f4", "f", "f4"), "REAL8": ("f8", "d", "f8"),
    "COMPLEX8": ("c8", "F", "c8"), "COMPLEX16": ("c16", "D", "c16"),
}
# the keys of mpi4py 4.1.2's MPI._typedict, _typedict_c and _typedict_f on MPICH 5.0.2
# (MPICH has REAL16 and COMPLEX32 as 16-byte long double; pycomm has no such types)
MPI4PY_TYPEDICT = set("1s 1u 1w ? B D F G H I L M M8 N P Q S S1 U U1 Zd Zf Zg a b b1 c c16 "
                      "c32 c8 d e f f16 f2 f4 f8 g h i i1 i2 i4 i8 l m m8 n p q s u u1 u2 "
                      "u4 u8 w".split())
MPI4PY_TYPEDICT_C = set("? B D F G H I L Q b b1 c16 c32 c8 d f f16 f2 f4 f8 g h i i1 i2 i4 "
                        "i8 l q u1 u2 u4 u8".split())
MPI4PY_TYPEDICT_F = set("c c16 c32 c8 d i i1 i2 i4 i8 l r r16 r4 r8 s z".split())
# pair type -> (C struct of value and int, size without padding)
PAIRS = {"FLOAT_INT": (ctypes.c_float, 8), "DOUBLE_INT": (ctypes.c_double, 12),
         "LONG_INT": (ctypes.c_long, 12), "TWOINT": (ctypes.c_int, 8),
         "SHORT_INT": (ctypes.c_short, 6), "LONG_DOUBLE_INT": (ctypes.c_longdouble, 20)}


def _send(spec):
    return message(spec, "rank 0: Test", "buf", writable=False).array


@pytest.mark.parametrize("name", sorted(BASIC))
def test_predefined_matches_numpy(name):
    dt = getattr(MPI, name)
    np_dt, code = BASIC[name]
    assert dt.Get_size() == np.dtype(np_dt).itemsize
    assert dt.Get_extent() == (0, np.dtype(np_dt).itemsize)
    assert dt.Get_true_extent() == (0, np.dtype(np_dt).itemsize)
    assert dt.Get_name() == f"MPI_{name}"
    assert dt.tocode() == code
    assert dt.is_predefined and bool(dt)
    assert dt.Commit() is dt
    assert MPI.Datatype.fromcode(code).Get_size() == dt.Get_size()
    with pytest.raises(MPI.Exception):
        dt.Free()


@pytest.mark.parametrize("name", sorted(MPI4PY_CODES))
def test_codes_are_mpi4pys(name):
    # typechar is numpy's character for the type's size ("l" for INT64_T, not "i"):
    # mpi4py.util.sync makes its counters' arrays with it
    dt = getattr(MPI, name)
    code, char, typestr = MPI4PY_CODES[name]
    assert (dt.tocode(), dt.typechar, dt.typestr) == (code, char, typestr)
    assert (dt.Dup().tocode(), dt.Dup().typechar) == (code, char)
    assert MPI._typecode(dt) == code
    assert np.dtype(typestr).itemsize == dt.Get_size()
    if char not in "cU":            # (numpy's "c" and "U" are strings of any length)
        assert np.dtype(char).itemsize == dt.Get_size()


def test_typedicts_have_mpi4pys_keys():
    # the 16-byte real and complex are long double under MPICH; numpy has no quad type
    assert set(MPI._typedict) == MPI4PY_TYPEDICT
    assert set(MPI._typedict_c) == MPI4PY_TYPEDICT_C - {"f16", "c32"} | \
        {f"f{np.dtype('g').itemsize}", f"c{2 * np.dtype('g').itemsize}"}
    # mpi4py leaves out the Fortran kinds its MPI lacks; MPICH 5.0.2 lacks LOGICALn, REAL2
    assert set(MPI._typedict_f) == MPI4PY_TYPEDICT_F - {"r16", "c32"} | \
        {"l1", "l2", "l4", "l8", "r2"}
    for table in (MPI._typedict, MPI._typedict_c, MPI._typedict_f):
        for code, dt in table.items():
            assert isinstance(dt, MPI.Datatype) and dt != MPI.DATATYPE_NULL, code
    assert MPI._typedict["Zd"] == MPI.C_DOUBLE_COMPLEX and MPI._typedict["?"] == MPI.C_BOOL
    assert MPI._typedict_f["z"] == MPI.DOUBLE_COMPLEX
    assert MPI._typecode(MPI.DOUBLE_INT) is None
    assert MPI._typecode(MPI.INT.Create_contiguous(2)) is None


@pytest.mark.parametrize("value", [np.complex128(1 + 2j), np.complex64(3 - 1j),
                                   np.clongdouble(2 + 5j), np.float32(1.5), np.int16(-7)])
def test_a_numpy_scalar_is_one_item_of_its_type(value):
    # a numpy complex scalar's buffer has the PEP 3118 format "Zd" (or "Zf", "Zg"), which
    # mpi4py maps to C_DOUBLE_COMPLEX: pylops-mpi reduces np.vdot's result so
    mv = memoryview(value)
    arr = _send(value)
    assert arr.dtype == np.dtype(type(value)) and arr.shape == (1,), mv.format
    assert arr[0] == value
    assert _send([value, MPI._typedict[mv.format.lstrip("<>@=")]])[0] == value


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_pair_types_have_c_layout_and_reduce_with_maxloc(name):
    ctype, size = PAIRS[name]

    class Pair(ctypes.Structure):
        _fields_ = [("val", ctype), ("idx", ctypes.c_int)]
    dt = getattr(MPI, name)
    assert dt.Get_size() == size
    assert dt.Get_extent() == (0, ctypes.sizeof(Pair))
    wire = _send([np.zeros(2 * ctypes.sizeof(Pair), np.uint8), dt])
    assert wire.size == 2 and wire.dtype.itemsize == ctypes.sizeof(Pair)
    MAXLOC.check(wire.dtype)
    MINLOC.check(wire.dtype)


def test_pair_types_accept_pycomm_packed_pairs():
    buf = np.zeros(3, dtype=PACKED_DOUBLE_INT)          # 12-byte pairs, no padding
    buf["val"], buf["idx"] = [1.5, 2.5, 0.5], [0, 1, 2]
    wire = _send([buf, MPI.DOUBLE_INT])
    assert wire.dtype == PACKED_DOUBLE_INT and wire.size == 3
    assert np.shares_memory(wire, buf)


def test_names_codes_and_aliases():
    assert MPI.TWOINT is MPI.INT_INT and MPI.TWOINT.Get_name() == "MPI_2INT"
    assert MPI.Datatype.fromcode("d") is MPI.DOUBLE
    assert MPI.Datatype.fromcode("i4") is MPI.INT32_T
    assert MPI.Datatype.fromcode("F") is MPI.C_FLOAT_COMPLEX
    with pytest.raises(ValueError):
        MPI.Datatype.fromcode("not-a-code")
    with pytest.raises(ValueError):
        MPI.INT.Create_vector(2, 1, 2).tocode()
    assert MPI.DOUBLE.typestr == "f8" and MPI.C_BOOL.typestr == "b1"
    assert not MPI.DATATYPE_NULL and MPI.Datatype() == MPI.DATATYPE_NULL


def test_derived_extents_follow_mpi():
    d = MPI.DOUBLE
    assert d.Create_contiguous(5).Get_extent() == (0, 40)
    v = d.Create_vector(3, 2, 4)
    assert (v.Get_size(), v.Get_extent(), v.Get_true_extent()) == (48, (0, 80), (0, 80))
    hv = d.Create_hvector(2, 1, 20)
    assert (hv.Get_size(), hv.Get_extent()) == (16, (0, 28))
    ix = MPI.INT.Create_indexed([2, 1], [3, 0])
    assert (ix.Get_size(), ix.Get_extent(), ix.Get_true_extent()) == (12, (0, 20), (0, 20))
    ib = MPI.INT.Create_indexed_block(2, [1, 5])
    assert (ib.Get_size(), ib.Get_extent()) == (16, (4, 24))
    hb = MPI.INT.Create_hindexed_block(1, [8, 0])
    assert hb.Get_extent() == (0, 12)
    hi = MPI.SHORT.Create_hindexed([1, 2], [6, 0])
    assert hi.Get_extent() == (0, 8)
    s = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, MPI.DOUBLE])
    assert (s.Get_size(), s.Get_extent(), s.Get_true_extent()) == (20, (0, 24), (0, 24))
    sub = MPI.INT.Create_subarray([4, 5], [2, 3], [1, 1])
    assert (sub.Get_size(), sub.Get_extent(), sub.Get_true_extent()) == (24, (0, 80),
                                                                        (24, 32))
    r = MPI.INT.Create_resized(-4, 16)
    assert (r.Get_size(), r.Get_extent(), r.Get_true_extent()) == (4, (-4, 16), (0, 4))
    dup = v.Dup()
    assert dup.Get_extent() == v.Get_extent() and dup is not v
    empty = d.Create_contiguous(0)
    assert (empty.Get_size(), empty.Get_extent()) == (0, (0, 0))


def test_uncommitted_and_freed_types_are_refused():
    v = MPI.DOUBLE.Create_vector(2, 1, 2)
    with pytest.raises(MPI.Exception, match="not committed"):
        message([np.zeros(4), 1, v], "rank 0: Send", "buf", writable=False)
    v.Commit()
    v.Free()
    with pytest.raises(MPI.Exception, match="freed"):
        message([np.zeros(4), 1, v], "rank 0: Send", "buf", writable=False)


# -- packing against a numpy reference ------------------------------------------------------

def test_vector_packs_a_column_zero_copy_free_gather():
    a = np.arange(30.0).reshape(6, 5)
    col = MPI.DOUBLE.Create_vector(6, 1, 5).Commit()
    assert np.array_equal(_send([a, 1, col]), a[:, 0])
    m = message([a, (1, 3), MPI.DOUBLE.Create_vector(6, 1, 5).Create_resized(0, 8).Commit()],
                "rank 0: Recv", "buf", writable=True)
    assert np.array_equal(m.array, a[:, 3])
    m.array[:] = -1
    m.finish()
    assert (a[:, 3] == -1).all() and a[0, 2] == 2.0 and a[0, 4] == 4.0


def test_subarray_c_and_fortran_order():
    a = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    sub = MPI.INT.Create_subarray([3, 4, 5], [2, 2, 3], [1, 1, 2]).Commit()
    assert np.array_equal(_send([a, 1, sub]), a[1:3, 1:3, 2:5].ravel())
    f = np.asfortranarray(a)
    subf = MPI.INT.Create_subarray([3, 4, 5], [2, 2, 3], [1, 1, 2],
                                   order=MPI.ORDER_FORTRAN).Commit()
    assert np.array_equal(_send([f, 1, subf]), f[1:3, 1:3, 2:5].ravel(order="F"))


def test_struct_packs_bytes_of_each_field():
    rec = np.zeros(4, dtype=np.dtype([("a", "i4"), ("b", "f8", 2)], align=True))
    rec["a"], rec["b"] = np.arange(4), np.arange(8.0).reshape(4, 2)
    t = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, MPI.DOUBLE]).Commit()
    packed = _send([rec, t])
    assert packed.dtype == np.uint8 and packed.size == 4 * 20
    rows = packed.reshape(4, 20)
    assert np.array_equal(rows[:, :4].copy().view(np.int32).ravel(), rec["a"])
    assert np.array_equal(rows[:, 4:].copy().view(np.float64), rec["b"])


@st.composite
def layouts(draw):
    """A random derived type over int32 and a numpy function giving its elements."""
    kind = draw(st.sampled_from(["vector", "hvector", "indexed", "indexed_block",
                                 "subarray", "contiguous", "struct"]))
    if kind == "vector":
        c, b = draw(st.integers(0, 5)), draw(st.integers(1, 4))
        s = draw(st.integers(b, 8))
        idx = np.concatenate([np.arange(i * s, i * s + b) for i in range(c)] or [[]])
        return MPI.INT.Create_vector(c, b, s), idx.astype(int), max((c - 1) * s + b, 0)
    if kind == "hvector":
        c, b = draw(st.integers(0, 5)), draw(st.integers(1, 4))
        s = draw(st.integers(b, 8))
        idx = np.concatenate([np.arange(i * s, i * s + b) for i in range(c)] or [[]])
        return MPI.INT.Create_hvector(c, b, 4 * s), idx.astype(int), max((c - 1) * s + b, 0)
    if kind in ("indexed", "indexed_block"):
        n = draw(st.integers(1, 5))
        displs = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
        if kind == "indexed":
            blens = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
            dt = MPI.INT.Create_indexed(blens, displs)
        else:
            blens = [draw(st.integers(1, 3))] * n
            dt = MPI.INT.Create_indexed_block(blens[0], displs)
        idx = np.concatenate([np.arange(d, d + b) for b, d in zip(blens, displs)])
        used = [(d, d + b) for b, d in zip(blens, displs) if b]
        lo = min((u[0] for u in used), default=0)
        hi = max((u[1] for u in used), default=0)
        if not used:
            return dt, idx.astype(int), 0
        return dt.Create_resized(0, hi * 4) if lo >= 0 else dt, idx.astype(int), hi
    if kind == "subarray":
        nd = draw(st.integers(1, 3))
        sizes = draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd))
        subs = [draw(st.integers(0, s)) for s in sizes]
        starts = [draw(st.integers(0, s - b)) for s, b in zip(sizes, subs)]
        grid = np.arange(int(np.prod(sizes))).reshape(sizes)
        sl = tuple(slice(a, a + b) for a, b in zip(starts, subs))
        return (MPI.INT.Create_subarray(sizes, subs, starts), grid[sl].ravel(),
                int(np.prod(sizes)))
    if kind == "contiguous":
        n = draw(st.integers(0, 6))
        return MPI.INT.Create_contiguous(n), np.arange(n), n
    # struct of int32 blocks at int-aligned byte offsets
    n = draw(st.integers(1, 4))
    blens = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    displs = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    dt = MPI.Datatype.Create_struct(blens, [4 * d for d in displs], [MPI.INT] * n)
    idx = np.concatenate([np.arange(d, d + b) for b, d in zip(blens, displs)])
    hi = max(d + b for b, d in zip(blens, displs))
    return dt.Create_resized(0, 4 * hi), idx, hi


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(0, 3))
def test_random_layouts_pack_and_unpack_like_numpy(layout, count):
    dt, idx, extent_items = layout
    dt.Commit()
    assert dt.Get_size() == 4 * idx.size
    n_items = max(extent_items * count, int(idx.max(initial=-1)) + 1 +
                  extent_items * max(count - 1, 0))
    buf = np.arange(n_items + 3, dtype=np.int32) * 7 + 1
    ref = np.concatenate([buf[idx + i * extent_items] for i in range(count)] or
                         [np.empty(0, np.int32)])
    packed = _send([buf, count, dt])
    assert packed.dtype == np.int32
    assert np.array_equal(packed, ref)
    # unpack: write a new pattern through the datatype; only selected elements change
    before = buf.copy()
    m = message([buf, count, dt], "rank 0: Recv", "buf", writable=True)
    m.array[:] = -np.arange(m.array.size, dtype=np.int32) - 1
    m.finish()
    touched = np.zeros(buf.size, bool)
    for i in range(count):
        touched[idx + i * extent_items] = True
    assert np.array_equal(buf[~touched], before[~touched])
    if idx.size and len(set(idx.tolist())) == idx.size and extent_items >= idx.max() + 1:
        assert np.array_equal(np.concatenate(
            [buf[idx + i * extent_items] for i in range(count)] or
            [np.empty(0, np.int32)]), m.array)


# -- message specs and buffers ----------------------------------------------------------

def test_datatype_decides_how_bytes_are_read():
    c = np.arange(4, dtype=np.complex64) * (1 + 2j)
    f = _send([c, MPI.FLOAT])
    assert f.dtype == np.float32 and np.array_equal(f, c.view(np.float32))
    assert np.shares_memory(f, c)
    assert np.array_equal(_send([c, 3, MPI.FLOAT]), c.view(np.float32)[:3])
    assert np.array_equal(_send([c, (2, 3), MPI.FLOAT]), c.view(np.float32)[3:5])
    assert np.array_equal(_send([c, 2, 1, "f"]), c.view(np.float32)[1:3])
    assert np.array_equal(_send([c, np.float32]), c.view(np.float32))
    assert np.array_equal(_send([c, 2]), c[:2])


@pytest.mark.parametrize("kind", ["ndarray2d", "ndarray0d", "fortran", "bytes", "bytearray",
                                  "memoryview", "array", "mmap", "array_interface"])
def test_buffer_kinds(kind):
    data = np.arange(6, dtype=np.float64)
    if kind == "ndarray2d":
        buf = data.reshape(2, 3)
    elif kind == "ndarray0d":
        buf, data = np.array(5.0), np.array([5.0])
    elif kind == "fortran":
        buf = np.asfortranarray(data.reshape(2, 3))
        data = buf.ravel(order="F")
    elif kind == "bytes":
        buf = data.tobytes()
    elif kind == "bytearray":
        buf = bytearray(data.tobytes())
    elif kind == "memoryview":
        buf = memoryview(data)
    elif kind == "array":
        buf = array.array("d", data.tolist())
    elif kind == "mmap":
        buf = mmap.mmap(-1, data.nbytes)
        buf.write(data.tobytes())
    else:
        class Wrapped:
            __array_interface__ = data.__array_interface__
        buf = Wrapped()
    assert np.array_equal(_send([buf, MPI.DOUBLE]), data)
    if kind in ("bytes", "bytearray", "mmap"):
        assert _send(buf).dtype == np.uint8         # no datatype: bytes (MPI.BYTE)
    else:
        assert np.array_equal(_send(buf), data)     # no datatype: the buffer's own type


def test_none_and_bottom_are_empty_messages():
    assert _send(None).size == 0
    assert _send([None, MPI.INT]).size == 0
    assert _send([MPI.BOTTOM, 0, MPI.INT]).size == 0


def test_vector_spec_forms():
    buf = np.arange(10.0)
    for spec in ([buf, [1, 2, 3], [0, 3, 6], MPI.DOUBLE], [buf, ([1, 2, 3], [0, 3, 6])],
                 [buf, ([1, 2, 3], [0, 3, 6]), MPI.DOUBLE], [buf, [1, 2, 3], [0, 3, 6]]):
        m, counts, displs = vector_message(spec, 3, "rank 0: Gatherv", "recvbuf",
                                           writable=True)
        assert (counts, displs) == ([1, 2, 3], [0, 3, 6])
        assert np.shares_memory(m.array, buf)
    m, counts, displs = vector_message([buf, [2, 2, 1]], 3, "r", "recvbuf", writable=True)
    assert displs == [0, 2, 4]
    m, counts, displs = vector_message([buf, 3, MPI.DOUBLE], 3, "r", "recvbuf",
                                       writable=True)
    assert (counts, displs) == ([3, 3, 3], [0, 3, 6])
    c = np.arange(6, dtype=np.complex128)
    m, counts, displs = vector_message([c, [2, 2, 2], [0, 4, 8], MPI.DOUBLE], 3, "r", "s",
                                       writable=False)
    assert np.array_equal(m.array[displs[1]:displs[1] + 2], c.view(np.float64)[4:6])


def test_integral_floats_are_accepted_and_others_refused():
    buf = np.arange(4.0)
    assert _send([buf, 2.0, MPI.DOUBLE]).size == 2
    with pytest.raises(TypeError, match="count=1.5"):
        _send([buf, 1.5, MPI.DOUBLE])


def test_bad_buffers_raise_before_anything_moves():
    with pytest.raises(MPI.Exception, match="rank 0: Test: buf: 5 x MPI_DOUBLE") as info:
        _send([np.zeros(3), 5, MPI.DOUBLE])
    assert isinstance(info.value, pycomm.InvalidBufferError)
    with pytest.raises(MPI.Exception, match="read-only"):
        message(b"abcd", "rank 0: Recv", "buf", writable=True)
    with pytest.raises(MPI.Exception, match="not contiguous"):
        _send(np.zeros((4, 4))[:, 1])
    with pytest.raises(MPI.Exception, match="whole number"):
        _send([np.zeros(3, np.uint8), MPI.INT])
    with pytest.raises(TypeError, match="not a datatype"):
        _send([np.zeros(3), 1, object()])
