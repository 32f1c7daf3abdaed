"""pycomm.ops on plain numpy arrays: logical, bitwise and MAXLOC/MINLOC ops, dtype checks."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycomm import ops
from pycomm.errors import ArgumentError

LOGICAL = [(ops.LAND, np.logical_and), (ops.LOR, np.logical_or), (ops.LXOR, np.logical_xor)]
BITWISE = [(ops.BAND, np.bitwise_and), (ops.BOR, np.bitwise_or), (ops.BXOR, np.bitwise_xor)]
PAIRS = [ops.DOUBLE_INT, ops.FLOAT_INT, ops.LONG_INT, ops.INT_INT, ops.SHORT_INT,
         ops.pair_dtype(np.uint16, np.int64)]


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int32, np.uint64, np.float32,
                                   np.float64])
@pytest.mark.parametrize("op,ref", LOGICAL, ids=lambda x: getattr(x, "name", ""))
def test_logical_ops_give_0_or_1_in_the_input_dtype(op, ref, dtype):
    a = np.array([0, 0, 3, 1, 0, 2], dtype=dtype)
    b = np.array([0, 5, 0, 1, 1, 0], dtype=dtype)
    op.check(dtype)
    inout = b.copy()
    op.apply(a, inout)
    assert inout.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(inout, ref(a, b).astype(dtype))
    assert set(np.unique(inout.astype(np.float64))) <= {0.0, 1.0}
    left, scratch = a.copy(), b.copy()
    op.apply_left(left, scratch)
    np.testing.assert_array_equal(left, ref(a, b).astype(dtype))


def test_logical_ops_on_floats_treat_nan_and_negatives_as_true():
    a = np.array([np.nan, -0.5, 0.0, -0.0])
    b = np.array([1.0, 1.0, 1.0, 1.0])
    inout = b.copy()
    ops.LAND.apply(a, inout)
    np.testing.assert_array_equal(inout, [1.0, 1.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16, np.int64, np.uint64])
@pytest.mark.parametrize("op,ref", BITWISE, ids=lambda x: getattr(x, "name", ""))
def test_bitwise_ops(op, ref, dtype):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    hi = 2 if info is None else int(min(info.max, 1 << 62))
    a = rng.integers(0, hi, 50).astype(dtype)
    b = rng.integers(0, hi, 50).astype(dtype)
    inout = b.copy()
    op.apply(a, inout)
    np.testing.assert_array_equal(inout, ref(a, b))
    assert inout.dtype == np.dtype(dtype)


@pytest.mark.parametrize("op", [ops.BAND, ops.BOR, ops.BXOR])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_bitwise_ops_reject_floats(op, dtype):
    with pytest.raises(ArgumentError, match=f"{op.name}.*accepts boolean, signed integer"):
        op.check(dtype)


def test_check_rules():
    for op in (ops.LAND, ops.LOR, ops.LXOR):
        with pytest.raises(ArgumentError, match="complex"):
            op.check(np.complex128)
    for op in (ops.SUM, ops.PROD, ops.MIN, ops.MAX, ops.LAND, ops.BAND):
        with pytest.raises(ArgumentError, match="structured"):
            op.check(ops.DOUBLE_INT)
    for dt in PAIRS + [np.dtype([("v", "f8"), ("i", "u4")], align=True)]:
        ops.MAXLOC.check(dt)
        ops.MINLOC.check(dt)
    for bad in (np.float64, np.dtype([("v", "f8")]), np.dtype([("v", "f8"), ("i", "f8")]),
                np.dtype([("v", "c16"), ("i", "i4")]),
                np.dtype([("v", "f8"), ("i", "i4"), ("j", "i4")]),
                np.dtype([("v", "f8", (2,)), ("i", "i4")])):
        with pytest.raises(ArgumentError, match="value/index pair"):
            ops.MAXLOC.check(bad)
    ops.Op.Create(lambda a, b: None).check(ops.DOUBLE_INT)  # user ops take any dtype


def test_predefined_flags():
    for op in (ops.SUM, ops.LAND, ops.BXOR, ops.MAXLOC, ops.MINLOC):
        assert op.is_predefined and op.commutative
    assert not ops.Op.Create(lambda a, b: None).is_predefined


def test_pair_dtypes_match_mpi4py_layout_names():
    assert ops.DOUBLE_INT.names == ("val", "idx")
    assert ops.DOUBLE_INT["val"] == np.float64 and ops.DOUBLE_INT["idx"] == np.int32
    assert ops.FLOAT_INT["val"] == np.float32 and ops.LONG_INT["val"] == np.int64
    assert ops.INT_INT["val"] == np.int32 and ops.TWOINT == ops.INT_INT
    assert ops.DOUBLE_INT.itemsize == 12  # packed: no padding bytes to differ between ranks


def pairs(dtype, vals, idxs) -> np.ndarray:
    out = np.empty(len(vals), dtype=dtype)
    out[out.dtype.names[0]] = vals
    out[out.dtype.names[1]] = idxs
    return out


@pytest.mark.parametrize("dtype", PAIRS, ids=str)
def test_maxloc_minloc_ties_lowest_index(dtype):
    a = pairs(dtype, [1, 5, 2, 7, 3], [4, 9, 0, 2, 6])
    b = pairs(dtype, [1, 3, 2, 7, 4], [2, 1, 8, 3, 6])
    inout = b.copy()
    ops.MAXLOC.apply(a, inout)
    np.testing.assert_array_equal(inout, pairs(dtype, [1, 5, 2, 7, 4], [2, 9, 0, 2, 6]))
    inout = b.copy()
    ops.MINLOC.apply(a, inout)
    np.testing.assert_array_equal(inout, pairs(dtype, [1, 3, 2, 7, 3], [2, 1, 0, 2, 6]))
    left, scratch = a.copy(), b.copy()
    ops.MAXLOC.apply_left(left, scratch)
    np.testing.assert_array_equal(left, pairs(dtype, [1, 5, 2, 7, 4], [2, 9, 0, 2, 6]))
    np.testing.assert_array_equal(a, pairs(dtype, [1, 5, 2, 7, 3], [4, 9, 0, 2, 6]))


@settings(max_examples=100, deadline=None)
@given(vals=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 50)), min_size=2,
                     max_size=8), op=st.sampled_from([ops.MAXLOC, ops.MINLOC]))
def test_loc_ops_are_order_free(vals, op):
    """Any association and order gives the same pair (the op is commutative)."""
    arrays = [pairs(ops.DOUBLE_INT, [v], [i]) for v, i in vals]
    forward = arrays[0].copy()
    for x in arrays[1:]:
        op.apply(x, forward)
    backward = arrays[-1].copy()
    for x in arrays[-2::-1]:
        op.apply(x, backward)
    best = (max if op is ops.MAXLOC else min)(v for v, _ in vals)
    expected = min(i for v, i in vals if v == best)
    assert forward.tobytes() == backward.tobytes()
    assert forward["val"][0] == best and forward["idx"][0] == expected
    objs = [(float(v), i) for v, i in vals]
    assert functools.reduce(op, objs) == functools.reduce(op, objs[::-1]) == (best, expected)


def test_reduce_objects_follow_mpi4py():
    assert ops.LAND(3, 5) == 5 and ops.LAND(0, 5) == 0
    assert ops.LOR(0, 4) == 4 and ops.LXOR(0, 3) is True and ops.LXOR(2, 3) is False
    assert ops.BAND(6, 3) == 2 and ops.BOR(6, 3) == 7 and ops.BXOR(6, 3) == 5
    assert ops.MAXLOC((2.0, 5), (2.0, 3)) == (2.0, 3)
    assert ops.MAXLOC((2.0, 1), (2.0, 3)) == (2.0, 1)
    assert ops.MINLOC((1.0, 7), (2.0, 3)) == (1.0, 7)
    np.testing.assert_array_equal(ops.LOR(np.array([0, 1]), np.array([0, 0])), [False, True])


def test_op_check_dtypes():
    for op in (ops.SUM, ops.PROD, ops.MIN, ops.MAX):
        for dt in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16):
            op.check(dt)
    ops.SUM.check(np.complex128)
    for op in (ops.MIN, ops.MAX):
        with pytest.raises(ArgumentError, match="complex"):
            op.check(np.complex64)
    with pytest.raises(ArgumentError, match="SUM.*bool"):
        ops.SUM.check(np.bool_)
    with pytest.raises(ArgumentError):
        ops.PROD.check(np.dtype("U3"))
    ops.Op.Create(lambda a, b: None).check(np.dtype([("a", "u8"), ("b", "u8")]))  # any dtype


def test_op_apply_order_and_objects():
    a, b = np.array([1.0, 5.0]), np.array([3.0, 2.0])
    inout = b.copy()
    ops.MIN.apply(a, inout)
    np.testing.assert_array_equal(inout, [1.0, 2.0])
    sub = ops.Op.Create(lambda x, y: x - y)           # 2-argument, returns the result
    sub3 = ops.Op.Create(lambda x, y, dt: np.subtract(x, y, out=y))
    for op in (sub, sub3):
        assert not op.commutative and not op.Is_commutative()
        inout = b.copy()
        op.apply(a, inout)                              # inout = a - b
        np.testing.assert_array_equal(inout, a - b)
        left, scratch = a.copy(), b.copy()
        op.apply_left(left, scratch)                    # left = a - b
        np.testing.assert_array_equal(left, a - b)
    assert ops.SUM.reduce_objects("ab", "cd") == "abcd"
    assert ops.PROD(3, 4) == 12
    assert ops.MIN.reduce_objects(3, 2) == 2 and ops.MAX.reduce_objects(3, 2) == 3
    np.testing.assert_array_equal(ops.MAX.reduce_objects(a, b), [3.0, 5.0])
    assert sub.reduce_objects(10, 3) == 7
    assert ops.Op.Create(lambda x, y: None, commute=True).commutative
    with pytest.raises(ArgumentError):
        ops.Op.Create(lambda x: x)
    with pytest.raises(ArgumentError):
        ops.Op.Create(42)
