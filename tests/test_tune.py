"""pycomm.tune and the cost-model tables: fitting, the shipped table, PYCOMM_TUNE_FILE."""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest

from pycomm import tune
from pycomm.errors import ArgumentError

# ``pycomm.algorithms.cost`` the attribute is the re-exported function; take the modules.
cost = importlib.import_module("pycomm.algorithms.cost")
algs = importlib.import_module("pycomm.algorithms")


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
        assert 0 < c["gamma"] < 1e-8 and 0 <= c["sigma"] < 1e-8
    src = raw["source"]
    for key in ("date", "host", "cpu_count", "python", "numpy", "pycomm", "command",
                "loadavg"):
        assert key in src, key
    assert src["command"].startswith("python -m pycomm.tune")
    assert not src["quick"]


def test_user_table_overrides_per_transport(tmp_path, monkeypatch):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"tcp": {"alpha": 1.0, "beta": 2e-9, "gamma": 1e-10,
                                        "sigma": 0}, "source": {"note": "test"}}))
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(path))
    assert cost.constants("tcp") == cost.Constants(1.0, 2e-9, 1e-10, 0.0)
    assert cost.constants("shm") == cost.load_table(cost.SHIPPED_TABLE)["shm"]  # not in file
    monkeypatch.delenv("PYCOMM_TUNE_FILE")
    assert cost.constants("tcp").alpha != 1.0  # back to the shipped table
    assert cost.constants("unknown-transport") == cost.constants("shm")


@pytest.mark.parametrize("content,match", [
    ("not json", "cannot be read"),
    (json.dumps({"shm": {"alpha": 1}}), "needs numeric"),
    (json.dumps({"shm": {"alpha": -1, "beta": 0, "gamma": 0, "sigma": 0}}), "negative"),
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


def test_measure_gamma_and_sigma_quick():
    gammas = tune.measure_gamma(quick=True)
    assert set(gammas) == {"float32", "float64"}
    assert all(0 <= g < 1e-7 for g in gammas.values())
    assert 0 <= tune.measure_sigma(quick=True) < 1e-7


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
    src = table["source"]
    assert src["ranks"] == 2 and src["quick"] and src["cpu_count"] == os.cpu_count()
    assert "--quick" in src["command"] and set(src["points"]) == {"shm"}
    assert np.isfinite(list(src["points"]["shm"].values())).all()


def test_tune_rejects_one_rank():
    with pytest.raises(SystemExit):
        tune.main(["-n", "1"])
