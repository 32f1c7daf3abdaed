"""Collective buffer API on real worlds: every collective x every algorithm (and the
automatic choice) x counts {0, 1, 2, 7, 1000, past the eager limit} x IN_PLACE where MPI
allows it x ops x dtypes, every root at counts 1 and 7 (the first, a middle and the last
root at the others).

One ``world.run`` per (collective, algorithm) executes a whole list of cases; each rank
rebuilds every rank's input from the same seeds, computes the numpy reference and returns,
per case, a label, an error description (None when right) and a digest of its result bytes.
The parent asserts that no case failed and that results meant to be equal on all ranks
(allreduce, allgather, bcast) are bit-identical across ranks. The barrier, a non-commutative
user op's rank order and the hypothesis properties: test_cco_buf_props.py.
"""

from __future__ import annotations

import functools
import hashlib
import sys

import cloudpickle
import numpy as np
import pytest

import pycomm
from pycomm.collectives import REGISTRY

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
REDUCTIONS = ("allreduce", "reduce", "reduce_scatter_block")
ROOTED = ("bcast", "reduce", "gather", "scatter")
SAME_ON_ALL = ("allreduce", "allgather", "bcast")
IN_PLACE_OK = ("allreduce", "reduce", "gather", "scatter", "allgather", "alltoall",
               "reduce_scatter_block")
# The collectives tested here (the vector ones and the scans: test_vcoll.py), each with
# every registered algorithm and None (the automatic choice).
COLLECTIVES = ("bcast", "reduce", "allreduce", "allgather", "gather", "scatter", "alltoall",
               "reduce_scatter_block")
PAIRS = [(c, a) for c in COLLECTIVES for a in [*pycomm.algorithms(c), None]]
NUMERIC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float32", "float64", "complex128"]
OPS = ("SUM", "PROD", "MIN", "MAX")
UFUNC = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum}


def _pair_id(pair) -> str:
    coll, alg = pair
    return f"{coll}-{alg or 'auto'}"


def op_accepts(op: str, dtype: str) -> bool:
    kind = np.dtype(dtype).kind
    return kind in ("iufc" if op in ("SUM", "PROD") else "iuf")


def unfit(coll: str, alg: str | None, size: int, commutative: bool = True) -> str | None:
    """Why the registry says ``alg`` cannot serve this call (None: it can)."""
    if alg is None:
        return None
    return REGISTRY[coll][alg].unfit_reason(size, commutative)


# -- what runs on the ranks ----------------------------------------------------------------

def make_input(seed: int, rank: int, n: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: values that keep PROD finite and SUM inexact for floats."""
    rng = np.random.default_rng([seed, rank, n])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt)
    if dt.kind == "i":
        return rng.integers(-6, 7, n).astype(dt)
    if dt.kind == "u":
        return rng.integers(0, 7, n).astype(dt)
    if dt.kind == "f":
        return rng.uniform(0.5, 1.5, n).astype(dt)
    return (rng.uniform(0.5, 1.5, n) + 1j * rng.uniform(-0.5, 0.5, n)).astype(dt)


def reference_reduce(op: str, arrays: list) -> np.ndarray:
    """``x_0 op x_1 op ... op x_{p-1}`` in rank order, in the arrays' dtype."""
    return functools.reduce(lambda a, b: UFUNC[op](a, b), arrays).astype(arrays[0].dtype)


def compare(got, want, dtype: str, op: str | None) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    kind = np.dtype(dtype).kind
    if kind in "fc" and op in ("SUM", "PROD"):
        rtol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
        ok = np.allclose(got, want, rtol=rtol, atol=0)
    else:
        ok = np.array_equal(got, want)
    if ok:
        return None
    bad = np.flatnonzero(got != want)
    i = int(bad[0]) if bad.size else 0
    return f"{bad.size} wrong elements, first at {i}: got {got[i]!r}, expected {want[i]!r}"


def run_case(comm, coll: str, alg, case: dict):
    """Run one collective call; return (result or None, expected or None, sendbuf intact)."""
    n, root, inplace = case["n"], case["root"], case["inplace"]
    dt, opname, seed = case["dtype"], case["op"], case["seed"]
    op = getattr(pycomm, opname) if opname else None
    size, rank = comm.size, comm.rank

    made = {}

    def inp(r, m):
        """Rank ``r``'s input of ``m`` elements: a fresh copy of the one made per case (the
        reference, the send buffer and the intact check need the same array)."""
        if (r, m) not in made:
            made[r, m] = make_input(seed, r, m, dt)
        return made[r, m].copy()

    def block(a, i):
        return a[i * n:(i + 1) * n]

    send = None
    if coll == "bcast":
        buf = inp(root, n) if rank == root else np.zeros(n, dt)
        comm.Bcast(buf, root, algorithm=alg)
        return buf, inp(root, n), True
    if coll == "allreduce":
        want = reference_reduce(opname, [inp(r, n) for r in range(size)])
        if inplace:
            recv = inp(rank, n)
            comm.Allreduce(pycomm.IN_PLACE, recv, op, algorithm=alg)
        else:
            send, recv = inp(rank, n), np.zeros(n, dt)
            comm.Allreduce(send, recv, op, algorithm=alg)
        return recv, want, send is None or np.array_equal(send, inp(rank, n))
    if coll == "reduce":
        if rank != root:    # no result here: no reference either
            send = inp(rank, n)
            comm.Reduce(send, None, op, root, algorithm=alg)
            return None, None, np.array_equal(send, inp(rank, n))
        want = reference_reduce(opname, [inp(r, n) for r in range(size)])
        if inplace:
            recv = inp(rank, n)
            comm.Reduce(pycomm.IN_PLACE, recv, op, root, algorithm=alg)
        else:
            send, recv = inp(rank, n), np.zeros(n, dt)
            comm.Reduce(send, recv, op, root, algorithm=alg)
        return recv, want, send is None or np.array_equal(send, inp(rank, n))
    if coll == "gather":
        if rank != root:
            send = inp(rank, n)
            comm.Gather(send, None, root, algorithm=alg)
            return None, None, np.array_equal(send, inp(rank, n))
        want = np.concatenate([inp(r, n) for r in range(size)])
        recv = np.zeros(size * n, dt)
        if inplace:
            block(recv, rank)[:] = inp(rank, n)
            comm.Gather(pycomm.IN_PLACE, recv, root, algorithm=alg)
        else:
            send = inp(rank, n)
            comm.Gather(send, recv, root, algorithm=alg)
        return recv, want, send is None or np.array_equal(send, inp(rank, n))
    if coll == "scatter":
        want = block(inp(root, size * n), rank)
        if rank != root:
            recv = np.zeros(n, dt)
            comm.Scatter(None, recv, root, algorithm=alg)
            return recv, want, True
        send = inp(root, size * n)
        if inplace:
            comm.Scatter(send, pycomm.IN_PLACE, root, algorithm=alg)
            return block(send, rank).copy(), want, np.array_equal(send, inp(root, size * n))
        recv = np.zeros(n, dt)
        comm.Scatter(send, recv, root, algorithm=alg)
        return recv, want, np.array_equal(send, inp(root, size * n))
    if coll == "allgather":
        want = np.concatenate([inp(r, n) for r in range(size)])
        recv = np.zeros(size * n, dt)
        if inplace:
            block(recv, rank)[:] = inp(rank, n)
            comm.Allgather(pycomm.IN_PLACE, recv, algorithm=alg)
        else:
            send = inp(rank, n)
            comm.Allgather(send, recv, algorithm=alg)
        return recv, want, send is None or np.array_equal(send, inp(rank, n))
    if coll == "alltoall":
        want = np.concatenate([block(inp(r, size * n), rank) for r in range(size)])
        if inplace:
            recv = inp(rank, size * n)
            comm.Alltoall(pycomm.IN_PLACE, recv, algorithm=alg)
        else:
            send, recv = inp(rank, size * n), np.zeros(size * n, dt)
            comm.Alltoall(send, recv, algorithm=alg)
        return recv, want, send is None or np.array_equal(send, inp(rank, size * n))
    if coll == "reduce_scatter_block":
        want = reference_reduce(opname, [block(inp(r, size * n), rank) for r in range(size)])
        if inplace:
            recv = inp(rank, size * n)
            comm.Reduce_scatter_block(pycomm.IN_PLACE, recv, op, algorithm=alg)
            return recv[:n], want, True
        send, recv = inp(rank, size * n), np.zeros(n, dt)
        comm.Reduce_scatter_block(send, recv, op, algorithm=alg)
        return recv, want, np.array_equal(send, inp(rank, size * n))
    raise ValueError(f"unknown collective {coll}")


def label(case: dict) -> str:
    return (f"n={case['n']} root={case['root']} inplace={case['inplace']} "
            f"op={case['op']} dtype={case['dtype']}")


def _rank_cases(coll: str, alg, cases: list) -> list:
    """Run every case; per case (label, error or None, digest of the result bytes)."""
    comm = pycomm.COMM_WORLD
    out = []
    for case in cases:
        try:
            got, want, intact = run_case(comm, coll, alg, case)
        except pycomm.CommError as exc:   # report, then stop: the world may be unusable
            out.append((label(case), f"{type(exc).__name__}: {exc}", None))
            break
        err = None if got is None else compare(got, want, case["dtype"], case["op"])
        if not intact:
            err = (err + "; " if err else "") + "the send buffer was modified"
        digest = None if got is None else hashlib.blake2b(got.tobytes()).hexdigest()[:16]
        out.append((label(case), err, digest))
    return out


def _rank_expect_unfit(coll: str, alg, cases: list) -> list:
    """An algorithm that cannot serve this size must refuse every call, on every rank."""
    comm = pycomm.COMM_WORLD
    out = []
    for case in cases:
        try:
            run_case(comm, coll, alg, case)
            out.append(f"{label(case)}: ran instead of raising ArgumentError")
        except pycomm.ArgumentError as exc:
            if alg not in str(exc):
                out.append(f"{label(case)}: message does not name {alg!r}: {exc}")
    comm.Barrier()
    return out


# -- cases, built in the parent ------------------------------------------------------------

def big_count(coll: str, size: int, itemsize: int) -> int:
    """Elements per call (or per block) so that every message of every schedule (chunked
    by ``size`` for the vector collectives) exceeds the eager limit: rendezvous."""
    per_message = EAGER_LIMIT // itemsize + 3
    return per_message * size if coll in ("allreduce", "reduce", "bcast") else per_message


def shape_cases(coll: str, size: int, seed: int = 1) -> list:
    """Counts x roots x in-place, for one dtype (and SUM for the reductions)."""
    dtype = "float64" if coll in REDUCTIONS else "int32"
    op = "SUM" if coll in REDUCTIONS else None
    inplaces = (False, True) if coll in IN_PLACE_OK else (False,)
    cases = []
    for n in (0, 1, 2, 7, 1000, big_count(coll, size, 8 if coll in REDUCTIONS else 4)):
        # every root at counts 1 (fewer than the ranks) and 7 (odd, more than some sizes);
        # the first, a middle and the last root at the other counts, and at the count past
        # the eager limit the first and the last (every root x count 0..13 of every
        # algorithm at sizes 1..9 runs on fake ranks: test_algorithms_fake.py)
        roots = (0,)
        if coll in ROOTED:
            roots = range(size) if n in (1, 7) else sorted({0, size // 2, size - 1})
            if n > 1000:
                roots = sorted({0, size - 1})
        for root in roots:
            for inplace in inplaces:
                cases.append({"n": n, "root": root, "inplace": inplace, "op": op,
                              "dtype": dtype, "seed": seed + len(cases)})
    return cases


def op_dtype_cases(coll: str, size: int, seed: int = 2, full: bool = True) -> list:
    """Ops x dtypes at counts 1 and 7 (in place). ``full``: the whole product (84 cases);
    otherwise each dtype twice with two different ops (22 cases), so that every op meets
    every dtype kind (signed, unsigned, float; SUM and PROD complex) and every dtype
    crosses the wire in both directions of in-place."""
    cases = []
    if full:
        for op in OPS:
            for dt in NUMERIC:
                if not op_accepts(op, dt):
                    continue
                for n in (1, 7):
                    cases.append({"n": n, "root": size - 1, "inplace": n == 7, "op": op,
                                  "dtype": dt, "seed": seed + len(cases)})
        return cases
    for i, dt in enumerate(NUMERIC):
        ops = [o for o in OPS if op_accepts(o, dt)]
        for n, op in ((1, ops[i % len(ops)]), (7, ops[(i + len(ops) // 2) % len(ops)])):
            cases.append({"n": n, "root": size - 1, "inplace": n == 7, "op": op,
                          "dtype": dt, "seed": seed + len(cases)})
    return cases


def check_results(results: list, coll: str) -> None:
    failures = [f"rank {r}: {lab}: {err}" for r, res in enumerate(results)
                for lab, err, _ in res if err]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:25])
    if coll in SAME_ON_ALL:
        for i, (lab, _, _) in enumerate(results[0]):
            digests = {res[i][2] for res in results}
            assert len(digests) == 1, f"{lab}: ranks hold different bytes ({digests})"


def _rank_matrix(coll: str, alg, cases: list, refused: bool) -> list:
    """One (collective, algorithm) matrix: its cases, or three calls that must be refused."""
    return (_rank_expect_unfit if refused else _rank_cases)(coll, alg, cases)


def matrix_task(size: int, coll: str, alg, cases: list) -> tuple:
    """The arguments of :func:`_rank_matrix` for this matrix on a world of ``size`` ranks."""
    refused = unfit(coll, alg, size) is not None
    return coll, alg, cases[:3] if refused else cases, refused


def check_matrix(results: list, coll: str, refused: bool) -> None:
    if refused:
        for r, problems in enumerate(results):
            assert problems == [], f"rank {r}: {problems}"
    else:
        check_results(results, coll)


def run_matrix(world, coll: str, alg, cases: list) -> None:
    task = matrix_task(world.size, coll, alg, cases)
    check_matrix(world.run(_rank_matrix, *task), coll, task[3])


def run_batched(world, table, pair) -> None:
    """The matrix of ``pair`` from ``table`` (world -> {pair: matrix_task}): one task per
    world runs every pair's matrix (conftest.World.run_case), each test checks its own."""
    results = world.run_case(_rank_matrix, table, pair)
    check_matrix(results, pair[0], unfit(*pair, world.size) is not None)


def _shape_table(world) -> dict:
    return {(c, a): matrix_task(world.size, c, a, shape_cases(c, world.size))
            for c, a in PAIRS}


def _tiny_shape_table(world) -> dict:
    return {(c, a): matrix_task(world.size, c, a, [x for x in shape_cases(c, world.size)
                                                   if x["n"] <= 1000])
            for c, a in PAIRS}


def _op_dtype_table(world) -> dict:
    return {(c, a): matrix_task(world.size, c, a,
                                op_dtype_cases(c, world.size, full=a is None))
            for c, a in PAIRS if c in REDUCTIONS}


def _dtype_table(world) -> dict:
    cases = [{"n": 5, "root": world.size // 2, "inplace": False, "op": None, "dtype": dt,
              "seed": i} for i, dt in enumerate([*NUMERIC, "complex64", "bool"])]
    return {(c, a): matrix_task(world.size, c, a, cases)
            for c, a in PAIRS if c not in REDUCTIONS}


# -- tests ---------------------------------------------------------------------------------
# The matrix tests of one world run as one task per test function (run_batched), in the
# order of the tests; each test checks its pair's results.

@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_counts_roots_in_place(world, pair):
    run_batched(world, _shape_table, pair)


@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_counts_roots_in_place_tiny_segments(world_tiny, pair):
    """The same matrix with a 64-byte eager limit and 24-byte segments: every schedule's
    multi-segment and rendezvous paths, on small inputs."""
    run_batched(world_tiny, _tiny_shape_table, pair)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p[0] in REDUCTIONS], ids=_pair_id)
def test_ops_and_dtypes(world, pair):
    """The automatic choice runs the whole op x dtype product on every world; each named
    algorithm runs a covering subset (every dtype with two ops, every op with every dtype
    kind). The reduction kernel is the same for every algorithm; on fake ranks every
    algorithm runs a list of (dtype, op) pairs covering each at sizes 1..9
    (test_algorithms_fake.py), and every allreduce algorithm the whole product under
    hypothesis (test_allreduce_any_dtype_op)."""
    run_batched(world, _op_dtype_table, pair)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p[0] not in REDUCTIONS], ids=_pair_id)
def test_every_dtype_moves_exactly(world, pair):
    run_batched(world, _dtype_table, pair)
