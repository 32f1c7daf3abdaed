"""Per-rank-count collectives, scan/exscan and MAXLOC/MINLOC on fake ranks (tests/fakecomm.py).

v-variants (gatherv, scatterv, allgatherv, alltoallv) and reduce_scatter with counts run
over sizes 1..9, every root, count patterns with zeros on some ranks, odd and uneven
blocks; scan and exscan over the same sizes, with a non-commutative op for rank order.
Counts are in elements, as in the algorithms' signatures.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm.collectives as algs
from pycomm import ops
from fakecomm import each_case, run_fake  # tests/ is on sys.path under pytest
from test_algorithms_fake import (AFFINE, AFFINE_OP, REDUCTIONS, SIZES,  # noqa: F401
                                  _small_segments, affine_fold, affine_inputs,
                                  assert_same_bytes, contributions, fold, reduction_id)

# count patterns, as a function of (rank, size): zeros on some ranks, uneven, all zero
PATTERNS = {
    "zeros": lambda r, p: 0,
    "one": lambda r, p: 1,
    "uneven": lambda r, p: (3 * r + 1) % 4,       # 1, 0, 3, 2, 1, 0, ...
    "odd": lambda r, p: 2 * r + 1,
    "last_only": lambda r, p: 5 if r == p - 1 else 0,
}


def counts_of(pattern: str, size: int) -> list[int]:
    return [PATTERNS[pattern](r, size) for r in range(size)]


def displs_of(counts: list[int], gap: int = 0) -> list[int]:
    """Back-to-back offsets, or with ``gap`` unused elements between blocks."""
    out, at = [], gap
    for c in counts:
        out.append(at)
        at += c + gap
    return out


def block_of(rank: int, n: int, dtype=np.int64) -> np.ndarray:
    return (np.arange(n) + 100 * rank + 1).astype(dtype)


# -- v-variants ----------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algs.algorithms("gatherv"))
def test_gatherv(name, size, pattern):
    fn = algs.REGISTRY["gatherv"][name].fn
    counts = counts_of(pattern, size)
    displs = displs_of(counts, gap=1)
    total = displs[-1] + counts[-1] + 1
    for root in range(size):
        def body(cc):
            recvbuf = np.full(total, -7, np.int64) if cc.rank == root else None
            mine = block_of(cc.rank, counts[cc.rank])
            fn(cc, mine, recvbuf, counts if cc.rank == root else None,
               displs if cc.rank == root else None, root)
            return recvbuf

        res = run_fake(size, body)[root]
        expected = np.full(total, -7, np.int64)
        for r in range(size):
            expected[displs[r]:displs[r] + counts[r]] = block_of(r, counts[r])
        np.testing.assert_array_equal(res, expected)  # the gaps are untouched


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algs.algorithms("scatterv"))
def test_scatterv(name, size, pattern):
    fn = algs.REGISTRY["scatterv"][name].fn
    counts = counts_of(pattern, size)
    # blocks in reverse rank order with gaps: displs need not follow rank order
    displs = displs_of(counts[::-1], gap=2)[::-1]
    total = max(d + c for d, c in zip(displs, counts, strict=True))
    data = np.arange(total, dtype=np.float32) * 3 + 1
    for root in range(size):
        def body(cc):
            sendbuf = data.copy() if cc.rank == root else None
            out = np.zeros(counts[cc.rank], np.float32)
            fn(cc, sendbuf, counts if cc.rank == root else None,
               displs if cc.rank == root else None, out, root)
            if sendbuf is not None:
                np.testing.assert_array_equal(sendbuf, data)
            return out

        for rank, res in enumerate(run_fake(size, body)):
            np.testing.assert_array_equal(res, data[displs[rank]:displs[rank] + counts[rank]])


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algs.algorithms("allgatherv"))
def test_allgatherv(name, size, pattern):
    fn = algs.REGISTRY["allgatherv"][name].fn
    counts = counts_of(pattern, size)
    displs = displs_of(counts, gap=1)
    total = displs[-1] + counts[-1] + 1

    def body(cc):
        buf = np.full(total, -7, np.int64)
        buf[displs[cc.rank]:displs[cc.rank] + counts[cc.rank]] = block_of(cc.rank,
                                                                          counts[cc.rank])
        fn(cc, buf, counts, displs)
        return buf

    expected = np.full(total, -7, np.int64)
    for r in range(size):
        expected[displs[r]:displs[r] + counts[r]] = block_of(r, counts[r])
    results = run_fake(size, body)
    for res in results:
        np.testing.assert_array_equal(res, expected)


@pytest.mark.parametrize("pattern", ["zeros", "uneven", "odd", "diagonal"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algs.algorithms("alltoallv"))
def test_alltoallv(name, size, pattern):
    fn = algs.REGISTRY["alltoallv"][name].fn

    def amount(src: int, dst: int) -> int:
        """Elements rank src sends to rank dst."""
        if pattern == "diagonal":
            return 3 if src == dst else 0
        return PATTERNS[pattern]((src + 2 * dst) % size, size)

    def payload(src: int, dst: int) -> np.ndarray:
        return (1000 * src + 10 * dst + np.arange(amount(src, dst))).astype(np.int64)

    def body(cc):
        r = cc.rank
        scounts = [amount(r, d) for d in range(size)]
        sdispls = displs_of(scounts)
        rcounts = [amount(s, r) for s in range(size)]
        rdispls = displs_of(rcounts, gap=1)
        sendbuf = np.concatenate([payload(r, d) for d in range(size)])
        recvbuf = np.full(rdispls[-1] + rcounts[-1] + 1, -7, np.int64)
        fn(cc, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls)
        np.testing.assert_array_equal(sendbuf, np.concatenate(
            [payload(r, d) for d in range(size)]))
        return recvbuf, rdispls, rcounts

    for rank, (res, rdispls, rcounts) in enumerate(run_fake(size, body)):
        for src in range(size):
            np.testing.assert_array_equal(
                res[rdispls[src]:rdispls[src] + rcounts[src]], payload(src, rank))
        gaps = np.ones(res.size, bool)
        for src in range(size):
            gaps[rdispls[src]:rdispls[src] + rcounts[src]] = False
        assert (res[gaps] == -7).all()


# -- reduce_scatter with per-rank counts ------------------------------------------------------
@pytest.mark.parametrize("pattern", ["zeros", "uneven", "odd", "last_only"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", algs.algorithms("reduce_scatter"))
def test_reduce_scatter(name, size, pattern):
    def check(case):
        dtype, op = case
        fn = algs.REGISTRY["reduce_scatter"][name].fn
        counts = counts_of(pattern, size)
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        xs = contributions(size, int(offs[-1]), dtype, op)
        expected = fold(op, xs)

        def body(cc):
            out = np.full(counts[cc.rank], 99, dtype=dtype)
            fn(cc, xs[cc.rank].copy(), out, counts, op)
            return out

        for rank, res in enumerate(run_fake(size, body)):
            np.testing.assert_array_equal(res, expected[offs[rank]:offs[rank + 1]])
            assert res.dtype == np.dtype(dtype)

    each_case(REDUCTIONS, check, reduction_id)


@pytest.mark.parametrize("pattern", ["uneven", "odd", "last_only"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [n for n in algs.algorithms("reduce_scatter")
                                  if not algs.REGISTRY["reduce_scatter"][n].commutative_only])
def test_reduce_scatter_noncommutative(name, size, pattern):
    fn = algs.REGISTRY["reduce_scatter"][name].fn
    counts = counts_of(pattern, size)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    xs = affine_inputs(size, int(offs[-1]))

    def body(cc):
        out = np.zeros(counts[cc.rank], dtype=AFFINE)
        fn(cc, xs[cc.rank].copy(), out, counts, AFFINE_OP)
        return out

    with np.errstate(over="ignore"):
        expected = affine_fold(xs)
        for rank, res in enumerate(run_fake(size, body)):
            assert np.array_equal(res, expected[offs[rank]:offs[rank + 1]]), rank


@pytest.mark.parametrize("op", [ops.SUM, ops.MAXLOC], ids=["ufunc", "kernel"])
@pytest.mark.parametrize("size", [2, 5, 6])
def test_reduce_scatter_sendbuf_contract(size, op):
    """No schedule modifies sendbuf (Communicator.Reduce_scatter passes the user's buffer
    itself), whether the op is a ufunc (reduced out of place) or not (into a copy)."""
    counts = [2, 0, 3, 1, 2, 4][:size]
    dt = ops.pair_dtype(np.int64) if op is ops.MAXLOC else np.dtype(np.int64)
    xs = []
    for r in range(size):
        x = np.zeros(sum(counts), dt)
        if op is ops.MAXLOC:
            x["val"], x["idx"] = np.arange(sum(counts)) * (r + 1) % 7, r
        else:
            x[:] = np.arange(sum(counts)) * (r + 1)
        xs.append(x)
    for name in algs.algorithms("reduce_scatter"):
        fn = algs.REGISTRY["reduce_scatter"][name].fn

        def body(cc):
            send = xs[cc.rank].copy()
            fn(cc, send, np.zeros(counts[cc.rank], dt), counts, op)
            return np.array_equal(send, xs[cc.rank])

        assert all(run_fake(size, body)), name


# -- scan / exscan ----------------------------------------------------------------------------
def prefixes(op, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [fold(op, xs[:r + 1]) for r in range(len(xs))]


@pytest.mark.parametrize("count", [0, 1, 7, 13])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective", ["scan", "exscan"])
def test_scan(collective, size, count):
    def check(case):
        dtype, op = case
        xs = contributions(size, count, dtype, op)
        expected = prefixes(op, xs)
        for name in algs.algorithms(collective):
            fn = algs.REGISTRY[collective][name].fn

            def body(cc):
                send = xs[cc.rank].copy()
                out = np.full(count, 42, dtype=dtype)
                fn(cc, send, out, op)
                np.testing.assert_array_equal(send, xs[cc.rank])  # sendbuf untouched
                return out

            for rank, res in enumerate(run_fake(size, body)):
                if collective == "scan":
                    np.testing.assert_array_equal(res, expected[rank])
                elif rank == 0:
                    np.testing.assert_array_equal(res, np.full(count, 42, dtype=dtype))
                else:
                    np.testing.assert_array_equal(res, expected[rank - 1])

    each_case(REDUCTIONS, check, reduction_id)


@pytest.mark.parametrize("count", [1, 5])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective", ["scan", "exscan"])
def test_scan_noncommutative(collective, size, count):
    xs = affine_inputs(size, count)
    for name in algs.algorithms(collective):
        fn = algs.REGISTRY[collective][name].fn

        def body(cc):
            out = np.zeros(count, dtype=AFFINE)
            fn(cc, xs[cc.rank], out, AFFINE_OP)
            return out

        with np.errstate(over="ignore"):
            results = run_fake(size, body)
            for rank, res in enumerate(results):
                upto = rank + 1 if collective == "scan" else rank
                if upto:
                    assert np.array_equal(res, affine_fold(xs[:upto])), (name, rank)


# -- MAXLOC / MINLOC through the schedules ----------------------------------------------------
def pair_inputs(size: int, n: int, dtype, seed: int) -> list[np.ndarray]:
    """Values from a tiny range so ties are common; index = the rank (MPI's usual use)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(size):
        x = np.empty(n, dtype=dtype)
        x["val"] = rng.integers(0, 3, n)
        x["idx"] = r
        out.append(x)
    return out


def loc_reference(op, xs: list[np.ndarray]) -> np.ndarray:
    vals = np.stack([x["val"] for x in xs])
    best = vals.max(axis=0) if op is ops.MAXLOC else vals.min(axis=0)
    out = np.empty(xs[0].size, dtype=xs[0].dtype)
    out["val"] = best
    idx = np.stack([x["idx"] for x in xs])
    out["idx"] = np.where(vals == best, idx, np.iinfo(idx.dtype).max).min(axis=0)
    return out


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 9), count=st.integers(0, 16),
       op=st.sampled_from([ops.MAXLOC, ops.MINLOC]),
       dtype=st.sampled_from([ops.DOUBLE_INT, ops.FLOAT_INT, ops.LONG_INT, ops.INT_INT]),
       collective=st.sampled_from(["allreduce", "reduce", "reduce_scatter_block"]),
       seed=st.integers(0, 1000), data=st.data())
def test_loc_ops_ties_lowest_index(size, count, op, dtype, collective, seed, data):
    name = data.draw(st.sampled_from(algs.algorithms(collective)))
    fn = algs.REGISTRY[collective][name].fn
    per = count  # reduce_scatter_block: count elements per rank
    n = size * per if collective == "reduce_scatter_block" else count
    xs = pair_inputs(size, n, dtype, seed)
    expected = loc_reference(op, xs)
    root = data.draw(st.integers(0, size - 1))

    def body(cc):
        buf = xs[cc.rank].copy()
        if collective == "allreduce":
            fn(cc, buf, op)
            return buf
        if collective == "reduce":
            fn(cc, buf, root, op)
            return buf
        out = np.zeros(per, dtype=dtype)
        fn(cc, buf, out, op)
        return out

    results = run_fake(size, body)
    if collective == "allreduce":
        for res in results:
            assert np.array_equal(res, expected)
        assert_same_bytes(results)
    elif collective == "reduce":
        assert np.array_equal(results[root], expected)
    else:
        for rank, res in enumerate(results):
            assert np.array_equal(res, expected[rank * per:(rank + 1) * per])


def test_loc_ops_in_reduce_objects_order_free():
    pairs = [(3.0, 4), (5.0, 2), (5.0, 1), (1.0, 0)]
    for order in (pairs, pairs[::-1]):
        assert functools.reduce(ops.MAXLOC, order) == (5.0, 1)
        assert functools.reduce(ops.MINLOC, order) == (1.0, 0)
