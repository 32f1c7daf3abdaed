"""Every registered (collective, algorithm) against a numpy reference, on fake ranks.

Ranks are threads (tests/fakecomm.py) with strict, synchronous sends, so schedules that
deadlock, mismatch sizes, touch send buffers early or leave messages behind fail here.
Matrix: sizes 1..9, every root, counts 0, 1, 2, 7 (odd), 13 (> size, and more than one
segment: every ``PYCOMM_*SEGMENT_BYTES`` is forced to 24 bytes here); reductions run every
algorithm over a representative list of (dtype, op) pairs that covers each dtype and each
op, and hypothesis draws from the full dtype × op product; data movement uses
float32/int64. Plus a non-commutative user op through every algorithm that accepts one,
hypothesis runs over random floats for bit-identical results, and the selection rules.
Inputs are small integers so every summation order gives the exact reference. The
innermost parameter of the large matrices (the (dtype, op) pair, the dtype, the count)
is a loop inside the test (fakecomm.each_case: every value checked, failures named). The
v-variants, reduce_scatter with counts, scan and exscan are in test_algorithms_vscan.py;
the messages each schedule sends in test_wire_counts.py.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm.collectives as algs
import pycomm.collectives.scratch as scratch
from pycomm import ops
from pycomm.errors import ArgumentError
from fakecomm import FakeCommError, each_case, run_fake  # tests/ is on sys.path (pytest)

SIZES = list(range(1, 10))
COUNTS = [0, 1, 2, 7, 13]
DTYPES = [np.float32, np.float64, np.int32, np.int64]
OPS = [ops.SUM, ops.PROD, ops.MIN, ops.MAX]
ALL_OPS = OPS + [ops.LAND, ops.LOR, ops.LXOR, ops.BAND, ops.BOR, ops.BXOR]
# Every dtype and every op at least once; the whole product runs under hypothesis below.
REDUCTIONS = [(np.float32, ops.SUM), (np.float64, ops.PROD), (np.int32, ops.MIN),
              (np.int64, ops.MAX), (np.int32, ops.BXOR), (np.float64, ops.LAND),
              (np.bool_, ops.LXOR)]
# Data movement never looks at values: one 4-byte and one 8-byte dtype cover it.
MOVE_DTYPES = [np.float32, np.int64]
SEGMENT_BYTES = 24  # 3 to 6 elements: counts 7 and 13 take several segments


@pytest.fixture(autouse=True, scope="module")
def _small_segments():
    """Force the multi-segment paths of the pipelined schedules, and scratch of every size
    through the shared pool that the fake ranks (threads) take turns on (module-wide)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYCOMM_SEGMENT_BYTES", str(SEGMENT_BYTES))
        mp.setenv("PYCOMM_RING_SEGMENT_BYTES", str(SEGMENT_BYTES))
        mp.setenv("PYCOMM_HALVING_SEGMENT_BYTES", str(SEGMENT_BYTES))
        mp.setenv("PYCOMM_SCRATCH_KEEP_BYTES", str(4 << 20))
        mp.setattr(scratch, "POOL_MIN_BYTES", 0)
        yield
        scratch.POOL.clear()


def reduction_id(case) -> str:
    return f"{np.dtype(case[0]).name}-{case[1].name}"


def contributions(size: int, n: int, dtype, op=None, seed: int = 0) -> list[np.ndarray]:
    """Per-rank inputs: small integers (exact under any order; products stay small)."""
    rng = np.random.default_rng(seed * 7919 + size * 131 + n)
    lo, hi = (-2, 3) if op is ops.PROD else (-8, 9)
    return [rng.integers(lo, hi, n).astype(dtype) for _ in range(size)]


def fold(op, xs: list[np.ndarray]) -> np.ndarray:
    """Return the reference x_0 ∘ x_1 ∘ ... folded in rank order."""
    return functools.reduce(op.reduce_objects, [x.copy() for x in xs])


def assert_same_bytes(results: list[np.ndarray]) -> None:
    first = results[0].tobytes()
    for rank, res in enumerate(results):
        assert res.tobytes() == first, f"rank {rank} differs from rank 0 bitwise"


def algorithm_cases(collective: str):
    return [pytest.param(name, id=name) for name in algs.algorithms(collective)]


def usable(collective: str, name: str, size: int, commutative: bool = True) -> bool:
    return algs.REGISTRY[collective][name].unfit_reason(size, commutative) is None


# -- reductions -----------------------------------------------------------------------------
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("allreduce"))
def test_allreduce(name, size, count):
    fn = algs.REGISTRY["allreduce"][name].fn

    def check(case):
        dtype, op = case
        xs = contributions(size, count, dtype, op)
        expected = fold(op, xs)

        def body(cc):
            buf = xs[cc.rank].copy()
            fn(cc, buf, op)
            return buf

        results = run_fake(size, body)
        for res in results:
            np.testing.assert_array_equal(res, expected)
            assert res.dtype == np.dtype(dtype)
        assert_same_bytes(results)

    each_case(REDUCTIONS, check, reduction_id)


@pytest.mark.parametrize("size", (2, 3, 5, 8))
@pytest.mark.parametrize("name", algorithm_cases("allreduce"))
@pytest.mark.parametrize("dtype,op", [(np.int8, ops.SUM), (np.uint16, ops.SUM),
                                      (np.int32, ops.PROD)], ids=["int8-SUM", "uint16-SUM",
                                                                  "int32-PROD"])
def test_allreduce_integer_overflow_wraps_like_numpy(name, size, dtype, op):
    """Sums and products past the dtype's range wrap modulo 2**bits, as numpy's do, and
    every rank ends with the same bytes."""
    info = np.iinfo(dtype)
    base = info.max - 3 if op is ops.SUM else 1 << 20
    xs = [np.array([base, info.max, info.min + r, r], dtype=dtype) for r in range(size)]
    fn = algs.REGISTRY["allreduce"][name].fn
    with np.errstate(over="ignore"):
        expected = fold(op, xs)
        results = run_fake(size, lambda cc: (fn(cc, b := xs[cc.rank].copy(), op), b)[1])
    wide = [x.astype(object) for x in xs]      # exact integers, then wrapped by hand
    exact = functools.reduce((lambda a, b: a + b) if op is ops.SUM else (lambda a, b: a * b),
                             wide)
    bits = 8 * np.dtype(dtype).itemsize
    wrapped = [((int(v) - info.min) % (1 << bits)) + info.min for v in exact]
    assert expected.tolist() == wrapped          # the reference itself wraps
    assert any(int(v) != w for v, w in zip(exact, wrapped, strict=True))  # and overflowed
    for res in results:
        np.testing.assert_array_equal(res, expected)
    assert_same_bytes(results)


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(algs.algorithms("allreduce")), size=st.integers(1, 9),
       count=st.integers(0, 20), dtype=st.sampled_from(DTYPES + [np.uint8, np.bool_]),
       op=st.sampled_from(ALL_OPS), seed=st.integers(0, 1000))
def test_allreduce_any_dtype_op(name, size, count, dtype, op, seed):
    try:
        op.check(dtype)
    except ArgumentError:
        return  # e.g. BAND on floats: the communicator rejects it before any byte moves
    xs = contributions(size, count, dtype, op, seed)
    fn = algs.REGISTRY["allreduce"][name].fn
    with np.errstate(over="ignore"):
        expected = fold(op, xs)
        results = run_fake(size, lambda cc: (fn(cc, b := xs[cc.rank].copy(), op), b)[1])
    for res in results:
        np.testing.assert_array_equal(res, expected)
        assert res.dtype == np.dtype(dtype)
    assert_same_bytes(results)


@pytest.mark.parametrize("count", [0, 1, 7, 13])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("reduce"))
def test_reduce(name, size, count):
    fn = algs.REGISTRY["reduce"][name].fn

    def check(case):
        dtype, op = case
        xs = contributions(size, count, dtype, op)
        expected = fold(op, xs)
        for root in range(size):
            def body(cc):
                buf = xs[cc.rank].copy()
                fn(cc, buf, root, op)
                return buf

            np.testing.assert_array_equal(run_fake(size, body)[root], expected,
                                          err_msg=f"root {root}")

    each_case(REDUCTIONS, check, reduction_id)


@pytest.mark.parametrize("count", [0, 1, 3])  # the buffer holds size * count elements
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("reduce_scatter_block"))
def test_reduce_scatter_block(name, size, count):
    fn = algs.REGISTRY["reduce_scatter_block"][name].fn

    def check(case):
        dtype, op = case
        xs = contributions(size, size * count, dtype, op)
        expected = fold(op, xs)

        def body(cc):
            recvbuf = np.full(count, 99, dtype=dtype)
            sendbuf = xs[cc.rank].copy()
            fn(cc, sendbuf, recvbuf, op)
            np.testing.assert_array_equal(sendbuf, xs[cc.rank])  # input untouched
            return recvbuf

        for rank, res in enumerate(run_fake(size, body)):
            np.testing.assert_array_equal(res, expected[rank * count:(rank + 1) * count])

    each_case(REDUCTIONS, check, reduction_id)


# -- non-commutative: affine maps x -> a*x + b composed in rank order (mod 2**64) ------------
AFFINE = np.dtype([("a", np.uint64), ("b", np.uint64)])


def _compose(invec, inoutvec, datatype=None):
    """Compose affine maps: ``inoutvec = invec ∘ inoutvec`` (invec's map applies first)."""
    a = inoutvec["a"] * invec["a"]
    b = inoutvec["a"] * invec["b"] + inoutvec["b"]
    inoutvec["a"], inoutvec["b"] = a, b


AFFINE_OP = ops.Op.Create(_compose, commute=False)


def affine_inputs(size: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(size * 1000 + n)
    out = []
    for _ in range(size):
        x = np.empty(n, dtype=AFFINE)
        x["a"] = rng.integers(1, 1 << 40, n, dtype=np.uint64)
        x["b"] = rng.integers(0, 1 << 40, n, dtype=np.uint64)
        out.append(x)
    return out


def affine_fold(xs):
    acc = xs[0].copy()
    for x in xs[1:]:
        nxt = x.copy()
        with np.errstate(over="ignore"):
            _compose(acc, nxt)
        acc = nxt
    return acc


def noncommutative_cases(*collectives: str):
    return [pytest.param(c, n, id=f"{c}-{n}") for c in collectives for n in algs.algorithms(c)
            if not algs.REGISTRY[c][n].commutative_only]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,name", noncommutative_cases("allreduce", "reduce"))
def test_noncommutative_rank_order(collective, name, size):
    fn = algs.REGISTRY[collective][name].fn
    roots = [None] if collective == "allreduce" else range(size)

    def check(count):
        xs = affine_inputs(size, count)
        expected = affine_fold(xs)
        assert size == 1 or count == 0 or not np.array_equal(expected, affine_fold(xs[::-1]))
        with np.errstate(over="ignore"):
            for root in roots:
                def body(cc):
                    buf = xs[cc.rank].copy()
                    fn(cc, buf, AFFINE_OP) if root is None else fn(cc, buf, root, AFFINE_OP)
                    return buf

                results = run_fake(size, body)
                for rank, res in enumerate(results):
                    if root in (None, rank):
                        assert np.array_equal(res, expected), f"rank {rank} root {root}"

    each_case([0, 1, 5, 13], check, lambda count: f"count {count}")


@pytest.mark.parametrize("per", [0, 1, 3])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,name", noncommutative_cases("reduce_scatter_block"))
def test_noncommutative_reduce_scatter_block(collective, name, size, per):
    xs = affine_inputs(size, size * per)
    expected = affine_fold(xs)
    fn = algs.REGISTRY[collective][name].fn

    def body(cc):
        out = np.zeros(per, dtype=AFFINE)
        fn(cc, xs[cc.rank].copy(), out, AFFINE_OP)
        return out

    with np.errstate(over="ignore"):
        for rank, res in enumerate(run_fake(size, body)):
            assert np.array_equal(res, expected[rank * per:(rank + 1) * per]), rank


# -- bit-identical floats (hypothesis) ---------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 9), count=st.integers(0, 40),
       name=st.sampled_from(algs.algorithms("allreduce")),
       dtype=st.sampled_from([np.float32, np.float64]),
       op=st.sampled_from(OPS), seed=st.integers(0, 2**32 - 1))
def test_allreduce_random_floats_bit_identical(size, count, name, dtype, op, seed):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(count) * 10 ** rng.uniform(-3, 3, count)).astype(dtype)
          for _ in range(size)]
    fn = algs.REGISTRY["allreduce"][name].fn
    results = run_fake(size, lambda cc: (fn(cc, b := xs[cc.rank].copy(), op), b)[1])
    assert_same_bytes(results)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(results[0], fold(op, xs), rtol=rtol, atol=1e-30)


# -- data movement ---------------------------------------------------------------------------
def block_inputs(size: int, count: int, dtype) -> list[np.ndarray]:
    """Rank r's data: distinct values per rank and position."""
    return [(np.arange(count) + 100 * r + 1).astype(dtype) for r in range(size)]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("bcast"))
def test_bcast(name, size, count):
    def check(dtype):
        fn = algs.REGISTRY["bcast"][name].fn
        xs = block_inputs(size, count, dtype)
        for root in range(size):
            def body(cc):
                buf = xs[root].copy() if cc.rank == root else np.zeros(count, dtype)
                fn(cc, buf, root)
                return buf

            for res in run_fake(size, body):
                np.testing.assert_array_equal(res, xs[root])

    each_case(MOVE_DTYPES, check, lambda d: np.dtype(d).name)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("allgather"))
def test_allgather(name, size, count):
    def check(dtype):
        if not usable("allgather", name, size):
            with pytest.raises(ArgumentError):
                algs.choose("allgather", count, size, requested=name)
            return
        fn = algs.REGISTRY["allgather"][name].fn
        xs = block_inputs(size, count, dtype)

        def body(cc):
            buf = np.zeros(size * count, dtype)
            buf[cc.rank * count:(cc.rank + 1) * count] = xs[cc.rank]
            fn(cc, buf, count)
            return buf

        expected = np.concatenate(xs)
        for res in run_fake(size, body):
            np.testing.assert_array_equal(res, expected)

    each_case(MOVE_DTYPES, check, lambda d: np.dtype(d).name)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("gather"))
def test_gather(name, size, count):
    def check(dtype):
        fn = algs.REGISTRY["gather"][name].fn
        xs = block_inputs(size, count, dtype)
        for root in range(size):
            def body(cc):
                recvbuf = np.zeros(size * count, dtype) if cc.rank == root else None
                sendbuf = xs[cc.rank].copy()
                fn(cc, sendbuf, recvbuf, root)
                np.testing.assert_array_equal(sendbuf, xs[cc.rank])  # input untouched
                return recvbuf

            np.testing.assert_array_equal(run_fake(size, body)[root], np.concatenate(xs))

    each_case(MOVE_DTYPES, check, lambda d: np.dtype(d).name)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("scatter"))
def test_scatter(name, size, count):
    def check(dtype):
        fn = algs.REGISTRY["scatter"][name].fn
        data = (np.arange(size * count) * 3 + 1).astype(dtype)
        for root in range(size):
            def body(cc):
                sendbuf = data.copy() if cc.rank == root else None
                recvbuf = np.zeros(count, dtype)
                fn(cc, sendbuf, recvbuf, root)
                if sendbuf is not None:
                    np.testing.assert_array_equal(sendbuf, data)  # input untouched
                return recvbuf

            for rank, res in enumerate(run_fake(size, body)):
                np.testing.assert_array_equal(res, data[rank * count:(rank + 1) * count])

    each_case(MOVE_DTYPES, check, lambda d: np.dtype(d).name)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("alltoall"))
def test_alltoall(name, size, count):
    def check(dtype):
        fn = algs.REGISTRY["alltoall"][name].fn

        # rank r's block d holds 1000*r + 10*d + position
        def sendbuf_of(r):
            return np.concatenate([1000 * r + 10 * d + np.arange(count) for d in range(size)]
                                  ).astype(dtype) if count else np.zeros(0, dtype)

        def body(cc):
            recvbuf = np.zeros(size * count, dtype)
            sendbuf = sendbuf_of(cc.rank)
            fn(cc, sendbuf, recvbuf, count)
            np.testing.assert_array_equal(sendbuf, sendbuf_of(cc.rank))
            return recvbuf

        for rank, res in enumerate(run_fake(size, body)):
            for src in range(size):
                np.testing.assert_array_equal(res[src * count:(src + 1) * count],
                                              sendbuf_of(src)[rank * count:(rank + 1) * count])

    each_case(MOVE_DTYPES, check, lambda d: np.dtype(d).name)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algorithm_cases("barrier"))
def test_barrier(name, size):
    fn = algs.REGISTRY["barrier"][name].fn

    arrived = []
    lock = threading.Lock()

    def body(cc):
        time.sleep(0.002 * ((cc.rank * 5) % size))  # stagger arrivals
        with lock:
            arrived.append(cc.rank)
        fn(cc)
        with lock:
            return len(arrived)

    assert run_fake(size, body) == [size] * size


def test_eager_mode_also_passes():
    """The same schedules under buffered (eager) sends."""
    for size in (3, 4, 7):
        xs = contributions(size, 11, np.float64)
        for name in algs.algorithms("allreduce"):
            fn = algs.REGISTRY["allreduce"][name].fn
            res = run_fake(size, lambda cc: (fn(cc, b := xs[cc.rank].copy(), ops.SUM), b)[1],
                           synchronous=False)
            np.testing.assert_array_equal(res[0], fold(ops.SUM, xs))


def test_fake_catches_head_to_head_blocking_sends():
    def bad(cc):
        buf = np.zeros(4)
        cc.send(buf, 1 - cc.rank)
        cc.recv(buf, 1 - cc.rank)

    with pytest.raises(FakeCommError, match="timed out"):
        run_fake(2, bad, timeout=0.3)


def test_fake_catches_size_mismatch_and_leftovers():
    def mismatch(cc):
        if cc.rank == 0:
            cc.send(np.zeros(3), 1)
        else:
            cc.recv(np.zeros(4), 0)

    with pytest.raises(FakeCommError, match="bytes"):
        run_fake(2, mismatch, timeout=1)

    def leftover(cc):
        if cc.rank == 0:
            cc.waitall([])
            cc.isend(np.zeros(1), 1)

    with pytest.raises(FakeCommError, match="unreceived|never waited"):
        run_fake(2, leftover, synchronous=False, timeout=1)
