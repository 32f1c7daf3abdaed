"""Defects found by the differential fuzzing campaign of 2026-11-26 (tests/fuzzgen.py),
each as a minimal deterministic reproduction.

1. pycomm.MPI: a user op on a derived datatype of several basic elements (an
   ``MPI.DOUBLE.Create_contiguous(2)`` complex number, an affine map of two int64) was
   handed parts of items. The MPI layer passes the Communicator the flat array of basic
   elements, and the schedules split a buffer between ranks and into segments at any
   element (the ring's and Rabenseifner's blocks, the halving's segments), so the op got
   4097 doubles of a pair buffer, and raised (ValueError from the user's function) or,
   for a function that does not check, combined the second half of one pair with the
   first of the next. MPI calls a user op on whole items. Campaign: seeds 100132 (2 ranks,
   tcp) and 100285 (4 ranks, shm) of the generator as it was then (its later dimensions
   draw from their own generator, so a replay now runs a neighbouring program); the test
   below is the reduced case.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from conftest import World

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="session", params=[(2, "shm"), (3, "tcp")],
                ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    """Two worlds of the shared matrix: the smallest pair, an odd size on tcp."""
    return World(*request.param)


def _cmul(inbuf, inoutbuf, datatype):
    """Complex product on (re, im) pairs of doubles, as a C user would write it."""
    a = np.frombuffer(inbuf, dtype=np.float64)
    b = np.frombuffer(inoutbuf, dtype=np.float64)
    re = a[0::2] * b[0::2] - a[1::2] * b[1::2]
    im = a[0::2] * b[1::2] + a[1::2] * b[0::2]
    b[0::2] = re
    b[1::2] = im


def _affine(inbuf, inoutbuf, datatype):
    """(a1, b1) ∘ (a2, b2) = x -> a2 (a1 x + b1) + b2 on pairs of int64: not commutative."""
    x = np.frombuffer(inbuf, dtype=np.int64).reshape(-1, 2)
    y = np.frombuffer(inoutbuf, dtype=np.int64).reshape(-1, 2)
    a = x[:, 0] * y[:, 0]
    b = y[:, 0] * x[:, 1] + y[:, 1]
    y[:, 0] = a
    y[:, 1] = b


def _affine_fold(parts):
    acc = parts[0].reshape(-1, 2).copy()
    for p in parts[1:]:
        y = p.reshape(-1, 2)
        acc = np.stack([acc[:, 0] * y[:, 0], y[:, 0] * acc[:, 1] + y[:, 1]], 1)
    return acc.reshape(-1)


def _user_op_on_pairs(count):
    from pycomm import MPI
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    out = {}
    cplx = MPI.DOUBLE.Create_contiguous(2).Commit()
    pair = MPI.INT64_T.Create_contiguous(2).Commit()
    cmul = MPI.Op.Create(_cmul, commute=True)
    affine = MPI.Op.Create(_affine, commute=False)
    try:
        # complex product of (q + 1) + 1j over the ranks, a commutative user op
        x = np.tile([r + 1.0, 1.0], count)
        got = np.zeros(2 * count)
        comm.Allreduce([x, count, cplx], [got, count, cplx], op=cmul)
        want = np.prod([q + 1.0 + 1j for q in range(n)])
        out["allreduce cmul"] = bool(np.all(got[0::2] == want.real)
                                     and np.all(got[1::2] == want.imag))

        def inp(q, m):
            v = np.random.default_rng([q, m]).integers(-2**40, 2**40, 2 * m)
            v[0::2] |= 1
            return v

        got = np.zeros(2 * count, np.int64)
        comm.Allreduce([inp(r, count), count, pair], [got, count, pair], op=affine)
        out["allreduce affine"] = bool(np.array_equal(
            got, _affine_fold([inp(q, count) for q in range(n)])))
        got = np.zeros(2 * count, np.int64)
        comm.Reduce([inp(r, count), count, pair], [got, count, pair], op=affine, root=n - 1)
        out["reduce affine"] = r != n - 1 or bool(np.array_equal(
            got, _affine_fold([inp(q, count) for q in range(n)])))
        got = np.zeros(2 * count, np.int64)
        comm.Scan([inp(r, count), count, pair], [got, count, pair], op=affine)
        out["scan affine"] = bool(np.array_equal(
            got, _affine_fold([inp(q, count) for q in range(r + 1)])))
        # recvcounts in items of the datatype: rank i gets count + i pairs
        counts = [count + i for i in range(n)]
        total, lo = sum(counts), sum(counts[:r])
        got = np.zeros(2 * counts[r], np.int64)
        comm.Reduce_scatter([inp(r, total), total, pair], [got, counts[r], pair],
                            recvcounts=counts, op=affine)
        out["reduce_scatter affine"] = bool(np.array_equal(
            got, _affine_fold([inp(q, total)[2 * lo:2 * (lo + counts[r])]
                               for q in range(n)])))
    finally:
        cmul.Free()
        affine.Free()
        cplx.Free()
        pair.Free()
    return out


@pytest.mark.parametrize("count", [3, 4097, 40001])
def test_mpi_user_op_on_a_derived_datatype_sees_whole_items(world, count):
    for per_rank in world.run(_user_op_on_pairs, count):
        assert per_rank == {k: True for k in per_rank}, per_rank
