"""The cost model: registry, selection rules, tables (shipped, PYCOMM_TUNE_FILE) and tune.

The model's prices against textbook times, exchange and rendezvous constants, lanes and
wake-ups: test_tune_model.py.
"""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pycomm.collectives as algs
import pycomm.tuning.cost as cost
from pycomm.tuning import tune
from pycomm.errors import ArgumentError


def test_fit_line_recovers_a_line():
    xs = [8, 64, 512, 4096]
    intercept, slope = tune.fit_line(xs, [2e-5 + 1e-10 * x for x in xs])
    assert intercept == pytest.approx(2e-5) and slope == pytest.approx(1e-10)
    with pytest.raises(ValueError):
        tune.fit_line([8, 8], [1.0, 2.0])


def test_shipped_table_is_valid_and_cites_its_run():
    with open(cost.SHIPPED_TABLE, encoding="utf-8") as fh:
        raw = json.load(fh)
    for transport in ("shm", "tcp"):
        c = raw[transport]
        assert 0 < c["alpha"] < 1e-2 and 0 < c["beta"] < 1e-8
        assert 0 < c["gamma"] < 1e-8
        assert 0 < c["alpha_rndv"] < 1e-2 and 0 < c["beta_rndv"] < 1e-8
    src = raw["source"]
    for key in ("date", "host", "cpu_count", "python", "numpy", "pycomm", "command",
                "loadavg", "eager_limit"):
        assert key in src, key
    assert src["command"].startswith("python -m pycomm.tuning.tune")
    assert not src["quick"]


def test_user_table_overrides_per_transport(tmp_path, monkeypatch):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"tcp": {"alpha": 1.0, "beta": 2e-9, "gamma": 1e-10,
                                        "sigma": 0}, "source": {"note": "test"}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    # a table without the rendezvous figures prices every message like an eager one
    # (and an exchange step like a one-way message)
    assert cost.constants("tcp") == cost.Constants(1.0, 2e-9, 1e-10, alpha_rndv=1.0,
                                                   beta_rndv=2e-9, alpha_x=1.0)
    assert cost.constants("shm") == cost.load_table(cost.SHIPPED_TABLE)["shm"]  # not in file
    monkeypatch.delenv("PYCOMM_TUNE_FILE")
    assert cost.constants("tcp").alpha != 1.0  # back to the shipped table
    assert cost.constants("unknown-transport") == cost.constants("shm")


@pytest.mark.parametrize("content,match", [
    ("not json", "cannot be read"),
    (json.dumps({"shm": {"alpha": 1}}), "needs numeric"),
    (json.dumps({"shm": {"alpha": -1, "beta": 0, "gamma": 0, "sigma": 0}}), "negative"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "alpha_rndv": -1}}), "negative"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "beta_rndv": "fast"}}), "non-numeric"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "lanes": {"1024": 0.5}}}), "lanes"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "alpha_x": -1}}), "negative"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "lanes": {"big": 2}}}), "lanes"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "lanes": [1, 2]}}), "lanes"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "wake_x": {"1": 1e-5}}}), "wake_x"),
    (json.dumps({"shm": {"alpha": 1, "beta": 0, "gamma": 0, "sigma": 0,
                         "wake_x": {"2": -1}}}), "wake_x"),
])
def test_bad_user_tables_raise(tmp_path, monkeypatch, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    with pytest.raises(ArgumentError, match=match):
        algs.model_time("allreduce", "ring", 1024, 4)
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ArgumentError, match="missing.json"):
        algs.choose("allreduce", 1024, 4)


def test_fit_line_relative_weights_small_sizes():
    # a curve bending upwards at large sizes: the absolute fit's intercept follows the
    # large points, the relative one stays near the small sizes' time
    xs = [1 << 17, 1 << 19, 1 << 21, 1 << 23]
    ys = [3e-5 + 1e-10 * x + (4e-4 if x == xs[-1] else 0.0) for x in xs]
    absolute, _ = tune.fit_line(xs, ys)
    relative, _ = tune.fit_line(xs, ys, relative=True)
    assert abs(relative - 3e-5) < abs(absolute - 3e-5)
    exact = [2e-5 + 1e-10 * x for x in xs]
    assert tune.fit_line(xs, exact, relative=True) == pytest.approx((2e-5, 1e-10))


def test_messages_past_the_eager_limit_pay_the_rendezvous_constants(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"shm": {"alpha": 1e-5, "beta": 1e-10, "gamma": 1e-10,
                                        "sigma": 0, "alpha_rndv": 1e-3,
                                        "beta_rndv": 1e-10}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    monkeypatch.setenv("PYCOMM_EAGER_LIMIT", "65536")
    p, rounds = 8, 3          # binomial broadcast: 3 rounds of one whole-vector message

    def jump(n):
        return (algs.model_time("bcast", "binomial", n + 1, p)
                - algs.model_time("bcast", "binomial", n, p))

    assert jump(65536) == pytest.approx(rounds * (1e-3 - 1e-5), rel=1e-3)
    assert jump(4096) == pytest.approx(rounds * 1e-10, rel=1e-3)     # both eager
    monkeypatch.setenv("PYCOMM_EAGER_LIMIT", "4096")                  # the switch moves
    assert jump(4096) == pytest.approx(rounds * (1e-3 - 1e-5), rel=1e-3)
    # one rendezvous exchange of the whole vector against two of half of it: at 2 ranks
    # recursive doubling wins where ring and Rabenseifner pay the handshake twice
    monkeypatch.setenv("PYCOMM_EAGER_LIMIT", "65536")
    doubling = algs.model_time("allreduce", "recursive_doubling", 1 << 18, 2)
    for other in ("ring", "rabenseifner"):
        assert algs.model_time("allreduce", other, 1 << 18, 2) > doubling + 0.9e-3
    # the double binary tree's segments (PYCOMM_SEGMENT_BYTES) go by their own protocol
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "65536")
    eager_segments = algs.model_time("allreduce", "double_binary_tree", 1 << 20, 4)
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "131072")
    assert algs.model_time("allreduce", "double_binary_tree", 1 << 20, 4) > eager_segments


def test_measure_gamma_quick():
    gammas = tune.measure_gamma(quick=True)
    assert set(gammas) == {"float32", "float64"}
    assert all(0 <= g < 1e-7 for g in gammas.values())


def test_tune_end_to_end_quick(tmp_path):
    """Two real ranks over shm; --out merges with a table already there."""
    out = tmp_path / "t.json"
    out.write_text(json.dumps({"tcp": {"alpha": 1, "beta": 1, "gamma": 1, "sigma": 1},
                               "source": {"date": "earlier"}}))
    assert tune.main(["-n", "2", "--transport", "shm", "--quick", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["tcp"]["alpha"] == 1  # kept
    assert table["source"]["kept_from"] == {"transports": ["tcp"], "date": "earlier"}
    shm = table["shm"]
    assert 0 < shm["alpha"] < 0.05 and 0 < shm["beta"] < 1e-6
    assert 0 < shm["alpha_rndv"] < 0.05 and 0 < shm["beta_rndv"] < 1e-6
    assert shm["alpha"] <= shm["alpha_x"] < 0.05
    src = table["source"]
    assert src["eager_limit"] == 65536
    assert set(map(int, src["points"]["shm"])) >= {8, 4096, 65536, 1 << 17, 8 << 20}
    assert src["ranks"] == 2 and src["quick"] and src["cpu_count"] == os.cpu_count()
    assert "--quick" in src["command"] and set(src["points"]) == {"shm"}
    assert shm["lanes"] and all(v >= 1 for v in shm["lanes"].values())
    assert cost.load_table(str(out))["shm"].lanes[0][0] == 256 << 10
    assert list(shm["wake_x"]) == ["2"] and shm["wake_x"]["2"] >= 0    # quick: 2x only
    assert cost.load_table(str(out))["shm"].wake_x[0][0] == 2.0
    assert np.isfinite(list(src["points"]["shm"].values())).all()


def test_tune_end_to_end_quick_rdma(tmp_path):
    """The CLI over the RDMA emulation writes a row the cost model loads: the NIC-thread
    latencies, both wake-ups, and the same CPU constants as every transport."""
    out = tmp_path / "t.json"
    assert tune.main(["-n", "2", "--transport", "rdma", "--quick", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    rdma = table["rdma"]
    assert set(table) == {"rdma", "source"} and set(table["source"]["points"]) == {"rdma"}
    assert 0 < rdma["alpha"] < 0.05 and 0 < rdma["beta"] < 1e-6
    assert 0 < rdma["alpha_rndv"] < 0.05 and 0 < rdma["beta_rndv"] < 1e-6
    assert rdma["alpha"] <= rdma["alpha_x"] < 0.05
    assert rdma["wake"] >= 0 and list(rdma["wake_x"]) == ["2"] and rdma["wake_x"]["2"] >= 0
    loaded = cost.load_table(str(out))["rdma"]
    assert loaded.alpha == rdma["alpha"] and loaded.wake_x[0][0] == 2.0
    assert cost.model_transport("shm+rdma") == "rdma"


def test_tune_rejects_one_rank():
    with pytest.raises(SystemExit):
        tune.main(["-n", "1"])


# -- registry and selection ------------------------------------------------------------------
def test_registry_names_match_functions():
    for coll, table in algs.REGISTRY.items():
        assert table, coll
        for name, info in table.items():
            assert info.fn.__name__ == f"{coll}_{name}"
            assert info.doc
            assert algs.model_time(coll, name, 1024, 4) > 0


@pytest.fixture
def brief_constants(tmp_path, monkeypatch):
    """A fixed table (the model's first estimates), so crossovers do not follow tune runs."""
    table = {"shm": {"alpha": 8e-6, "beta": 1 / 6e9, "gamma": 1 / 4e9, "sigma": 1 / 5e9},
             "tcp": {"alpha": 4e-5, "beta": 1 / 1e9, "gamma": 1 / 4e9, "sigma": 1 / 5e9}}
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "65536")
    for coll in algs.REGISTRY:
        monkeypatch.delenv(f"PYCOMM_ALGORITHM_{coll.upper()}", raising=False)
    return table


@pytest.mark.parametrize("size", [2, 3, 4, 6, 8])
def test_choose_allreduce_crossovers(size, brief_constants):
    assert algs.choose("allreduce", 8, size)[0] == "recursive_doubling"
    pof2 = size & (size - 1) == 0
    if size > 2 and pof2:
        assert algs.choose("allreduce", 1 << 17, size)[0] == "rabenseifner"
    # Large vectors go to a bandwidth-optimal schedule: Rabenseifner where it needs no fold
    # (the same bytes as the ring in fewer messages, the same two segments of scratch),
    # the ring where Rabenseifner would fold (2n more bytes through one pair of ranks)
    assert algs.choose("allreduce", 1 << 24, size)[0] == ("rabenseifner" if pof2 else "ring")
    # ring is never chosen for a non-commutative op
    assert algs.choose("allreduce", 1 << 24, size, commutative=False)[0] != "ring"


def test_choose_uses_the_transport_table(brief_constants):
    # tcp's larger alpha moves the bcast crossover to larger messages
    shm = [algs.choose("bcast", 1 << k, 8)[0] for k in range(4, 26)]
    tcp = [algs.choose("bcast", 1 << k, 8, transport="tcp")[0] for k in range(4, 26)]
    assert shm != tcp and shm[0] == tcp[0] == "binomial"
    assert algs.choose("bcast", 1 << 10, 8, transport="rdma") == algs.choose("bcast", 1 << 10, 8)
    assert algs.model_time("bcast", "binomial", 1 << 10, 8, transport="tcp") > \
        algs.model_time("bcast", "binomial", 1 << 10, 8)
    assert algs.choose("allgather", 8, 6)[0] == "bruck"          # log p steps, any p
    assert algs.choose("allgather", 8, 8)[0] == "recursive_doubling"
    assert algs.choose("allgather", 1 << 24, 6)[0] == "ring"     # no scratch
    assert algs.choose("alltoall", 64, 8)[0] == "bruck"
    assert algs.choose("alltoall", 1 << 24, 8)[0] == "pairwise"
    with pytest.raises(ArgumentError, match="unknown allreduce algorithm"):
        algs.model_time("allreduce", "bogus", 8, 4)


def test_tune_file_errors_name_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"shm": {"alpha": "x"}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(bad))
    with pytest.raises(ArgumentError, match="bad.json"):
        algs.choose("allreduce", 8, 4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collective=st.sampled_from(sorted(algs.REGISTRY)), size=st.integers(1, 64),
       nbytes=st.integers(0, 1 << 28), commutative=st.booleans(),
       transport=st.sampled_from(["shm", "tcp", "rdma"]))
def test_choose_never_picks_an_unfit_algorithm(collective, size, nbytes, commutative,
                                               transport):
    name, fn = algs.choose(collective, nbytes, size, requested="auto",
                           commutative=commutative, transport=transport)
    info = algs.REGISTRY[collective][name]
    assert getattr(fn, "func", fn) is info.fn and info.unfit_reason(size, commutative) is None
    # hierarchical algorithms and the 2-D all-reduce compete only on communicators
    # spanning hosts (choose's hosts=; tests/test_cluster.py, tests/test_twod.py), never
    # on this single-host call
    fit = [n for n, i in algs.REGISTRY[collective].items()
           if i.unfit_reason(size, commutative) is None and n not in ("hierarchical", "2d")]
    best = min(algs.model_time(collective, n, nbytes, size, transport=transport) for n in fit)
    assert algs.model_time(collective, name, nbytes, size, transport=transport) == best
    for other, i in algs.REGISTRY[collective].items():
        if i.unfit_reason(size, commutative) is not None:
            with pytest.raises(ArgumentError, match="cannot serve"):
                algs.choose(collective, nbytes, size, requested=other,
                            commutative=commutative)


def test_choose_requested_and_environment(monkeypatch, brief_constants):
    monkeypatch.setenv("PYCOMM_ALGORITHM_ALLREDUCE", "ring")
    assert algs.choose("allreduce", 8, 4) == ("ring", algs.REGISTRY["allreduce"]["ring"].fn)
    assert algs.choose("allreduce", 8, 4, requested="auto")[0] == "recursive_doubling"
    assert algs.choose("allreduce", 8, 4, requested="rabenseifner")[0] == "rabenseifner"
    with pytest.raises(ArgumentError, match="PYCOMM_ALGORITHM_ALLREDUCE.*commutative"):
        algs.choose("allreduce", 8, 4, commutative=False)
    monkeypatch.setenv("PYCOMM_ALGORITHM_ALLREDUCE", "bogus")
    with pytest.raises(ArgumentError, match="valid: auto, recursive_doubling, rabenseifner, "
                                            "ring, binomial, double_binary_tree"):
        algs.choose("allreduce", 8, 4)
    with pytest.raises(ArgumentError, match="power-of-two"):
        algs.choose("allgather", 8, 6, requested="recursive_doubling")
    with pytest.raises(ArgumentError, match="unknown collective"):
        algs.choose("allreduc", 8, 4)
    assert algs.choose("reduce_scatter_block", 64, 4, commutative=False)[0] != "ring"
    assert algs.choose("reduce_scatter", 64, 4, commutative=False)[0] != "ring"
    with pytest.raises(ArgumentError, match="commutative"):
        algs.choose("reduce_scatter", 64, 4, requested="ring", commutative=False)
    for coll in ("gatherv", "scatterv", "allgatherv", "alltoallv", "scan", "exscan"):
        assert algs.choose(coll, 0, 5)[0] in algs.algorithms(coll)


def test_oversubscribed_model_prefers_trees_that_leave_cores_free(brief_constants):
    # measured on 2 cores (benchmarks/README.md, algorithm sweep): with 4 or 8 ranks a
    # binomial broadcast beats van de Geijn's scatter + all-gather at every size, because its
    # early rounds use fewer ranks than cores while the ring step of the all-gather needs
    # every rank to be scheduled; the closed forms alone predict the opposite
    for p in (4, 8):
        f = p / 2
        for n in (8, 1 << 16, 1 << 21, 1 << 24, 1 << 26):
            assert algs.choose("bcast", n, p, oversubscription=f)[0] == "binomial"
        assert algs.choose("bcast", 1 << 24, p)[0] != "binomial"   # a core per rank
        a = algs.model_time("allreduce", "ring", 1 << 20, p, oversubscription=f)
        assert a > algs.model_time("allreduce", "ring", 1 << 20, p)


def test_pipeline_segment_is_the_models_best(monkeypatch, brief_constants):
    # PYCOMM_SEGMENT_BYTES=0 (the default): the chain broadcast's segment is the candidate
    # its model prices lowest, and the modelled time is the time at that segment
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "0")
    for p, f in ((3, 1.0), (4, 1.0), (8, 1.0), (4, 2.0), (8, 4.0)):
        last = 0
        for n in (0, 8, 1 << 12, 1 << 18, 1 << 22, 1 << 26):
            cands = cost.pipeline_candidates(float(n))
            seg = cost.segment_bytes("bcast", "pipeline", n, p, oversubscription=f)
            auto = algs.model_time("bcast", "pipeline", n, p, oversubscription=f)
            priced = {}
            for s in cands:
                monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", str(s))
                priced[s] = algs.model_time("bcast", "pipeline", n, p, oversubscription=f)
                assert cost.segment_bytes("bcast", "pipeline", n, p, oversubscription=f) == s
            monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "0")
            assert seg in cands and auto == pytest.approx(min(priced.values()))
            assert priced[seg] == pytest.approx(auto)
            assert seg >= last     # larger vectors never take smaller segments
            last = seg
        # a 64 MiB chain on a core per rank is cut: neither 4 KiB pieces nor one piece
        if f == 1.0:
            assert 4096 < cost.segment_bytes("bcast", "pipeline", 1 << 26, p) < 1 << 26
    assert cost.segment_bytes("bcast", "binomial", 1 << 20, 4) is None
    assert cost.segment_bytes("allreduce", "ring", 1 << 20, 4) is None


def test_choose_binds_the_pipeline_segment(monkeypatch, brief_constants):
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "0")
    for n, p, f in ((1 << 26, 4, 1.0), (1 << 20, 8, 4.0), (100, 3, 1.0)):
        name, fn = algs.choose("bcast", n, p, requested="pipeline", oversubscription=f)
        assert name == "pipeline" and fn.func is algs.REGISTRY["bcast"]["pipeline"].fn
        assert fn.keywords == {"segment_bytes": cost.segment_bytes(
            "bcast", "pipeline", n, p, oversubscription=f)}
    monkeypatch.setenv("PYCOMM_SEGMENT_BYTES", "12345")    # forced: every size
    assert algs.choose("bcast", 1 << 26, 4, requested="pipeline")[1].keywords == \
        {"segment_bytes": 12345}
    # algorithms without a segment of the model's come back unwrapped
    assert algs.choose("bcast", 8, 4, requested="binomial")[1] is \
        algs.REGISTRY["bcast"]["binomial"].fn


def test_measure_exchange_wake_points_and_formula(monkeypatch):
    # per turn = (median step of three worlds - alpha_x) / ranks per core; 4x only while
    # it stays within 64 ranks
    spawn_module = importlib.import_module("pycomm.launch.spawning")
    worlds = []

    def fake_spawn(fn, nprocs, args, transport):
        worlds.append(nprocs)
        return [{4: 50e-6, 8: 150e-6, 40: 70e-6}[nprocs] + 1e-6 * (len(worlds) % 3)]
    monkeypatch.setattr(spawn_module, "spawn", fake_spawn)
    monkeypatch.setattr(tune, "available_cores", lambda: 2)
    out = tune.measure_exchange_wake("shm", 10e-6)
    assert worlds == [4, 4, 4, 8, 8, 8]
    assert out == {2.0: pytest.approx((51e-6 - 10e-6) / 2),
                   4.0: pytest.approx((151e-6 - 10e-6) / 4)}
    worlds.clear()
    monkeypatch.setattr(tune, "available_cores", lambda: 20)
    assert list(tune.measure_exchange_wake("shm", 10e-6)) == [2.0] and worlds == [40] * 3


def test_measure_exchange_wake_quick():
    wake_x = tune.measure_exchange_wake("shm", 1e-5, quick=True)
    assert list(wake_x) == [2.0] and 0.0 <= wake_x[2.0] < 0.05


def test_measure_lanes_quick():
    lanes = tune.measure_lanes(quick=True)
    assert set(lanes) == set(tune.COMPUTE[::2])
    cores = len(os.sched_getaffinity(0))
    assert all(1.0 <= v <= max(1, min(cores, 16)) for v in lanes.values())
