"""The cost model's prices (pycomm.tuning.cost): the step models against Thakur et al.'s
textbook times (power-of-two schedules and the fold included), the constants of exchange
steps (alpha_x) and of rendezvous messages, the memory lanes and the exchange wake-ups of
oversubscribed cores, each from a table written for the test (PYCOMM_TUNE_FILE).
"""

from __future__ import annotations

import json

import pytest

import pycomm.collectives as algs
import pycomm.tuning.cost as cost


# Textbook values (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
# communication operations in MPICH", sections 3-4), written out by hand for a few (n, p):
# with a core per rank, one protocol, no scratch cost (σ = 0) and an exchange step as dear
# as a one-way message, the step models the choice evaluates must reduce to them.
A, B, G = 1e-5, 1e-9, 5e-10     # α, β, γ
L8, Q6 = 3, 2                   # log2 8; log2 of 6's power-of-two group (4)


def _textbook(n, p):
    """(collective, algorithm) -> Thakur et al.'s time of n bytes on p ranks (closed
    forms; the fold of a non-power-of-two p as in their section 4.3)."""
    L = (p - 1).bit_length()
    frac = (p - 1) / p
    return {
        ("barrier", "dissemination"): L * A,
        ("barrier", "binomial"): 2 * L * A,
        ("bcast", "binomial"): L * (A + n * B),
        ("bcast", "scatter_allgather"): (L + p - 1) * A + 2 * n * frac * B,
        ("reduce", "binomial"): L * (A + n * B + n * G),
        ("gather", "linear"): (p - 1) * A + n * frac * B,
        ("gather", "binomial"): L * A + n * frac * B,
        ("scatter", "linear"): (p - 1) * A + n * frac * B,
        ("scatter", "binomial"): L * A + n * frac * B,
        ("allgather", "ring"): (p - 1) * A + n * frac * B,
        ("alltoall", "pairwise"): (p - 1) * A + n * frac * B,
        ("alltoall", "bruck"): L * (A + n / 2 * B),
        ("reduce_scatter", "ring"): (p - 1) * A + n * frac * (B + G),
        ("reduce_scatter", "pairwise"): (p - 1) * A + n * frac * (B + G),
        ("allreduce", "ring"): 2 * (p - 1) * A + 2 * n * frac * B + n * frac * G,
        ("allreduce", "binomial"): 2 * L * (A + n * B) + L * n * G,
        ("scan", "recursive_doubling"): L * (A + n * B + 2 * n * G),
    }


@pytest.fixture
def textbook_constants(tmp_path, monkeypatch):
    """A table of α, β, γ alone (σ = 0; α_x, α_rndv, β_rndv default to α and β; no
    lanes, no wake-ups)."""
    path = tmp_path / "textbook.json"
    path.write_text(json.dumps({"shm": {"alpha": A, "beta": B, "gamma": G, "sigma": 0.0}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    monkeypatch.delenv("PYCOMM_SEGMENT_BYTES", raising=False)
    return path


@pytest.mark.parametrize("p", [2, 5, 8])
@pytest.mark.parametrize("n", [8, 1 << 16])   # one segment per ring chunk and halving step
def test_step_models_give_the_textbook_times(n, p, textbook_constants):
    for (coll, alg), want in _textbook(n, p).items():
        assert algs.model_time(coll, alg, n, p) == pytest.approx(want, rel=1e-12), (coll, alg)


def test_power_of_two_schedules_give_the_textbook_times(textbook_constants):
    n, p = 1 << 16, 8
    frac = (p - 1) / p
    assert algs.model_time("allgather", "recursive_doubling", n, p) == \
        pytest.approx(L8 * A + n * frac * B)
    assert algs.model_time("allreduce", "recursive_doubling", n, p) == \
        pytest.approx(L8 * (A + n * B + n * G))
    # Rabenseifner: a recursive-halving reduce-scatter + a recursive-doubling all-gather
    assert algs.model_time("allreduce", "rabenseifner", n, p) == \
        pytest.approx(2 * L8 * A + 2 * n * frac * B + n * frac * G)
    assert algs.model_time("reduce_scatter", "recursive_halving", n, p) == \
        pytest.approx(L8 * A + n * frac * (B + G))
    # reduce: the halving, then a binomial gather of the reduced chunks to the root
    assert algs.model_time("reduce", "rabenseifner", n, p) == \
        pytest.approx(2 * L8 * A + n * frac * (2 * B + G))


def test_the_fold_adds_its_textbook_steps(textbook_constants):
    # p = 6 folds to q = 4: two more steps, α + nβ + nγ in and α + nβ out
    n, q = 1 << 16, 4
    fold = 2 * A + 2 * n * B + n * G
    assert algs.model_time("allreduce", "recursive_doubling", n, 6) == \
        pytest.approx(fold + Q6 * (A + n * B + n * G))
    assert algs.model_time("allreduce", "rabenseifner", n, 6) == \
        pytest.approx(fold + 2 * Q6 * A + 2 * n * (q - 1) / q * B + n * (q - 1) / q * G)


def test_exchange_steps_and_rendezvous_pay_their_own_constants(tmp_path, monkeypatch):
    # an exchange step (every rank sends and receives) costs α_x; a message above the eager
    # limit costs α_rndv + b β_rndv
    ax, ar, br = 3e-5, 4e-5, 2e-10
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"shm": {"alpha": A, "beta": B, "gamma": G, "sigma": 0.0,
                                        "alpha_x": ax, "alpha_rndv": ar, "beta_rndv": br}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    monkeypatch.setenv("PYCOMM_EAGER_LIMIT", "65536")
    n, p = 1 << 12, 8
    assert algs.model_time("allgather", "ring", n, p) == \
        pytest.approx((p - 1) * ax + n * (p - 1) / p * B)
    assert algs.model_time("barrier", "dissemination", 0, p) == pytest.approx(L8 * ax)
    assert algs.model_time("bcast", "binomial", n, p) == pytest.approx(L8 * (A + n * B))
    n = 1 << 20
    assert algs.model_time("bcast", "binomial", n, p) == pytest.approx(L8 * (ar + n * br))


def test_lanes_interpolate_and_share_the_memory(tmp_path, monkeypatch):
    # lanes from the table: log-size interpolation, end values beyond the measured sizes
    lanes = ((1 << 20, 4.0), (1 << 22, 2.0))

    def streams(points, nbytes):
        return cost.read_curve(points, nbytes, float("inf"), log=True)
    assert streams((), 1 << 30) == float("inf")
    assert streams(lanes, 8) == 4.0 and streams(lanes, 1 << 30) == 2.0
    assert streams(lanes, 1 << 21) == pytest.approx(3.0)
    # a ring on 8 ranks with a core each: all 8 copy at once; through 2 lanes each copy
    # takes 4 times as long, so the large all-reduce costs more, a small one no more
    table = {"shm": {"alpha": 1e-5, "beta": 1e-10, "gamma": 1e-10, "sigma": 0.0}}
    plain, laned = tmp_path / "plain.json", tmp_path / "laned.json"
    plain.write_text(json.dumps(table))
    table["shm"]["lanes"] = {str(1 << 20): 8.0, str(1 << 24): 2.0}
    laned.write_text(json.dumps(table))
    t = {}
    for name, path in (("plain", plain), ("laned", laned)):
        monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
        t[name] = [algs.model_time("allreduce", "ring", n, 8) for n in (1 << 10, 1 << 26)]
        # the closed form of an algorithm without a step model shares the lanes too
        t[name].append(algs.model_time("allreduce", "double_binary_tree", 1 << 26, 8))
    assert t["laned"][0] == pytest.approx(t["plain"][0])
    assert t["laned"][1] > 2 * t["plain"][1] and t["laned"][2] > 2 * t["plain"][2]


def test_exchange_steps_pay_the_exchange_wake_when_oversubscribed(tmp_path, monkeypatch):
    # linear in ranks per core between the measured points, the end values beyond, the
    # one-way wake without any
    wake_x = ((2.0, 2e-5), (4.0, 4e-5))

    def exchange_wake(points, ranks_per_core):
        return cost.read_curve(points, ranks_per_core, 1e-5, log=False)
    assert exchange_wake((), 3.0) == 1e-5
    assert exchange_wake(wake_x, 1.5) == 2e-5 and exchange_wake(wake_x, 8.0) == 4e-5
    assert exchange_wake(wake_x, 3.0) == pytest.approx(3e-5)
    table = {"shm": {"alpha": 1e-5, "beta": 1e-10, "gamma": 1e-10, "sigma": 0.0,
                     "alpha_x": 1.5e-5, "wake": 1e-5}}
    plain, xw = tmp_path / "plain.json", tmp_path / "xw.json"
    plain.write_text(json.dumps(table))
    table["shm"]["wake_x"] = {"2": 1e-5, "4": 5e-5}
    xw.write_text(json.dumps(table))
    t = {}
    for name, path in (("plain", plain), ("xw", xw)):
        monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
        t[name] = {(alg, f): algs.model_time("allreduce", alg, 8, 8, oversubscription=f)
                   for alg in ("recursive_doubling", "binomial") for f in (1.0, 2.0, 4.0)}
    # 3 exchange steps of recursive doubling at 4 ranks per core: (5e-5 - 1e-5) * 4 each
    assert t["xw"][("recursive_doubling", 4.0)] == \
        pytest.approx(t["plain"][("recursive_doubling", 4.0)] + 3 * 4e-5 * 4)
    # the measured point at 2x equals the one-way wake: nothing changes there; nor with a
    # core per rank; one-way steps (binomial) never change
    for key in (("recursive_doubling", 2.0), ("recursive_doubling", 1.0),
                ("binomial", 1.0), ("binomial", 2.0), ("binomial", 4.0)):
        assert t["xw"][key] == pytest.approx(t["plain"][key])
    # every step of an oversubscribed call needs the turns of all its ranks (those waiting
    # in it yield and are scheduled too): a binomial broadcast's three rounds on 8 ranks
    # of 2 cores pay 4 wake-ups each, its first round (one sender) as much as its last
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(plain))
    tree = [algs.model_time("bcast", "binomial", 8, 8, oversubscription=f) for f in (1.0, 4.0)]
    assert tree[1] - tree[0] == pytest.approx(3 * 4 * 1e-5, rel=1e-3)
    # pairs without a step model pay it per exchange message as well
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(xw))
    dense = algs.model_time("allgatherv", "ring", 8, 8, oversubscription=4.0)
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(plain))
    assert dense > algs.model_time("allgatherv", "ring", 8, 8, oversubscription=4.0)


def test_exchange_steps_pay_alpha_x(tmp_path, monkeypatch):
    # a ring step (each rank sends and receives) costs alpha_x; a binomial tree's (one-way)
    # alpha: raising alpha_x by d adds d per exchange step and nothing to the trees
    base = {"alpha": 1e-5, "beta": 1e-10, "gamma": 1e-10, "sigma": 0.0}
    times = {}
    for ax in (1e-5, 4e-5):
        path = tmp_path / f"t{ax}.json"
        path.write_text(json.dumps({"shm": {**base, "alpha_x": ax}}))
        monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
        times[ax] = {(c, a, p): algs.model_time(c, a, 64, p)
                     for c, a in (("allgather", "ring"), ("allgather", "recursive_doubling"),
                                  ("bcast", "binomial"), ("barrier", "dissemination"),
                                  ("alltoallv", "pairwise"))
                     for p in (2, 4, 8)}
        # a pair without a step model, on oversubscribed cores: the wake-up raises α and
        # α_x alike, so the exchange still costs α_x - α more
        times[ax]["alltoallv over"] = algs.model_time("alltoallv", "pairwise", 64, 8,
                                                      oversubscription=2.0)
    d = 3e-5
    for p in (2, 4, 8):
        lg = p.bit_length() - 1
        assert times[4e-5][("allgather", "ring", p)] - times[1e-5][("allgather", "ring", p)] \
            == pytest.approx((p - 1) * d)
        for c, a in (("allgather", "recursive_doubling"), ("barrier", "dissemination")):
            assert times[4e-5][(c, a, p)] - times[1e-5][(c, a, p)] == pytest.approx(lg * d)
        assert times[4e-5][("bcast", "binomial", p)] == times[1e-5][("bcast", "binomial", p)]
        assert times[4e-5][("alltoallv", "pairwise", p)] - \
            times[1e-5][("alltoallv", "pairwise", p)] == pytest.approx((p - 1) * d)
    assert times[4e-5]["alltoallv over"] - times[1e-5]["alltoallv over"] == \
        pytest.approx(7 * d)
