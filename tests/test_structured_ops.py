"""MAXLOC/MINLOC on value/index pairs (numpy structured dtypes) and the logical and bitwise
ops (LAND, LOR, LXOR, BAND, BOR, BXOR) through Allreduce and Reduce on real worlds, against
numpy references.

Pair values are drawn from a tiny range so that ties are frequent, and indices are not
monotonic in the rank, so "ties go to the lowest index" is checked, not "to the lowest
rank". Allreduce results must be bit-identical on every rank.
"""

from __future__ import annotations

import functools
import sys

import cloudpickle
import numpy as np
import pytest

import pycomm
from pycomm import ops

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
PAIR_OPS = ("MAXLOC", "MINLOC")
LOGICAL = ("LAND", "LOR", "LXOR")
BITWISE = ("BAND", "BOR", "BXOR")

PAIR_DTYPES = {
    "DOUBLE_INT": ("float64", "int32"), "FLOAT_INT": ("float32", "int32"),
    "LONG_INT": ("int64", "int32"), "SHORT_INT": ("int16", "int32"),
    "uint8-int64": ("uint8", "int64"),
}
UFUNC = {"LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
         "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def _alg_params(coll: str) -> list:
    return [*pycomm.algorithms(coll), None]


def _alg_id(alg) -> str:
    return alg or "auto"


# -- pairs ---------------------------------------------------------------------------------

def pair_dtype(name: str, aligned: bool = False) -> np.dtype:
    val, idx = PAIR_DTYPES[name]
    if aligned:           # padding bytes between/after the fields: any layout is accepted
        return np.dtype([("v", val), ("i", idx)], align=True)
    return ops.pair_dtype(val, idx)


def pairs(seed: int, rank: int, size: int, n: int, dt: np.dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n])
    out = np.zeros(n, dtype=dt)
    fv, fi = dt.names
    out[fv] = rng.integers(0, 3, n).astype(dt[fv])          # many ties
    out[fi] = (size - 1 - rank) * 7 + rng.integers(0, 3, n)  # not monotonic in the rank
    return out


def loc_reference(op: str, arrays: list) -> tuple[np.ndarray, np.ndarray]:
    """Per element: the max (min) value and, among its holders, the lowest index."""
    fv, fi = arrays[0].dtype.names
    vals = np.stack([a[fv] for a in arrays])
    idxs = np.stack([a[fi] for a in arrays]).astype(np.int64)
    best = vals.max(axis=0) if op == "MAXLOC" else vals.min(axis=0)
    idx = np.where(vals == best, idxs, np.iinfo(np.int64).max).min(axis=0)
    return best, idx


def _rank_loc(coll: str, alg, cases: list):
    comm = pycomm.COMM_WORLD
    size, rank = comm.size, comm.rank
    out = []
    for c in cases:
        dt = pair_dtype(c["dtype"], c["aligned"])
        op = getattr(ops, c["op"])
        mine = pairs(c["seed"], rank, size, c["n"], dt)
        want_v, want_i = loc_reference(c["op"], [pairs(c["seed"], r, size, c["n"], dt)
                                                 for r in range(size)])
        got = None
        try:
            if coll == "allreduce":
                got = np.zeros(c["n"], dtype=dt)
                if c["inplace"]:
                    got[...] = mine
                    comm.Allreduce(pycomm.IN_PLACE, got, op, algorithm=alg)
                else:
                    comm.Allreduce(mine, got, op, algorithm=alg)
            else:
                got = np.zeros(c["n"], dtype=dt) if rank == c["root"] else None
                if c["inplace"] and rank == c["root"]:
                    got[...] = mine
                    comm.Reduce(pycomm.IN_PLACE, got, op, c["root"], algorithm=alg)
                else:
                    comm.Reduce(mine, got, op, c["root"], algorithm=alg)
        except pycomm.CommError as exc:
            out.append((c, f"{type(exc).__name__}: {exc}", None))
            break
        if got is None:
            out.append((c, None, None))
            continue
        fv, fi = dt.names
        err = None
        if not np.array_equal(got[fv], want_v.astype(dt[fv])):
            err = f"values {got[fv][:8]} expected {want_v[:8]}"
        elif not np.array_equal(got[fi].astype(np.int64), want_i):
            err = f"indices {got[fi][:8]} expected {want_i[:8]} (ties: lowest index)"
        out.append((c, err, (got[fv].tobytes(), got[fi].tobytes())))
    return out


def loc_cases(coll: str, size: int) -> list:
    big = EAGER_LIMIT // 12 + 5            # past the eager limit for a 12-byte pair
    cases = []
    roots = range(size) if coll == "reduce" else (0,)
    for op in PAIR_OPS:
        for dname in PAIR_DTYPES:
            cases.append(dict(op=op, dtype=dname, aligned=False, n=7, inplace=False,
                              root=size - 1))
        for root in roots:
            cases.append(dict(op=op, dtype="DOUBLE_INT", aligned=False, n=5, inplace=True,
                              root=root))
        cases.append(dict(op=op, dtype="LONG_INT", aligned=True, n=9, inplace=False, root=0))
        cases.append(dict(op=op, dtype="DOUBLE_INT", aligned=False, n=0, inplace=False,
                          root=0))
        cases.append(dict(op=op, dtype="FLOAT_INT", aligned=False, n=big, inplace=False,
                          root=0))
    return [dict(c, seed=i) for i, c in enumerate(cases)]


def check_loc(results: list, coll: str) -> None:
    failures = [f"rank {r}: {c}: {err}" for r, res in enumerate(results)
                for c, err, _ in res if err]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:20])
    if coll == "allreduce":
        for i, (c, _, _) in enumerate(results[0]):
            assert len({res[i][2] for res in results}) == 1, f"{c}: ranks differ"


@pytest.mark.parametrize("alg", _alg_params("allreduce"), ids=_alg_id)
def test_maxloc_minloc_allreduce(world_small, alg):
    check_loc(world_small.run(_rank_loc, "allreduce", alg,
                              loc_cases("allreduce", world_small.size)), "allreduce")


@pytest.mark.parametrize("alg", _alg_params("reduce"), ids=_alg_id)
def test_maxloc_minloc_reduce_every_root(world_small, alg):
    check_loc(world_small.run(_rank_loc, "reduce", alg,
                              loc_cases("reduce", world_small.size)), "reduce")


def _rank_loc_objects():
    comm = pycomm.COMM_WORLD
    rank, size = comm.rank, comm.size
    v = rank % 2                           # ties between every other rank
    return (comm.allreduce((v, size - rank), op=ops.MAXLOC),
            comm.allreduce((v, size - rank), op=ops.MINLOC),
            comm.reduce((float(rank), rank), op=ops.MAXLOC, root=size - 1))


def test_maxloc_minloc_objects(world):
    s = world.size
    high = 1 if s > 1 else 0
    want_max = (high, min(s - r for r in range(s) if r % 2 == high))
    want_min = (0, min(s - r for r in range(s) if r % 2 == 0))
    for rank, (mx, mn, red) in enumerate(world.run(_rank_loc_objects)):
        assert mx == want_max and mn == want_min, f"rank {rank}"
        assert red == ((float(s - 1), s - 1) if rank == s - 1 else None)


# -- logical and bitwise -------------------------------------------------------------------

def bits(seed: int, rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt)
    if dt.kind == "f":                     # zero or not, with non-unit truthy values
        return (rng.integers(0, 2, n) * rng.uniform(-3, 3, n)).astype(dt)
    hi = min(np.iinfo(dt).max, 2**20)
    lo = 0 if dt.kind == "u" else -hi
    # logical ops: mostly non-zero with some zeros; bitwise: arbitrary bit patterns
    return (rng.integers(lo, hi, n) * rng.integers(0, 4, n).clip(0, 1)).astype(dt)


def _rank_logical(cases: list):
    comm = pycomm.COMM_WORLD
    size, rank = comm.size, comm.rank
    out = []
    for c in cases:
        op, dt, n, seed = getattr(ops, c["op"]), c["dtype"], c["n"], c["seed"]
        inputs = [bits(seed, r, n, dt) for r in range(size)]
        want = functools.reduce(UFUNC[c["op"]], inputs).astype(dt)
        got = np.zeros(n, dtype=dt)
        try:
            if c["coll"] == "allreduce":
                comm.Allreduce(inputs[rank], got, op)
            else:
                comm.Reduce(inputs[rank], got, op, root=c["root"])
                if rank != c["root"]:
                    out.append((c, None, None))
                    continue
        except pycomm.CommError as exc:
            out.append((c, f"{type(exc).__name__}: {exc}", None))
            break
        err = None if np.array_equal(got, want) else f"got {got[:6]}, expected {want[:6]}"
        out.append((c, err, got.tobytes()))
    return out


def logical_cases(size: int) -> list:
    cases = []
    for coll in ("allreduce", "reduce"):
        for op, dtypes in ((LOGICAL, ("bool", "int32", "uint8", "float64")),
                           (BITWISE, ("bool", "int64", "uint16", "int8"))):
            for name in op:
                for dt in dtypes:
                    cases.append(dict(coll=coll, op=name, dtype=dt, n=11,
                                      root=(len(cases) % size)))
    cases.append(dict(coll="allreduce", op="BXOR", dtype="uint32", n=EAGER_LIMIT // 4 + 9,
                      root=0))
    cases.append(dict(coll="allreduce", op="LAND", dtype="int64", n=0, root=0))
    return [dict(c, seed=i) for i, c in enumerate(cases)]


def test_logical_and_bitwise_ops(world):
    results = world.run(_rank_logical, logical_cases(world.size))
    failures = [f"rank {r}: {c}: {err}" for r, res in enumerate(results)
                for c, err, _ in res if err]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:20])
    for i, (c, _, _) in enumerate(results[0]):
        if c["coll"] == "allreduce":
            assert len({res[i][2] for res in results}) == 1, f"{c}: ranks differ"


# -- refusals ------------------------------------------------------------------------------

def _rank_refusals():
    comm = pycomm.COMM_WORLD
    pair = np.zeros(3, dtype=ops.DOUBLE_INT)
    calls = {
        "MAXLOC on float64": lambda: comm.Allreduce(np.zeros(3), np.zeros(3), ops.MAXLOC),
        "MINLOC on three fields": lambda: comm.Allreduce(
            np.zeros(2, "f8,i4,i4"), np.zeros(2, "f8,i4,i4"), ops.MINLOC),
        "MAXLOC float index": lambda: comm.Allreduce(
            np.zeros(2, "f8,f8"), np.zeros(2, "f8,f8"), ops.MAXLOC),
        "SUM on pairs": lambda: comm.Allreduce(pair.copy(), pair, pycomm.SUM),
        "MAX on pairs": lambda: comm.Reduce(pair.copy(), pair, pycomm.MAX, 0),
        "BAND on float": lambda: comm.Allreduce(np.zeros(3), np.zeros(3), ops.BAND),
        "LXOR on complex": lambda: comm.Allreduce(np.zeros(3, complex), np.zeros(3, complex),
                                                  ops.LXOR),
    }
    out = {}
    for what, fn in calls.items():
        try:
            fn()
            out[what] = "ran"
        except pycomm.ArgumentError:
            out[what] = "ArgumentError"
    comm.Barrier()
    return out


def test_ops_refuse_dtypes_they_do_not_define(world_small):
    for rank, got in enumerate(world_small.run(_rank_refusals)):
        assert set(got.values()) == {"ArgumentError"}, f"rank {rank}: {got}"


def test_new_ops_are_exported_at_top_level():
    for name in PAIR_OPS + LOGICAL + BITWISE:
        assert getattr(pycomm, name, None) is getattr(ops, name), name


# -- MAXLOC/MINLOC through the prefix and reduce-scatter collectives ------------------------

def _rank_loc_others(op_name: str, dname: str, seed: int):
    comm = pycomm.COMM_WORLD
    p, r = comm.size, comm.rank
    dt, op = pair_dtype(dname), getattr(ops, op_name)
    counts = [(q * 5) % 4 for q in range(p)]          # uneven, with zeros
    total = sum(counts)
    mine = pairs(seed, r, p, max(total, 3 * p), dt)
    scan, exscan = np.zeros_like(mine), np.zeros_like(mine)
    comm.Scan(mine, scan, op)
    comm.Exscan(mine, exscan, op)
    block = np.zeros(3, dtype=dt)
    comm.Reduce_scatter_block(mine[:3 * p], block, op)
    part = np.zeros(counts[r], dtype=dt)
    comm.Reduce_scatter(mine[:total], part, counts, op)
    return scan, exscan, block, part, counts


@pytest.mark.parametrize("op_name", PAIR_OPS)
def test_maxloc_minloc_scan_exscan_reduce_scatter(world_small, op_name):
    p = world_small.size
    results = world_small.run(_rank_loc_others, op_name, "DOUBLE_INT", 11)
    counts = results[0][4]
    n = max(sum(counts), 3 * p)
    inputs = [pairs(11, r, p, n, pair_dtype("DOUBLE_INT")) for r in range(p)]
    starts = np.cumsum([0] + counts)

    def check(got, want, what):
        (v, i), (fv, fi) = want, got.dtype.names
        assert np.array_equal(got[fv], v) and np.array_equal(got[fi].astype(np.int64), i), \
            f"{what}: got {got[:6]}, expected values {v[:6]} indices {i[:6]} (lowest index)"

    for r, (scan, exscan, block, part, _) in enumerate(results):
        check(scan, loc_reference(op_name, inputs[:r + 1]), f"rank {r} Scan")
        if r > 0:                                     # Exscan leaves rank 0 undefined
            check(exscan, loc_reference(op_name, inputs[:r]), f"rank {r} Exscan")
        whole = loc_reference(op_name, [a[:3 * p] for a in inputs])
        check(block, (whole[0][3 * r:3 * r + 3], whole[1][3 * r:3 * r + 3]),
              f"rank {r} Reduce_scatter_block")
        whole = loc_reference(op_name, [a[:sum(counts)] for a in inputs])
        lo, hi = starts[r], starts[r + 1]
        check(part, (whole[0][lo:hi], whole[1][lo:hi]), f"rank {r} Reduce_scatter")
