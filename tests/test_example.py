"""Fast checks of examples/train_data_parallel.py: its math without communication, then a run.

The unit tests import the example as a module; they need scikit-learn (the ``test`` extra,
for the digits data) and fail without it. The end-to-end test starts 3 ranks (a world size
that does not divide the batch) through ``launch.py``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_data_parallel.py"


@pytest.fixture(scope="module")
def ex():
    """The example script, imported as a module."""
    spec = importlib.util.spec_from_file_location("train_data_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(ex):
    return ex.load_data(seed=0)


def test_split_is_deterministic_and_standardized(ex, data):
    X, y, Xt, yt = data
    assert X.shape == (1438, 64) and Xt.shape == (359, 64)
    assert np.allclose(X.mean(axis=0), 0.0, atol=1e-12)
    again = ex.load_data(seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(data, again, strict=True))


def test_gradient_matches_finite_differences(ex, data):
    X, y = data[0][:20], data[1][:20]
    d, h = 64, 8
    flat = ex.init_params(d, h, 10, seed=1)
    g = np.zeros(ex.MLP.count(d, h, 10))
    ex.loss_and_grad_sum(ex.MLP.over(flat, d, h, 10), X, y, ex.MLP.over(g, d, h, 10))
    rng = np.random.default_rng(2)
    scratch = np.zeros_like(g)
    for i in rng.choice(len(flat), size=25, replace=False):
        eps = 1e-6
        plus, minus = flat.copy(), flat.copy()
        plus[i] += eps
        minus[i] -= eps
        lp = ex.loss_and_grad_sum(ex.MLP.over(plus, d, h, 10), X, y,
                                  ex.MLP.over(scratch, d, h, 10))
        lm = ex.loss_and_grad_sum(ex.MLP.over(minus, d, h, 10), X, y,
                                  ex.MLP.over(scratch, d, h, 10))
        assert (lp - lm) / (2 * eps) == pytest.approx(g[i], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 200])
def test_shard_gradients_sum_to_the_batch_gradient(ex, data, size):
    """Summed shard gradients equal the whole batch's, also with empty shards (size 200)."""
    X, y = data[0], data[1]
    d, h = 64, 16
    flat = ex.init_params(d, h, 10, seed=3)
    p = ex.MLP.over(flat, d, h, 10)
    batch = ex.batches(len(y), 128, seed=0, epoch=0)[0]
    whole = np.zeros(ex.MLP.count(d, h, 10))
    loss = ex.loss_and_grad_sum(p, X[batch], y[batch], ex.MLP.over(whole, d, h, 10))
    total, total_loss = np.zeros_like(whole), 0.0
    for shard in np.array_split(batch, size):
        part = np.zeros_like(whole)
        total_loss += ex.loss_and_grad_sum(p, X[shard], y[shard], ex.MLP.over(part, d, h, 10))
        total += part
    assert np.allclose(total, whole, rtol=1e-12, atol=1e-12)
    assert total_loss == pytest.approx(loss, rel=1e-12)


def test_single_process_training_reaches_accuracy(ex, data):
    args = SimpleNamespace(epochs=10, batch_size=128, lr=0.05, momentum=0.9, hidden=64, seed=0)
    flat0 = ex.init_params(64, 64, 10, seed=0)
    params, (_, _, steps) = ex.train(args, data, flat0)
    assert steps == 10 * 12
    assert ex.accuracy(ex.MLP.over(params, 64, 64, 10), data[2], data[3]) >= 0.9


def test_example_runs_on_three_ranks():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "-n", "3", str(EXAMPLE), "--epochs", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert proc.stdout.count("PASS") >= 4
