"""pycomm.MPI datatypes in one process (no world needed), beyond test_mpi_datatype.py: Pack
and Unpack, Reduce_local and user ops (mpi4py's limit of live user ops, the named datatype
they are told), Op handles and their pickling, vector specs with integer counts and bare
buffers, envelopes, contents, decode and pickled derived types, MPI 4.1's types and
queries, ``MPI._typealign``, and the cached plan of strided specs against the general path.
"""

from __future__ import annotations

import array
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm
from pycomm import MPI
from pycomm.MPI.msgspec import message, vector_message
from test_mpi_datatype import _send


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
    # external32: tests/test_mpi_external32.py
    assert MPI.INT.Pack_external("external32", np.ones(1, np.int32), buf := bytearray(4),
                                 0) == 4 and buf.hex() == "00000001"


# MPI._typealign as mpi4py 4.1.2 on MPICH 5.0.2 (x86-64) answers it
_ALIGNMENTS = {
    "SHORT_INT": 4, "TWOINT": 4, "LONG_INT": 8, "FLOAT_INT": 4, "DOUBLE_INT": 8,
    "LONG_DOUBLE_INT": 16, "C_BOOL": 1, "CHAR": 1, "SHORT": 2, "INT": 4, "LONG": 8,
    "FLOAT": 4, "DOUBLE": 8, "LONG_DOUBLE": 16, "C_FLOAT_COMPLEX": 4, "C_DOUBLE_COMPLEX": 8,
    "C_LONG_DOUBLE_COMPLEX": 16, "BYTE": 1, "PACKED": 1, "AINT": 8, "OFFSET": 8, "COUNT": 8,
    "WCHAR": 4, "INT8_T": 1, "UINT64_T": 8, "DATATYPE_NULL": None}


def test_typealign_answers_as_mpi4py_on_mpich():
    assert {name: MPI._typealign(getattr(MPI, name)) for name in _ALIGNMENTS} == _ALIGNMENTS
    # derived types have none, except a Dup of a basic type; F90 REAL(6, 30) is REAL4
    assert MPI._typealign(MPI.INT.Create_contiguous(2)) is None
    assert MPI._typealign(MPI.Datatype.Create_struct([1], [0], [MPI.DOUBLE])) is None
    assert MPI._typealign(MPI.DOUBLE.Create_resized(0, 16)) is None
    assert MPI._typealign(MPI.DOUBLE_INT.Dup()) is None
    assert MPI._typealign(MPI.DOUBLE.Dup().Dup()) == 8
    assert MPI._typealign(MPI.Datatype.Create_f90_real(6, 30)) == 4


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
    # mpi4py's limit of live user ops, counting those other tests of this process left
    # alive (gc.collect: an op in a reference cycle holds its slot until collected)
    import gc
    from pycomm.MPI import ops as mpi_ops
    gc.collect()
    live = sum(1 for ref in mpi_ops._user_slots if ref is not None and ref() is not None)
    ops = [MPI.Op.Create(bor) for _ in range(32 - live)]
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


def _keywords_of_every_kind(a, b=2, /, c=3, *rest, d, e=5, **more):
    return a


@pytest.mark.parametrize("method,args,kwargs", [
    (_keywords_of_every_kind, (1,), {"d": 4}),
    (_keywords_of_every_kind, (1, 7, 8, 9, 10), {"d": 4, "e": 6, "z": 0}),
    (_keywords_of_every_kind, (1,), {"c": 0, "d": 4}),
    (MPI.Datatype.Create_subarray, (MPI.INT, [4], [2], [1]), {}),
    (MPI.Datatype.Create_subarray, (MPI.INT, [4], [2], [1]), {"order": MPI.ORDER_FORTRAN}),
    (MPI.Datatype.Create_struct.__func__, (MPI.Datatype, [1], [0]), {"datatypes": [MPI.INT]}),
])
def test_a_constructors_arguments_are_recorded_as_inspect_binds_them(method, args, kwargs):
    """decode.py records each constructor call's arguments by name with a binder made from
    the signature: the same as ``inspect.signature(...).bind`` with defaults applied."""
    import inspect
    from pycomm.MPI.decode import _binder
    bound = inspect.signature(method).bind(*args, **kwargs)
    bound.apply_defaults()
    assert _binder(method)(*args, **kwargs) == dict(bound.arguments)


def test_decoding_a_type_whose_members_were_freed():
    """mpi4py.util.dtlib frees a struct's members once it is made, then decodes it: the
    members come back usable, the same copy while it is not freed, a new one after."""
    member = MPI.DOUBLE.Create_contiguous(2)
    s = MPI.Datatype.Create_struct([1], [0], [member])
    member.Free()
    got = s.decode()[2]["datatypes"][0]
    assert not got.is_predefined and got.Get_size() == 16 and got.decode()[1] == "CONTIGUOUS"
    assert s.decode()[2]["datatypes"][0] is got
    got.Free()
    again = s.decode()[2]["datatypes"][0]
    assert again is not got and again.Get_size() == 16
    assert s.Get_contents()[3][0].Get_size() == 16      # (a new handle, as MPI's)
    assert member.combiner == MPI.COMBINER_CONTIGUOUS and s.combiner == MPI.COMBINER_STRUCT


@given(starts=st.lists(st.integers(-50, 50), min_size=1, max_size=12),
       lens=st.lists(st.integers(0, 4), min_size=12, max_size=12),
       step=st.integers(-8, 8), outer=st.lists(st.tuples(st.integers(1, 3),
                                                         st.integers(-20, 20)), max_size=2))
@settings(max_examples=200, deadline=None)
def test_offsets_bounds_of_a_few_blocks_agree_with_numpys(starts, lens, step, outer):
    """Offsets.bounds measures parts of a few blocks with Python's ints, larger ones with
    numpy: both give the flattened offsets' smallest and largest."""
    from pycomm.MPI import typemap
    lens = lens[:len(starts)]
    if not any(lens):
        lens[0] = 1
    offs = typemap.Offsets(starts, lens, step, outer)
    flat = offs.flatten()
    assert offs.bounds() == (int(flat.min()), int(flat.max()))
    few, typemap._FEW = typemap._FEW, 0         # (the numpy way for every size)
    try:
        assert offs.bounds() == (int(flat.min()), int(flat.max()))
    finally:
        typemap._FEW = few
