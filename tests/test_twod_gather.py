"""The 2-D all-gather and reduce-scatter (pycomm/collectives/twod.py, issue 16).

Their groups (gather_grid); fake ranks (sizes 1..9, counts 0 and uneven, a non-commutative
op in rank order); fake hosts (block, cyclic and uneven placement; the link bytes of the
host grid); real processes by name and through the environment (the flight recorder names
the algorithm that ran), and on faked host layouts; the automatic choice never takes them.
Helpers and the ``shipped_table`` fixture come from test_twod.py (the 2-D all-reduce).
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest

import pycomm
import pycomm.collectives as algs
from pycomm import ops
from fakecomm import on_fake_hosts, run_fake  # tests/ is on sys.path under pytest
import test_algorithms_fake
import test_twod
from test_algorithms_fake import AFFINE, AFFINE_OP, _compose, affine_fold, affine_inputs
from test_twod import _faked, _fold, _inputs

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(test_algorithms_fake)     # its affine op runs on ranks

shipped_table = test_twod.shipped_table     # the fixture, shared with test_twod.py


# -- the 2-D all-gather and reduce-scatter (issue 16) -----------------------------------------
def test_gather_grid_groups_and_layout():
    from pycomm.collectives.twod import gather_grid
    # near-square: the rows are the inner groups, rank order (no copy), for the all-gather
    # and a commutative reduce-scatter
    assert gather_grid(6, None, True, False) == (((0, 1, 2), (3, 4, 5)), True, False)
    assert gather_grid(6, None, True, True) == (((0, 1, 2), (3, 4, 5)), True, False)
    # non-commutative reduce-scatter: the columns, so the rows are folded first
    assert gather_grid(6, None, False, True) == (((0, 3), (1, 4), (2, 5)), False, True)
    assert gather_grid(5, None, False, True) == (((0,), (1,), (2,), (3,), (4,)), True, True)
    # host grid: the columns (across hosts) are the inner groups; cyclic placement keeps
    # them consecutive
    assert gather_grid(4, ((0, 1), (2, 3)), True, False) == (((0, 2), (1, 3)), False, True)
    assert gather_grid(4, ((0, 2), (1, 3)), True, True) == (((0, 1), (2, 3)), True, True)
    # a non-commutative op across hosts, or uneven hosts: the near-square grid
    assert gather_grid(4, ((0, 2), (1, 3)), False, True) == (((0, 2), (1, 3)), False, True)
    assert gather_grid(5, ((0, 1, 2), (3, 4)), True, False) == (((0, 1, 2, 3, 4),), True,
                                                                 False)


def _ag_blocks(size, count, dtype):
    return [((np.arange(count) * 7 + 31 * q + 1) % 120).astype(dtype) for q in range(size)]


def _allgather_2d(cc, xs, count, dtype):
    buf = np.full(cc.size * count, 123, dtype=dtype)
    buf[cc.rank * count:(cc.rank + 1) * count] = xs[cc.rank]
    algs.REGISTRY["allgather"]["2d"].fn(cc, buf, count)
    return buf


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.uint8],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("count", [0, 1, 5])
@pytest.mark.parametrize("size", range(1, 8))
def test_fake_ranks_allgather(size, count, dtype):
    xs = _ag_blocks(size, count, dtype)
    for res in run_fake(size, lambda cc: _allgather_2d(cc, xs, count, dtype)):
        np.testing.assert_array_equal(res, np.concatenate(xs))


def _reduce_scatter_2d(cc, xs, counts, op, block):
    out = np.full(counts[cc.rank], 99, dtype=xs[0].dtype)
    send = xs[cc.rank].copy()
    if block:
        algs.REGISTRY["reduce_scatter_block"]["2d"].fn(cc, send, out, op)
    else:
        algs.REGISTRY["reduce_scatter"]["2d"].fn(cc, send, out, counts, op)
    assert send.tobytes() == xs[cc.rank].tobytes()      # sendbuf untouched
    return out


def _check_reduce_scatter(results, expected, counts, close=False):
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    for rank, res in enumerate(results):
        want = expected[offs[rank]:offs[rank + 1]]
        assert res.dtype == want.dtype
        if close:
            np.testing.assert_allclose(res, want, rtol=1e-5, err_msg=f"rank {rank}")
        else:
            assert np.array_equal(res, want), f"rank {rank}"


def _counts(size, per):
    """``per`` elements each, or "uneven": zeros, odd sizes, not divisible by the grid."""
    return [per] * size if per != "uneven" else [(3 * q + 1) % 4 for q in range(size)]


@pytest.mark.parametrize("dtype,op", [(np.int64, ops.SUM), (np.int32, ops.MAX),
                                      (np.float64, ops.SUM), (np.int16, ops.PROD)],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
@pytest.mark.parametrize("per", [0, 1, 3, "uneven"])
@pytest.mark.parametrize("size", range(1, 8))
def test_fake_ranks_reduce_scatter(size, per, dtype, op):
    counts = _counts(size, per)
    lo, hi = (-2, 3) if op is ops.PROD else (-8, 9)
    xs = _inputs(size, sum(counts), dtype, lo, hi)
    if dtype == np.float64:
        xs = [x + np.linspace(0, 1, x.size) / 3 for x in xs]
    with np.errstate(over="ignore"):
        expected = _fold(op, xs)
        results = run_fake(size, lambda cc: _reduce_scatter_2d(cc, xs, counts, op,
                                                               per != "uneven"))
    _check_reduce_scatter(results, expected, counts, close=dtype == np.float64)


@pytest.mark.parametrize("per", [1, 3, "uneven"])
@pytest.mark.parametrize("size", range(2, 10))
def test_fake_ranks_reduce_scatter_noncommutative_in_rank_order(size, per):
    counts = _counts(size, per)
    xs = affine_inputs(size, sum(counts))
    with np.errstate(over="ignore"):
        expected = affine_fold(xs)
        results = run_fake(size, lambda cc: _reduce_scatter_2d(cc, xs, counts, AFFINE_OP,
                                                               per != "uneven"))
    _check_reduce_scatter(results, expected, counts)


HOSTMAPS = [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2],
            [0, 0, 0, 1, 1], [0, 1, 0, 1, 0], [0, 1, 2]]
HOSTMAP_IDS = ["2x2", "2x2c", "2x3", "3x2c", "3+2", "3+2c", "3x1"]


@pytest.mark.parametrize("count", [1, 6, 500])
@pytest.mark.parametrize("hostmap", HOSTMAPS, ids=HOSTMAP_IDS)
def test_fake_hosts_allgather_sends_each_block_once_per_host(hostmap, count):
    size, nhosts = len(hostmap), len(set(hostmap))
    xs = _ag_blocks(size, count, np.int64)
    links = []
    for res, sent in on_fake_hosts(hostmap, lambda cc: _allgather_2d(cc, xs, count, np.int64)):
        np.testing.assert_array_equal(res, np.concatenate(xs))
        links.append(sent)
    if size % nhosts == 0:      # the host grid: each block crosses to each other host once
        assert sum(links) == size * (nhosts - 1) * count * 8


@pytest.mark.parametrize("per", [1, 5, 300, "uneven"])
@pytest.mark.parametrize("hostmap", HOSTMAPS, ids=HOSTMAP_IDS)
def test_fake_hosts_reduce_scatter(hostmap, per):
    size, nhosts = len(hostmap), len(set(hostmap))
    counts = _counts(size, per)
    block = per != "uneven"
    xs = _inputs(size, sum(counts), np.int64)
    links = []
    for op in (ops.SUM, ops.MAX):
        found = on_fake_hosts(hostmap, lambda cc: _reduce_scatter_2d(cc, xs, counts, op, block))
        _check_reduce_scatter([r for r, _ in found], _fold(op, xs), counts)
        links.append(sum(s for _, s in found))
    if size % nhosts == 0 and block:
        # the host grid: a host's partial of each other host's blocks crosses once (the
        # model's pick inside a column may fold, as recursive halving on 3 hosts does)
        least = size * (nhosts - 1) * per * 8
        assert least <= links[0] <= 2 * least
    xs = affine_inputs(size, sum(counts))       # non-commutative: near-square, rank order
    with np.errstate(over="ignore"):
        found = on_fake_hosts(hostmap, lambda cc: _reduce_scatter_2d(cc, xs, counts,
                                                                     AFFINE_OP, block))
        _check_reduce_scatter([r for r, _ in found], affine_fold(xs), counts)


def _rs_vector(q, n, dtype=np.int64):
    return ((np.arange(n) * (q + 3) + 5 * q) % 101).astype(dtype)


def _affine_vector(q, n):
    m = np.empty(n, dtype=AFFINE)
    m["a"], m["b"] = q + 2, np.arange(n, dtype=np.uint64) + 10 * q
    return m


def _uneven(p):
    return [(3 * q + 1) % 4 for q in range(p)]


def _rank_gather_cases(comm=None):
    """Every case of the 2-D all-gather and reduce-scatter on real ranks, by name, and which
    algorithm the flight recorder says ran."""
    from pycomm import trace
    comm = pycomm.COMM_WORLD if comm is None else comm
    r, p = comm.rank, comm.size
    out, ran = {}, set()

    def done():
        ran.add(trace.last_completed()[0][4])
    for count in (0, 1, 7, 1001):
        y = np.full(p * count, -1, dtype=np.int64)
        comm.Allgather(_ag_blocks(p, count, np.int64)[r], y, algorithm="2d")
        done()
        out[("ag", count)] = y
    f = np.zeros(p * 5, dtype=np.float32)
    f[r * 5:(r + 1) * 5] = _ag_blocks(p, 5, np.float32)[r]
    comm.Allgather(pycomm.IN_PLACE, f, algorithm="2d")
    out["ag in place"] = f
    for count in (0, 1, 3):
        y = np.full(count, -1, dtype=np.int64)
        comm.Reduce_scatter_block(_rs_vector(r, p * count), y, algorithm="2d")
        done()
        out[("rsb", count)] = y
    z = _rs_vector(r, p * 4, np.int32)
    comm.Reduce_scatter_block(pycomm.IN_PLACE, z, op=pycomm.MAX, algorithm="2d")
    out["rsb max"] = z[:4]
    d = _rs_vector(r, p * 3, np.float64) / 7
    e = np.empty(3)
    comm.Reduce_scatter_block(d, e, algorithm="2d")
    out["rsb float"] = e
    op = pycomm.Op.Create(_compose, commute=False)
    m = np.empty(2, dtype=AFFINE)
    with np.errstate(over="ignore"):
        comm.Reduce_scatter_block(_affine_vector(r, p * 2), m, op=op, algorithm="2d")
        out["rsb affine"] = m
        counts = _uneven(p)
        v = np.empty(counts[r], dtype=AFFINE)
        comm.Reduce_scatter(_affine_vector(r, sum(counts)), v, counts, op=op, algorithm="2d")
        out["rs affine"] = v
    w = np.empty(counts[r], dtype=np.int64)
    comm.Reduce_scatter(_rs_vector(r, sum(counts)), w, counts, algorithm="2d")
    done()
    out["rs"] = w
    out["ran"] = ran
    # forced through the environment; the automatic choice never takes it
    names = {"allgather": 1 << 20, "reduce_scatter_block": 1 << 20, "reduce_scatter": 0}
    for coll in names:
        os.environ["PYCOMM_ALGORITHM_" + coll.upper()] = "2d"
    pycomm.config.reload()
    try:
        out["env"] = {c: comm.chosen_algorithm(c, n) for c, n in names.items()}
        g = np.zeros(p * 2, dtype=np.int64)
        g[2 * r:2 * r + 2] = r
        comm.Allgather(pycomm.IN_PLACE, g)
        out["env ag"] = (g, trace.last_completed()[0][4])
        s = np.empty(2, dtype=np.int64)
        comm.Reduce_scatter_block(np.full(2 * p, r, dtype=np.int64), s)
        out["env rsb"] = (s, trace.last_completed()[0][4])
    finally:
        for coll in names:
            del os.environ["PYCOMM_ALGORITHM_" + coll.upper()]
        pycomm.config.reload()
    out["auto"] = {comm.chosen_algorithm(c, n, algorithm="auto")
                   for c in ("allgather", "reduce_scatter_block") for n in (8, 1 << 20, 1 << 24)}
    return out


def _check_gather_cases(out, p, rank=0):
    for count in (0, 1, 7, 1001):
        np.testing.assert_array_equal(out[("ag", count)],
                                      np.concatenate(_ag_blocks(p, count, np.int64)))
    np.testing.assert_array_equal(out["ag in place"], np.concatenate(_ag_blocks(p, 5, np.float32)))
    for count in (0, 1, 3):
        total = np.sum([_rs_vector(q, p * count) for q in range(p)], axis=0)
        np.testing.assert_array_equal(out[("rsb", count)], total[rank * count:(rank + 1) * count])
    top = np.max([_rs_vector(q, p * 4, np.int32) for q in range(p)], axis=0)
    np.testing.assert_array_equal(out["rsb max"], top[rank * 4:(rank + 1) * 4])
    fl = np.sum([_rs_vector(q, p * 3, np.float64) / 7 for q in range(p)], axis=0)
    np.testing.assert_allclose(out["rsb float"], fl[rank * 3:(rank + 1) * 3], rtol=1e-12)
    counts = _uneven(p)
    lo, hi = sum(counts[:rank]), sum(counts[:rank + 1])
    with np.errstate(over="ignore"):
        am = affine_fold([_affine_vector(q, p * 2) for q in range(p)])
        assert np.array_equal(out["rsb affine"], am[rank * 2:(rank + 1) * 2]), rank
        av = affine_fold([_affine_vector(q, sum(counts)) for q in range(p)])
        assert np.array_equal(out["rs affine"], av[lo:hi]), rank
    np.testing.assert_array_equal(
        out["rs"], np.sum([_rs_vector(q, sum(counts)) for q in range(p)], axis=0)[lo:hi])


def test_real_ranks_allgather_reduce_scatter_2d(world_small):
    p = world_small.size
    for rank, out in enumerate(world_small.run(_rank_gather_cases)):
        _check_gather_cases(out, p, rank)
        assert out["ran"] == {"2d"}, out["ran"]         # the flight recorder's algorithm
        assert out["env"] == {"allgather": "2d", "reduce_scatter_block": "2d",
                              "reduce_scatter": "2d"}
        g, ran = out["env ag"]
        np.testing.assert_array_equal(g, np.repeat(np.arange(p), 2))
        assert ran == "2d"
        s, ran = out["env rsb"]
        np.testing.assert_array_equal(s, np.full(2, p * (p - 1) // 2))
        assert ran == "2d"
        assert "2d" not in out["auto"]


def _rank_gather_on_faked_hosts(hostmap):
    comm = _faked(hostmap)
    try:
        return _rank_gather_cases(comm)
    finally:
        comm.Free()


@pytest.mark.parametrize("world", [(4, "shm")], indirect=True, ids=["n4-shm"])
def test_real_ranks_gather_on_faked_host_layouts(world):
    for hostmap in ([0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]):     # block, cyclic, uneven
        for rank, out in enumerate(world.run(_rank_gather_on_faked_hosts, hostmap)):
            _check_gather_cases(out, 4, rank)
            assert out["ran"] == {"2d"}


def test_unknown_names_list_2d_and_auto_leaves_it_out(shipped_table):
    for coll in ("allgather", "reduce_scatter", "reduce_scatter_block"):
        with pytest.raises(pycomm.ArgumentError, match="2d"):
            algs.choose(coll, 8, 4, requested="2-d")
        assert algs.choose(coll, 1 << 20, 6, requested="2d")[0] == "2d"
        assert algs.choose(coll, 1 << 20, 6, requested="2d", commutative=False)[0] == "2d"
        for n in (8, 1 << 16, 1 << 24):
            for hosts in (None, (2, 2), (3, 3)):
                p = 4 if hosts is None else sum(hosts)
                assert algs.choose(coll, n, p, hosts=hosts, transport="net")[0] != "2d"
        # priced (listed by model_time) on the near-square grid
        assert 0 < algs.model_time(coll, "2d", 1 << 20, 6) < float("inf")
