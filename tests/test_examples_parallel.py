"""The parallel-training examples (issue 18): their pieces without communication, then runs.

The unit tests import the examples as modules and check the math each scheme rests on:
the layers against finite differences, Megatron's split block against the unsplit one,
the pipeline schedules, the buckets, the shards. The end-to-end tests run every example at
its ``--small`` size through ``launch.py`` (3 to 8 s each on 2 cores) and require its
exit status 0, no FAIL and its PASS lines: each example asserts its result against a
single-process reference itself. Needs scikit-learn (the ``examples`` extra, also in
``test``) for the digits data, and fails without it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

sys.path.insert(0, str(EXAMPLES))   # the examples import _training as a sibling module


@pytest.fixture(scope="module")
def C():
    return importlib.import_module("_training")


@pytest.fixture(scope="module")
def data(C):
    return C.load_data(seed=0)


def test_mlp_gradient_matches_finite_differences(C, data):
    dims = [64, 12, 9, 10]
    flat = C.init_mlp(dims, seed=1)
    X, y = data[0][:16], data[1][:16]

    def loss_and_grad(w):
        g = np.zeros_like(w)
        P, G = C.Params.over(w, dims), C.Params.over(g, dims)
        out, cache = C.mlp_forward(P, X)
        loss, d = C.softmax_xent(out, y)
        C.mlp_backward(P, G, cache, d)
        return loss, g

    _, g = loss_and_grad(flat)
    for i in np.random.default_rng(2).choice(flat.size, size=20, replace=False):
        plus, minus = flat.copy(), flat.copy()
        plus[i] += 1e-6
        minus[i] -= 1e-6
        fd = (loss_and_grad(plus)[0] - loss_and_grad(minus)[0]) / 2e-6
        assert fd == pytest.approx(g[i], rel=1e-5, abs=1e-6)


def test_mlp_in_stages_equals_the_whole(C, data):
    """Forward and backward cut at a stage boundary give the whole model's gradient."""
    dims = [64, 16, 16, 16, 10]
    flat = C.init_mlp(dims, seed=3)
    P = C.Params.over(flat, dims)
    X, y = data[0][:20], data[1][:20]
    whole = np.zeros_like(flat)
    out, cache = C.mlp_forward(P, X)
    _, d = C.softmax_xent(out, y)
    C.mlp_backward(P, C.Params.over(whole, dims), cache, d)
    parts = np.zeros_like(flat)
    G = C.Params.over(parts, dims)
    h, c0 = C.mlp_forward(P, X, 0, 1)
    out, c1 = C.mlp_forward(P, h, 2, 3)
    _, d = C.softmax_xent(out, y)
    dh = C.mlp_backward(P, G, c1, d, first=2, need_dx=True)
    assert dh.shape == h.shape
    C.mlp_backward(P, G, c0, dh, first=0)
    assert np.allclose(parts, whole, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_megatron_split_block_sums_to_the_whole_block(C, p):
    rng = np.random.default_rng(p)
    n, d, f = 6, 5, 12
    h, A, a = rng.normal(size=(n, d)), rng.normal(size=(d, f)), rng.normal(size=f)
    B, dout = rng.normal(size=(f, d)), rng.normal(size=(n, d))
    grads = [np.zeros((d, f)), np.zeros(f), np.zeros((f, d))]
    out, cache = C.tp_block_forward(h, A, a, B)
    dh = C.tp_block_backward(cache, A, B, dout, *grads)
    out_sum, dh_sum = np.zeros_like(out), np.zeros_like(dh)
    for cols in np.array_split(np.arange(f), p):
        s = slice(cols[0], cols[-1] + 1)
        part, c = C.tp_block_forward(h, A[:, s].copy(), a[s], B[s].copy())
        g = [np.zeros((d, len(cols))), np.zeros(len(cols)), np.zeros((len(cols), d))]
        dh_sum += C.tp_block_backward(c, A[:, s].copy(), B[s].copy(), dout.copy(), *g)
        out_sum += part
        assert np.allclose(g[0], grads[0][:, s]) and np.allclose(g[1], grads[1][s])
        assert np.allclose(g[2], grads[2][s])
    assert np.allclose(out_sum, out) and np.allclose(dh_sum, dh)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 8), (4, 2), (3, 5)])
def test_pipeline_schedules(kind, p, m):
    pp = importlib.import_module("pipeline_parallel")
    for s in range(p):
        ops = pp.schedule(kind, s, p, m)
        assert sorted(ops) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        assert all(ops.index(("F", j)) < ops.index(("B", j)) for j in range(m))
        alive = peak = 0
        for op, _ in ops:
            alive += 1 if op == "F" else -1
            peak = max(peak, alive)
        # GPipe keeps every micro-batch's activations; 1F1B at most p - s of them
        assert peak == (m if kind == "gpipe" else min(m, p - s))
    layers = pp.stage_layers(p, 2)
    assert layers[0][0] == 0 and all(b[0] == a[1] + 1 for a, b in zip(layers, layers[1:]))
    assert layers[-1][1] == 2 * p + 1


def test_buckets_cover_the_gradient_in_backward_order(C):
    bdp = importlib.import_module("bucketed_data_parallel")
    dims = [64, 100, 100, 100, 10]
    P = C.Params.over(np.zeros(C.Params.count(dims)), dims)
    for cap in (1, 8 * 100 * 101, 10**9):
        buckets = bdp.make_buckets(P, cap)
        assert buckets[0][1] == len(dims) - 2 and buckets[-1][0] == 0
        assert all(b[1] == a[0] - 1 for a, b in zip(buckets, buckets[1:]))
        assert all(8 * (P.offsets[last + 1] - P.offsets[first]) >= cap
                   for first, last in buckets[:-1])
    assert len(bdp.make_buckets(P, 1)) == len(dims) - 1
    assert len(bdp.make_buckets(P, 10**9)) == 1


def test_tensor_parallel_shards_join_back(C):
    tp = importlib.import_module("tensor_parallel")
    full = tp.full_init(8, 2, seed=0)

    class FakeTP:          # the object allgather of 3 ranks, each shard known here
        size = 3

        def allgather(self, _):
            return [{k: v for k, v in tp.shard(full, 2, r, 3).items()
                     if k in tp.sharded_keys(2)} for r in range(3)]

    joined = tp.unshard(tp.shard(full, 2, 0, 3), 2, FakeTP())
    assert all(np.array_equal(joined[k], full[k]) for k in full)


def test_parameter_server_shards_and_zero2_buckets(C):
    ps = importlib.import_module("parameter_server")
    for n, s in [(10, 3), (7, 7), (1000, 2)]:
        bounds = ps.shard_bounds(n, s)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    zero = importlib.import_module("sharded_data_parallel")
    dims = [5, 4, 3]
    scratch = np.zeros(5 * 4 + 4)
    g = zero.aliased_grads(dims, scratch)
    g.W[1][...] = 1.0
    assert scratch[:12].sum() == 12   # every layer's views start at the scratch's start


EXPECTED = [  # (example, ranks, PASS lines it prints when every check holds)
    ("bucketed_data_parallel.py", 4, 6),
    ("tensor_parallel.py", 4, 7),
    ("pipeline_parallel.py", 4, 4),
    ("sharded_data_parallel.py", 4, 6),
    ("parameter_server.py", 3, 7),
    ("hybrid_parallel.py", 4, 5),
]


@pytest.mark.parametrize("script,ranks,passes", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_example_runs_small(script, ranks, passes):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "-n", str(ranks), str(EXAMPLES / script),
         "--small"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "FAIL" not in out, out
    assert out.count("PASS") == passes, out
    assert out.rstrip().endswith("PASS"), out
