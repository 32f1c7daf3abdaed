"""pycomm.MPI datatypes and message specs, in one process (no world needed).

Predefined types against numpy and mpi4py's documented sizes, codes and names; derived
types (vector, hvector, indexed, hindexed, indexed_block, struct, subarray, resized,
contiguous) against MPI's extent rules and against a numpy reference of the bytes they
select (a hypothesis test draws random layouts); every mpi4py message-spec form and
buffer kind; the errors raised before any byte moves.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import pickle

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
    "LONG_DOUBLE": ("g", "g"), "C_BOOL": ("?", "?"), "INT8_T": ("i1", "i1"),
    "INT16_T": ("i2", "i2"), "INT32_T": ("i4", "i4"), "INT64_T": ("i8", "i8"),
    "UINT8_T": ("u1", "u1"), "UINT16_T": ("u2", "u2"), "UINT32_T": ("u4", "u4"),
    "UINT64_T": ("u8", "u8"), "C_FLOAT_COMPLEX": ("c8", "F"),
    "C_DOUBLE_COMPLEX": ("c16", "D"), "COMPLEX": ("c8", "F"),
    "DOUBLE_COMPLEX": ("c16", "D"), "BYTE": ("u1", "B"), "PACKED": ("u1", "B"),
    "CHAR": ("S1", "c"), "WCHAR": ("U1", "U"), "AINT": ("i8", "p"), "OFFSET": ("i8", "p"),
    "COUNT": ("i8", "p"),
}
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


def test_pack_unpack_roundtrip_and_pack_size():
    a = np.arange(20.0).reshape(4, 5)
    block = MPI.DOUBLE.Create_subarray([4, 5], [4, 2], [0, 1]).Commit()  # a[:, 1:3]
    size = block.Pack_size(1)
    assert size == 8 * 8
    out = bytearray(8 + 2 * size)
    pos = block.Pack(a, out, 8)                      # a holds exactly one item (extent)
    pos = MPI.INT.Pack(np.array([7, 9], np.int32), out, pos)
    assert pos == 8 + size + 8
    assert np.array_equal(np.frombuffer(out, np.float64, 8, 8), a[:, 1:3].ravel())
    b = np.zeros((4, 5))
    two = np.zeros(2, np.int32)
    end = block.Unpack(out, 8, b)
    end = MPI.INT.Unpack(out, end, two)
    assert end == pos and np.array_equal(b[:, 1:3], a[:, 1:3])
    assert not b[:, [0, 3, 4]].any() and two.tolist() == [7, 9]
    with pytest.raises(MPI.Exception, match="do not fit"):
        block.Pack(a, bytearray(10), 0)


def test_reduce_local_and_user_ops_get_mpi_datatypes():
    a, b = np.arange(4.0), np.ones(4)
    MPI.SUM.Reduce_local([a, MPI.DOUBLE], [b, MPI.DOUBLE])
    assert np.array_equal(b, np.arange(4.0) + 1)
    seen = []

    def mysum(inbuf, inoutbuf, datatype):
        seen.append(datatype)
        x = np.frombuffer(inbuf, dtype=datatype.tocode())
        y = np.frombuffer(inoutbuf, dtype=datatype.tocode())
        y += 2 * x
    op = MPI.Op.Create(mysum, commute=True)
    assert isinstance(op, MPI.Op) and isinstance(pycomm.SUM, MPI.Op)
    c = np.ones(3, np.int32)
    op.Reduce_local(np.arange(3, dtype=np.int32), c)
    assert np.array_equal(c, 1 + 2 * np.arange(3)) and seen == [MPI.INT]
    assert op.Is_commutative() and not MPI.Op.Create(mysum).Is_commutative()
    with pytest.raises(MPI.Exception):
        MPI.MAX.Reduce_local(np.zeros(2, np.complex128), np.zeros(2, np.complex128))


def test_op_handles_pickle_and_op_null():
    import pickle
    assert pickle.loads(pickle.dumps(MPI.MAX)) is MPI.MAX
    copy = MPI.Op(MPI.MAX)
    assert copy is not MPI.MAX and copy == MPI.MAX
    assert pickle.loads(pickle.dumps(copy)) == MPI.MAX
    user = MPI.Op.Create(np.add, commute=True)
    again = pickle.loads(pickle.dumps(user))
    assert again != user and again.Is_commutative()
    a, b = np.arange(3.0), np.ones(3)
    again.Reduce_local(a, b)
    assert np.array_equal(b, np.arange(3.0) + 1)
    assert MPI.Op() == MPI.OP_NULL and not MPI.OP_NULL and MPI.OP_NULL.is_predefined
    with pytest.raises(ValueError):
        MPI.OP_NULL(1, 2)


def test_vector_spec_int_counts_displs_and_bare_buffers():
    buf = np.arange(12, dtype=np.int16)
    m, counts, displs = vector_message([buf, (2, 4), MPI.SHORT], 3, "r", "recvbuf",
                                       writable=True)
    assert (counts, displs) == ([2, 2, 2], [0, 4, 8])          # mpi4py: (count, stride)
    m, counts, displs = vector_message([buf, 3], 3, "r", "recvbuf", writable=True)
    assert (counts, displs) == ([3, 3, 3], [0, 3, 6])
    m, counts, displs = vector_message(buf, 3, "r", "recvbuf", writable=True)
    assert (counts, displs) == ([4, 4, 4], [0, 4, 8]) and m.array.dtype == np.int16
    signed = array.array("b", [1, -2])                        # format "b": SIGNED_CHAR
    assert _send(signed).dtype == np.int8 and _send(bytearray(2)).dtype == np.uint8
    assert MPI.Get_address(buf) == buf.__array_interface__["data"][0]
    assert MPI.Aint_diff(MPI.Aint_add(100, 8), 100) == 8


def test_envelope_contents_decode_and_pickle_rebuild_derived_types():
    import pickle
    v = MPI.DOUBLE.Create_vector(3, 2, 4)
    assert v.Get_envelope() == (3, 0, 0, 1, MPI.COMBINER_VECTOR)
    assert v.Get_contents() == ([3, 2, 4], [], [], [MPI.DOUBLE])
    old, name, kw = v.decode()
    assert (old, name, kw) == (MPI.DOUBLE, "VECTOR",
                               {"count": 3, "blocklength": 2, "stride": 4})
    again = getattr(old, "Create_" + name.lower())(**kw)
    assert again.Get_extent() == v.Get_extent() and again.Get_size() == v.Get_size()
    s = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, MPI.DOUBLE])
    assert s.Get_contents() == ([2, 1, 2], [0, 8], [], [MPI.INT, MPI.DOUBLE])
    sub = MPI.INT.Create_subarray([4, 5], [2, 3], [1, 1]).Commit()
    assert sub.Get_envelope()[-1] == MPI.COMBINER_SUBARRAY
    back = pickle.loads(pickle.dumps(sub))
    assert back.decode()[1:] == sub.decode()[1:] and back.Get_extent() == (0, 80)
    a = np.arange(20, dtype=np.int32).reshape(4, 5)
    assert np.array_equal(_send([a, 1, back]), a[1:3, 1:4].ravel())
    assert MPI.DOUBLE.Get_envelope() == (0, 0, 0, 0, MPI.COMBINER_NAMED)
    assert MPI.DOUBLE.decode() == (MPI.DOUBLE, "NAMED", {})
    with pytest.raises(MPI.Exception, match="do not cover") as err:   # block 0
        MPI.INT.Create_darray(4, 0, [4], [MPI.DISTRIBUTE_BLOCK], [0], [4])
    assert err.value.Get_error_class() == MPI.ERR_ARG
    with pytest.raises(NotImplementedError, match="external32"):
        MPI.INT.Pack_external("external32", np.zeros(1, np.int32), bytearray(4), 0)


def test_mpi41_types_queries_and_handles():
    # MPI 4.1's fixed-size floats; numpy has no bfloat16
    for name, dt in (("FLOAT16_T", "f2"), ("FLOAT32_T", "f4"), ("FLOAT64_T", "f8")):
        t = getattr(MPI, name)
        assert t.to_numpy() == np.dtype(dt) and t.typestr == dt
        assert MPI.Datatype.fromcode(t.tocode()).typechar == t.typechar
    assert MPI.BFLOAT16_T == MPI.DATATYPE_NULL and MPI.LOGICAL16 == MPI.DATATYPE_NULL
    # a Dup keeps its basic type's typestr; pair types read as void
    assert MPI.CHAR.Dup().typestr == "S1" and MPI.INT_INT.typechar == "V"
    assert MPI.DATATYPE_NULL.typechar == ""
    assert MPI.Datatype.Match_size(MPI.TYPECLASS_REAL, 8) == MPI.REAL8
    assert MPI.Datatype.Match_size(MPI.TYPECLASS_LOGICAL, 1) == MPI.LOGICAL1
    with pytest.raises(MPI.Exception, match="no INTEGER type of 16 bytes"):
        MPI.Datatype.Match_size(MPI.TYPECLASS_INTEGER, 16)
    assert MPI.Datatype.Get_value_index(MPI.DOUBLE, MPI.INT) == MPI.DOUBLE_INT
    assert MPI.Datatype.Get_value_index(MPI.INT, MPI.INT) == MPI.INT_INT
    assert MPI.Datatype.Get_value_index(MPI.DOUBLE, MPI.FLOAT) == MPI.DATATYPE_NULL
    with pytest.raises(MPI.Exception) as err:
        MPI.Datatype.Get_value_index(MPI.DATATYPE_NULL, MPI.INT)
    assert err.value.Get_error_class() == MPI.ERR_TYPE
    # the named handle unpickles to itself, a copy of it to a new equal handle
    copy = pickle.loads(pickle.dumps(MPI.Datatype(MPI.INT)))
    assert pickle.loads(pickle.dumps(MPI.INT)) is MPI.INT
    assert copy == MPI.INT and copy is not MPI.INT
    # a freed old type stays readable through the types built on it (MPI refcounts)
    base = MPI.INT.Dup()
    vec = base.Create_vector(2, 1, 3)
    base.Free()
    old, combiner, kw = vec.decode()
    assert combiner == "VECTOR" and old.Create_vector(**kw).extent == vec.extent
    assert vec.Get_contents()[3][0].Get_size() == 4
    # a type of any size is made and queried; moving data with a type map too large to
    # hold is refused, ERR_TYPE, before any allocation
    huge = MPI.BYTE.Create_contiguous(2**29).Create_vector(2, 1, 2).Commit()
    assert huge.Get_size() == 2**30 and huge.Get_extent() == (0, 3 * 2**29)
    with pytest.raises(MPI.Exception, match="basic items") as err:
        message([np.zeros(8, np.uint8), 1, huge], "rank 0: Send", "buf", writable=False)
    assert err.value.Get_error_class() == MPI.ERR_TYPE
    huge.Free()


@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 5), st.integers(1, 3),
       st.integers(0, 2), st.booleans(), st.booleans())
@settings(max_examples=150, deadline=None)
def test_strided_specs_take_the_plan_and_match_the_general_path(nb, bl, gap, count, displ,
                                                               resized, pair_form):
    """``[array, (count, displ), vector]`` (the halo idiom) goes through a cached plan
    (msgspec._strided); it must select and write back exactly what the general path does,
    whose count and displacement we pass as numpy ints to force it."""
    from pycomm.MPI import msg
    stride = bl + gap
    vec = MPI.DOUBLE.Create_vector(nb, bl, stride)
    if resized:
        vec = vec.Create_resized(0, 8)
    vec.Commit()
    need = (displ + count - 1) * vec.extent + (nb - 1) * stride * 8 + bl * 8
    grid = np.arange(need // 8 + 3, dtype=np.float64)
    cd = (count, displ) if pair_form or displ else count
    general = (np.int64(count), np.int64(displ))
    fast = message([grid, cd, vec], "rank 0: Test", "buf", writable=False).array
    plan_used = any(k[0] == msg._PLAN for k in vec._cache)
    ref = message([grid, general, vec], "rank 0: Test", "buf", writable=False).array
    assert np.array_equal(fast, ref)
    runs = vec.gather_index(count, displ * vec.extent)[4]
    assert plan_used == (not vec._contig and runs is not None), \
        "equal runs at a constant stride should take the plan"
    # receive: the plan's unpack writes the selected elements and nothing else
    got = grid.copy()
    m = message([got, cd, vec], "rank 0: Test", "buf", writable=True)
    m.array[...] = -1 - np.arange(m.array.size)
    m.finish()
    want = grid.copy()
    r = message([want, general, vec], "rank 0: Test", "buf", writable=True)
    r.array[...] = -1 - np.arange(r.array.size)
    r.finish()
    assert np.array_equal(got, want)
    vec.Free()


def test_strided_plan_refuses_what_the_general_path_checks():
    col = MPI.DOUBLE.Create_vector(4, 1, 4).Commit()
    grid = np.zeros((4, 4))
    with pytest.raises(MPI.Exception):          # beyond the buffer: the general error
        message([grid, (2, 3), col], "rank 0: Test", "buf", writable=False)
    with pytest.raises(MPI.Exception):          # read-only buffer on the receive side
        ro = grid.copy()
        ro.flags.writeable = False
        message([ro, (1, 0), col], "rank 0: Test", "buf", writable=True)
    wrong = np.zeros((4, 8), np.float32)        # the datatype decides: float32 read as doubles
    assert message([wrong, (1, 0), col], "rank 0: Test", "buf",
                   writable=False).array.size == 4
    col.Free()
    with pytest.raises(MPI.Exception):          # freed after a plan was made
        message([grid, (1, 0), col], "rank 0: Test", "buf", writable=False)


def test_user_ops_are_limited_as_in_mpi4py_and_told_the_named_datatype():
    seen = []

    def bor(a, b, dt):
        seen.append(dt)
        np.frombuffer(b, np.uint8)[...] |= np.frombuffer(a, np.uint8)
    ops = [MPI.Op.Create(bor) for _ in range(32)]     # mpi4py's limit of live user ops
    with pytest.raises(RuntimeError, match="32"):
        MPI.Op.Create(bor)
    b1, b2 = bytearray([2] * 3), bytearray([4] * 3)
    ops[0].Reduce_local([b1, MPI.BYTE], [b2, MPI.BYTE])
    assert list(b2) == [6] * 3 and seen == [MPI.BYTE]
    ops[1].Reduce_local(np.ones(2, np.uint8), np.ones(2, np.uint8))    # no named type
    assert seen[-1] == MPI.UNSIGNED_CHAR
    ops.pop().Free()                                # a freed op gives its slot back
    ops.append(MPI.Op.Create(bor))
    ops.pop()                                       # so does a collected one
    import gc
    gc.collect()
    ops.append(MPI.Op.Create(bor))
    original = ops.pop()
    MPI.Op(original).Free()                         # freeing a copy frees the op's slot
    ops.append(MPI.Op.Create(bor))                  # (while the original is still alive)
    del original
    from pycomm.MPI.ops import with_datatype        # one bound copy per named datatype
    assert with_datatype(ops[0], MPI.BYTE) is with_datatype(ops[0], MPI.BYTE)
    for op in ops:
        op.Free()
    pycomm.Op.Create(lambda a, b: None)             # pycomm's own ops have no limit


def test_strided_plan_and_general_path_refuse_alike_and_plans_go_with_their_type():
    import gc
    import weakref
    # a displacement past the buffer: the general path's error on both paths
    t = MPI.DOUBLE.Create_indexed([1, 1], [-4, -2]).Commit()        # extent 24
    buf = np.arange(5.0)
    for cd in ((1, 2), (np.int64(1), np.int64(2))):
        with pytest.raises(MPI.Exception, match="beyond the buffer"):
            message([buf, cd, t], "rank 0: Test", "buf", writable=False)
    t.Free()
    # a plan lives in its datatype: freeing and dropping the type frees it
    v = MPI.DOUBLE.Create_vector(1000, 1, 2).Commit()
    message([np.zeros(2000), 1, v], "rank 0: Test", "buf", writable=False)
    gone = weakref.ref(v)
    v.Free()
    del v
    gc.collect()
    assert gone() is None


def test_receive_into_a_misaligned_homogeneous_type():
    """An hvector of doubles 12 bytes apart packs as bytes; its receive is unpacked in
    bytes too (it raised ValueError in finish())."""
    t = MPI.DOUBLE.Create_hvector(2, 1, 12).Commit()
    raw = np.zeros(32, np.uint8)
    m = message([raw, 1, t], "rank 0: Recv", "buf", writable=True)
    m.array[...] = [1.5, -2.25]
    m.finish()
    assert raw[:8].view(np.float64)[0] == 1.5 and raw[12:20].view(np.float64)[0] == -2.25
    assert (raw[8:12] == 0).all() and (raw[20:] == 0).all()
    t.Free()
