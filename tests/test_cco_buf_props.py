"""Collective buffer API on real worlds, beyond test_cco_buf.py's matrices: every barrier
algorithm waits for the last rank; a non-commutative user op keeps rank order in every
reduction algorithm (or is refused by those that need commutativity); hypothesis draws
random reduction and data-movement cases (collective, algorithm, count, root, in place,
op, dtype) on the reduced worlds.

The cases run through test_cco_buf.py's rank functions and checks (run_matrix).
"""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm
from test_cco_buf import (COLLECTIVES, IN_PLACE_OK, NUMERIC, OPS, PAIRS, REDUCTIONS, _pair_id,
                          op_accepts, run_matrix, unfit)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rank_barrier(alg, rounds: int, flag: str):
    """Rank 0 arrives late, creating ``flag`` just before it enters; a rank that leaves
    the barrier before rank 0 arrived finds no flag (it looks at once, while rank 0 is
    still sleeping). Whether the flag is there when each rank leaves."""
    comm = pycomm.COMM_WORLD
    for _ in range(rounds):
        comm.Barrier(algorithm=alg)
    if comm.rank == 0:
        time.sleep(0.05)
        open(flag, "x").close()
    comm.Barrier(algorithm=alg)
    return os.path.exists(flag)


@pytest.mark.parametrize("alg", [*pycomm.algorithms("barrier"), None],
                         ids=lambda a: a or "auto")
def test_barrier_waits_for_the_last_rank(world, alg, tmp_path):
    left_after = world.run(_rank_barrier, alg, 20, str(tmp_path / "rank0-arrived"))
    for rank in range(1, world.size):
        assert left_after[rank], f"rank {rank} left the barrier before rank 0 arrived"


# -- non-commutative user op: rank order ---------------------------------------------------

def _concat_digits(invec, inoutvec):
    """(v1, p1) o (v2, p2) = (v1*p2 + v2, p1*p2): appends base-8 digit strings; associative,
    not commutative, one complex number per element (so any chunking is legal)."""
    return (invec.real * inoutvec.imag + inoutvec.real) + 1j * (invec.imag * inoutvec.imag)


def _rank_noncommutative(coll: str, alg, n: int):
    comm = pycomm.COMM_WORLD
    op = pycomm.Op.Create(_concat_digits, commute=False)
    size, rank = comm.size, comm.rank
    try:
        if coll == "allreduce":
            buf = np.full(n, rank + 8j)
            comm.Allreduce(pycomm.IN_PLACE, buf, op, algorithm=alg)
        elif coll == "reduce":
            buf = np.full(n, rank + 8j)
            out = np.zeros(n, complex)
            comm.Reduce(buf, out, op, root=size - 1, algorithm=alg)
            buf = out if rank == size - 1 else None
        else:
            buf = np.zeros(n, complex)
            comm.Reduce_scatter_block(np.full(size * n, rank + 8j), buf, op, algorithm=alg)
    except pycomm.ArgumentError as exc:
        return "refused", str(exc)
    return "ran", None if buf is None else buf.real.tolist()


def _noncommutative_table(world) -> dict:
    return {(pair, n): (*pair, n) for n in (1, 37)
            for pair in PAIRS if pair[0] in REDUCTIONS}


@pytest.mark.parametrize("n", [1, 37])
@pytest.mark.parametrize("pair", [p for p in PAIRS if p[0] in REDUCTIONS], ids=_pair_id)
def test_non_commutative_op_keeps_rank_order(world, pair, n):
    """One task per world runs every (pair, n) (conftest.World.run_case)."""
    coll, alg = pair
    want = float(int("".join(str(r) for r in range(world.size)), 8))
    results = world.run_case(_rank_noncommutative, _noncommutative_table, (pair, n))
    if unfit(coll, alg, world.size, commutative=False):
        assert all(kind == "refused" and "commutative" in msg for kind, msg in results)
        return
    for rank, (kind, values) in enumerate(results):
        assert kind == "ran", f"rank {rank}: {values}"
        if values is not None:
            assert values == [want] * n, f"rank {rank}: operands combined out of rank order"


# -- properties ----------------------------------------------------------------------------

@st.composite
def reduction_case(draw):
    coll = draw(st.sampled_from(REDUCTIONS))
    alg = draw(st.sampled_from([*pycomm.algorithms(coll), None]))
    dtype = draw(st.sampled_from(NUMERIC))
    op = draw(st.sampled_from([o for o in OPS if op_accepts(o, dtype)]))
    case = {"n": draw(st.integers(0, 300)), "root": draw(st.integers(0, 7)),
            "inplace": draw(st.booleans()), "op": op, "dtype": dtype,
            "seed": draw(st.integers(0, 2**32 - 1))}
    return coll, alg, case


@settings(max_examples=8, deadline=None)
@given(reduction_case())
def test_reduction_property(world_small, drawn):
    coll, alg, case = drawn
    case["root"] %= world_small.size
    run_matrix(world_small, coll, alg, [case])


@st.composite
def movement_case(draw):
    coll = draw(st.sampled_from([c for c in COLLECTIVES if c not in REDUCTIONS]))
    alg = draw(st.sampled_from([*pycomm.algorithms(coll), None]))
    case = {"n": draw(st.integers(0, 3000)), "root": draw(st.integers(0, 7)),
            "inplace": draw(st.booleans()) and coll in IN_PLACE_OK, "op": None,
            "dtype": draw(st.sampled_from([*NUMERIC, "bool"])),
            "seed": draw(st.integers(0, 2**32 - 1))}
    return coll, alg, case


@settings(max_examples=8, deadline=None)
@given(movement_case())
def test_data_movement_property(world_small, drawn):
    coll, alg, case = drawn
    case["root"] %= world_small.size
    run_matrix(world_small, coll, alg, [case])
